#!/usr/bin/env bash
# GPU run of the micro-benchmark suite on an NVIDIA machine with PyTorch's pip packages (the
# 2-GPU H200 test machine): the CUDA backend's GPU unit tests, a native CUDA C++ empty-kernel
# loop (built here with nvcc) for the kernel-launch comparison, the whole suite of eight checks
# with wall times, PyTorch references for all-gather and all-to-all, two launchers on loopback
# (cross-node probes and rails through NCCL) and injected faults.
# Usage (binaries built on any x86-64 Linux machine):
#   BIN=path/gpusanity TESTS=path/executor-unit-tests [CUDA_TESTS=path/gpusanity-cuda-unit-tests] \
#     OUT=/tmp/out bash bench/gpu/micro.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-target/release/gpusanity}
TESTS=${TESTS:-}
OUT=${OUT:-/tmp/gpusanity-micro}
mkdir -p "$OUT"
. "$HERE/env.sh"
to() { # file, then the command: its output goes to the file (so `wall` still prints here)
  local f=$1; shift
  "$@" > "$f" 2>&1
}
nvidia-smi -L
NGPU=$(nvidia-smi -L | grep -c '^GPU')
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
SUITE=gemm,kernel-launch,all-reduce,all-to-all,all-gather,multi-all-reduce,network-connectivity,matmul-all-reduce-overlap

native() {
  if [ -x "$OUT/empty_kernel" ]; then "$OUT/empty_kernel" 10000 0; "$OUT/empty_kernel" 10000 1; fi
}
echo "== native CUDA C++ empty-kernel loop"
NVCC=$(command -v nvcc || ls "$NV"/cu13/bin/nvcc "$NV"/cuda_nvcc/bin/nvcc 2>/dev/null | head -1)
[ -z "$NVCC" ] && NVCC=$(find / -name nvcc -type f 2>/dev/null | head -1)
echo "nvcc: ${NVCC:-none}"
if [ -n "$NVCC" ]; then
  timeout 60 "$NVCC" -O2 -o "$OUT/empty_kernel" "$HERE/empty_kernel.cu" 2>&1 | tail -5
fi
native

echo "== the micro suite (8 checks) on $NGPU GPU(s), twice (the first run warms the driver's caches)"
for i in 1 2; do
  wall "suite-$i" to "$OUT/suite$i.txt" timeout -k 5 60 "$BIN" check --micro-benchmarks "$SUITE" --report-dir "$OUT/suite$i"
done
cat "$OUT/suite2.txt"
for i in 1 2; do
python3 - "$OUT/suite$i/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("run", sys.argv[1], r["status"], r["summary"])
for c in r["checks"]:
    print("%-26s %-15s %.2f s" % (c["name"], c["status"], c["duration_s"]))
    for k in c["ranks"]:
        m = k["metrics"]
        if c["name"] in ("all-gather", "all-to-all", "all-reduce"):
            big = [p for p in k["sweep"] if p["bytes"] >= (1 << 30) - 4096]
            small = [p for p in k["sweep"] if p["bytes"] <= (1 << 20) and p["bytes"] >= (1 << 20) - 4096]
            for p in small + big:
                print("  rank %d: %d B %.1f us busbw %.1f GB/s wrong %d" % (k["rank"], p["bytes"], p["time_us"], p["busbw_gbps"], p["wrong"]))
        else:
            keys = {"gemm": ["tflops"], "kernel-launch": ["launch_us", "round_trip_us", "round_trip_best_us"],
                    "multi-all-reduce": [x for x in m if x.startswith("busbw_gbps")],
                    "matmul-all-reduce-overlap": ["gemm_ms_alone", "allreduce_ms_alone", "gemm_ms_overlapped",
                                                  "allreduce_ms_overlapped", "overlapped_step_ms", "overlap_efficiency",
                                                  "gemm_slowdown", "allreduce_slowdown"],
                    "network-connectivity": ["front_probes", "back_probes", "ib_ports", "ib_ports_not_active"]}.get(c["name"], [])
            print("  rank %d: %s %s" % (k["rank"], " ".join("%s=%.3f" % (x, m[x]) for x in keys if x in m), k.get("error", "")))
        for n in ("groups", "ib_ports_not_active", "not_applicable"):
            if n in k.get("notes", {}) and k["rank"] == 0:
                print("  note %s: %s" % (n, k["notes"][n]))
        d = k.get("detail") or {}
        if k["rank"] == 0 and d.get("kind") == "multi_all_reduce":
            print("  groups: %s" % "; ".join("%s%d %s %.2f GB/s" % (g["group"]["kind"], g["group"]["index"], g["ranks"], g["busbw_gbps"]) for g in d["groups"]))
        if d.get("ib_ports_not_active"):
            print("  rank %d ib ports not active: %s" % (k["rank"], "; ".join(d["ib_ports_not_active"])))
