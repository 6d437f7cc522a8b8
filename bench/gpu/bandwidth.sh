#!/usr/bin/env bash
# memory-bandwidth and host-bandwidth on the GPU machine, side by side with a PyTorch reference
# measured the same way (bench/gpu/torch_bandwidth.py: dst.copy_(src) on the device, pinned
# host-to-device and device-to-host copies of the same sizes, CUDA events, medians), twice in
# alternation; the ratios against the targets (memory >= 95% of PyTorch's copy, host link >= 95%
# of PyTorch's pinned copies both ways; the check's own copy kernel is printed against PyTorch's copy
# too, for information); a sweep of the copy kernel's blocks per multiprocessor;
# the concurrent host-link figures; rdma-ports on the machine's own ports; injected faults.
# Usage (repository root, release binary carried): BIN=.carry/gpusanity OUT=/tmp/bw bash bench/gpu/bandwidth.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-bandwidth}
MEM_BYTES=${MEM_BYTES:-4294967296}
HOST_BYTES=${HOST_BYTES:-268435456}
export MEM_BYTES HOST_BYTES
mkdir -p "$OUT"
. "$HERE/env.sh"
nvidia-smi -L
nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -12
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
to() { # file, then the command: its output goes to the file (so `wall` still prints here)
  local f=$1; shift
  "$@" > "$f" 2>&1
}
SIZES=(--check-param "memory-bandwidth.size=$MEM_BYTES" --check-param "host-bandwidth.size=$HOST_BYTES")

summary() { # report.json
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("status:", r["status"], "|", r["summary"])
keys = ["gbps", "gbps_best", "driver_gbps", "kernel_gbps", "kernel_gbps_best", "h2d_gbps", "d2h_gbps", "h2d_concurrent_gbps", "d2h_concurrent_gbps", "wrong_words", "ports", "ports_down"]
for c in r["checks"]:
    for k in c["ranks"]:
        m, n = k["metrics"], k.get("notes", {})
        fig = " ".join("%s=%.5g" % (x, m[x]) for x in keys if x in m)
        why = n.get("not_applicable") or n.get("compared_with") or n.get("span") or ""
        print("  %-18s %-14s %6.2f s  r%d %s | %s" % (c["name"], c["status"], c["duration_s"], k["rank"], fig, why))
        if "error" in k and k["error"]:
            print("    error:", k["error"][:300])
for f in r["findings"]:
    print("  finding:", f["severity"], f["code"], "node", f.get("node_rank"), "rank", f.get("rank"), "|", f["message"][:200])
PY
}

ratios() { # report.json, torch json
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
t = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])["gpus"]
checks = {c["name"]: c for c in r["checks"]}
def fig(name, rank, key):
    for k in checks.get(name, {}).get("ranks", []):
        if k["rank"] == rank:
            return k["metrics"].get(key)
for g in t:
    i = g["index"]
    rows = [("memory d2d (r+w)", fig("memory-bandwidth", i, "gbps"), g["d2d_gbps"]),
            ("memory kernel (r+w)", fig("memory-bandwidth", i, "kernel_gbps"), g["d2d_gbps"]),
            ("host H2D pinned", fig("host-bandwidth", i, "h2d_gbps"), g["h2d_gbps"]),
            ("host D2H pinned", fig("host-bandwidth", i, "d2h_gbps"), g["d2h_gbps"])]
    for what, ours, ref in rows:
        if ours is None:
            print("  gpu %d %-18s gpusanity: none | torch %.1f GB/s" % (i, what, ref)); continue
        ratio = ours / ref
        print("  gpu %d %-18s gpusanity %8.1f GB/s | torch %8.1f GB/s | ratio %.3f %s" % (i, what, ours, ref, ratio, "(information)" if "kernel" in what else "ok (>= 0.95)" if ratio >= 0.95 else "BELOW TARGET 0.95"))
PY
}

for round in 1 2; do
  echo "== round $round: gpusanity memory-bandwidth,host-bandwidth (every local GPU), then PyTorch"
  wall "gpusanity-$round" to "$OUT/r$round.txt" "$BIN" check --micro-benchmarks memory-bandwidth,host-bandwidth \
    "${SIZES[@]}" --report-dir "$OUT/r$round"
  summary "$OUT/r$round/report.json"
  wall "torch-$round" to "$OUT/t$round.json" python3 "$HERE/torch_bandwidth.py"
  cat "$OUT/t$round.json"
  ratios "$OUT/r$round/report.json" "$OUT/t$round.json"
done

echo "== the copy kernel's grid: blocks per multiprocessor (GPU 0 alone)"
for b in 1 2 4 8; do
  CUDA_VISIBLE_DEVICES=0 "$BIN" check --micro-benchmarks memory-bandwidth "${SIZES[@]}" \
    --check-param "memory-bandwidth.blocks-per-sm=$b" --report-dir "$OUT/b$b" > "$OUT/b$b.txt" 2>&1
  echo "blocks-per-sm=$b: $(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); k=r["checks"][0]["ranks"][0]; print(r["status"], "kernel %.1f GB/s (best %.1f), driver %.1f" % (k["metrics"].get("kernel_gbps", 0), k["metrics"].get("kernel_gbps_best", 0), k["metrics"].get("driver_gbps", 0)), k.get("error") or "")' "$OUT/b$b/report.json")"
done

echo "== rdma-ports on this machine's own ports (not_applicable without any)"
wall rdma to "$OUT/rdma.txt" "$BIN" check --micro-benchmarks rdma-ports --report-dir "$OUT/rdma"
summary "$OUT/rdma/report.json"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); [print("  ports:", k["notes"]["ports"][:600]) for c in r["checks"] for k in c["ranks"] if "ports" in k.get("notes", {})]' "$OUT/rdma/report.json"

echo "== injected faults on GPU 0 (each must fail and name rank 0)"
for fault in memory-bandwidth-wrong memory-bandwidth-slow host-bandwidth-slow; do
  wall "$fault" to "$OUT/$fault.txt" "$BIN" check --micro-benchmarks memory-bandwidth,host-bandwidth "${SIZES[@]}" \
    --test-faults --sanity-check-envs "GPUSANITY_FAULT=$fault@0" --report-dir "$OUT/$fault"
  summary "$OUT/$fault/report.json" | grep -E "^status|finding"
done
echo "== a size that does not fit the GPU is refused up front (exit 2)"
"$BIN" check --micro-benchmarks memory-bandwidth --check-param memory-bandwidth.size=214748364800 --report-dir "$OUT/fit"; echo "exit $?"
echo "== processes left:"; pgrep -fa "gpusanity (check|worker)" || echo none