PY
done
echo "== native again, after the suite"
native

if [ -n "$TESTS" ]; then
  echo "== GPU unit tests of the CUDA backend"
  wall unit-tests to "$OUT/unit.txt" timeout -k 5 75 "$TESTS" --ignored --test-threads=1 --nocapture cuda
  grep -E "^(test |rank|device|gemm|all-reduce|kernel|probe)|test result|panicked|silent|GiB|concurrent|at once|timeout" "$OUT/unit.txt" | head -60
fi
if [ -n "${CUDA_TESTS:-}" ]; then
  echo "== GPU unit tests of the shared CUDA device (gpusanity-cuda)"
  wall cuda-unit-tests to "$OUT/cuda-unit.txt" timeout -k 5 60 "$CUDA_TESTS" --ignored --test-threads=1 --nocapture
  grep -E "^(test |device)|test result|panicked" "$OUT/cuda-unit.txt"
fi

echo "== PyTorch references in the same run"
timeout -k 5 60 python3 "$HERE/torch_collectives.py" "$NGPU" 2>&1 | grep -v Warning

if [ "$NGPU" -ge 2 ]; then
  two() { # name, extra args: two launchers on loopback, one GPU each
    local name=$1 port=$2; shift 2
    CUDA_VISIBLE_DEVICES=1 timeout -k 5 40 "$BIN" check --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$port" "$@" --report-dir "$OUT/$name-1" > "$OUT/$name-1.txt" 2>&1 &
    local n1=$!
    CUDA_VISIBLE_DEVICES=0 wall "$name" to "$OUT/$name-0.txt" timeout -k 5 40 "$BIN" check --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" "$@" --report-dir "$OUT/$name-0"
    wait $n1; echo "node 1 exit $?"
    cat "$OUT/$name-0.txt"
  }
  echo "== two launchers on loopback, one GPU each: cross-node probes, rails and all-to-all through NCCL"
  two two-nodes 29711 --micro-benchmarks network-connectivity,multi-all-reduce,all-to-all
  python3 -c "import json,sys; r=json.load(open(sys.argv[1])); [print(*(' '.join(row) for g in ('front_end', 'back_end') for row in (k.get('detail') or {}).get(g) or []), sep='\n') for c in r['checks'] for k in c['ranks'] if c['name']=='network-connectivity' and k['rank']==0]" "$OUT/two-nodes-0/report.json"
  echo "== fault: rank 1's back end silent, probe timeout 2 s (the NCCL probe times out, its communicator is aborted)"
  two backend-down 29712 --micro-benchmarks network-connectivity --check-param network-connectivity.timeout-ms=2000 --test-faults --sanity-check-envs GPUSANITY_FAULT=net-backend-down@1
fi
echo "== fault: a wrong all-gather element on rank 1, a wrong all-to-all element on rank 0"
wall all-gather-wrong to "$OUT/f1.txt" timeout -k 5 30 "$BIN" check --micro-benchmarks all-gather --check-param all-gather.max-bytes=16777216 --test-faults --sanity-check-envs "GPUSANITY_FAULT=all-gather-wrong@1" --report-dir "$OUT/f1"
grep -h "WRONG\|verdict" "$OUT/f1.txt"
wall all-to-all-wrong to "$OUT/f2.txt" timeout -k 5 30 "$BIN" check --micro-benchmarks all-to-all --check-param all-to-all.max-bytes=16777216 --test-faults --sanity-check-envs "GPUSANITY_FAULT=all-to-all-wrong@0" --report-dir "$OUT/f2"
grep -h "WRONG\|verdict" "$OUT/f2.txt"
echo "== processes left:"; pgrep -fa "gpusanity (check|worker)" || echo none
tar -C "$OUT" -czf "$OUT/reports.tgz" $(cd "$OUT" && ls -d */ 2>/dev/null)
