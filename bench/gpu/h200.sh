#!/usr/bin/env bash
# GPU run of gpusanity on an NVIDIA machine with PyTorch's pip packages (the H200 test machines).
# Usage (from the repository root, with a release binary built on any x86-64 Linux machine):
#   BIN=.carry/gpusanity OUT=/tmp/gpu-out bash bench/gpu/h200.sh
# Prints wall times, the check summaries, a PyTorch baseline measured in the same run, and the
# outcome of injected faults. Reports land under $OUT.
set -u
BIN=${BIN:-target/release/gpusanity}
OUT=${OUT:-/tmp/gpusanity-gpu}
mkdir -p "$OUT"
# The machine's environment (CUDA libraries, NCCL_NVLS_ENABLE=0) and `wall`.
. "$(dirname "$0")/env.sh"
nvidia-smi -L
NGPU=$(nvidia-smi -L | grep -c '^GPU')
date -u +"date: %Y-%m-%dT%H:%M:%SZ"

echo "== default check (gemm + all-reduce) on $NGPU GPU(s), twice (the first run warms the driver cache)"
wall default-1 "$BIN" check --report-dir "$OUT/default1" > "$OUT/default1.txt" 2>&1
wall default-2 "$BIN" check --report-dir "$OUT/default" > "$OUT/default.txt" 2>&1
wall default-3 "$BIN" check --report-dir "$OUT/default3" > "$OUT/default3.txt" 2>&1
cat "$OUT/default.txt"
python3 - "$OUT/default/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for c in r["checks"]:
    print(c["name"], c["status"], "%.2f s" % c["duration_s"])
    for k in c["ranks"]:
        m = k["metrics"]
        if c["name"] == "gemm":
            print("  rank %d: %.1f TFLOP/s median, %.1f best" % (k["rank"], m["tflops"], m["tflops_best"]))
        else:
            for p in k["sweep"]:
                if p["bytes"] in (1 << 20, 1 << 30):
                    print("  rank %d: %d B %.1f us busbw %.1f GB/s wrong %d" % (k["rank"], p["bytes"], p["time_us"], p["busbw_gbps"], p["wrong"]))
PY

echo "== PyTorch baseline in the same run"
python3 bench/gpu/torch_baseline.py "$NGPU"

echo "== injected faults on the GPU (each must fail and name the rank)"
last=$((NGPU - 1))
wall gemm-wrong "$BIN" check --micro-benchmarks gemm --test-faults --sanity-check-envs "GPUSANITY_FAULT=gemm-wrong@$last" --report-dir "$OUT/f1" > "$OUT/f1.txt" 2>&1
grep -h "GEMM_WRONG\|verdict" "$OUT/f1.txt"
wall all-reduce-wrong "$BIN" check --micro-benchmarks all-reduce --test-faults --sanity-check-envs "GPUSANITY_FAULT=all-reduce-wrong@0" --report-dir "$OUT/f2" > "$OUT/f2.txt" 2>&1
grep -h "ALLREDUCE_WRONG\|verdict" "$OUT/f2.txt"
wall hang-timeout "$BIN" check --sanity-check-timeout-per-test 0.15 --test-faults --sanity-check-envs "GPUSANITY_FAULT=hang@$last" --report-dir "$OUT/f3" > "$OUT/f3.txt" 2>&1
grep -h "TEST_HANG\|verdict" "$OUT/f3.txt"
wall crash "$BIN" check --test-faults --sanity-check-envs "GPUSANITY_FAULT=exit@0" --report-dir "$OUT/f4" > "$OUT/f4.txt" 2>&1
grep -h "WORKER_CRASHED\|verdict" "$OUT/f4.txt"
if [ "$NGPU" -ge 2 ]; then
  echo "== a GPU worker stopped with SIGSTOP during gemm: the per-test timeout (9 s) names it"
  "$BIN" check --micro-benchmarks gemm,all-reduce --sanity-check-timeout-per-test 0.15 \
    --check-param gemm.iters=100000 --report-dir "$OUT/f6" > "$OUT/f6.txt" 2>&1 &
  lp=$!
  victim=""
  for _ in $(seq 100); do
    for p in $(pgrep -f 'gpusanity worker'); do
      tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -q '"rank":1,' && victim=$p
    done
    [ -n "$victim" ] && break; sleep 0.1
  done
  sleep 4; kill -STOP "$victim"; echo "stopped worker pid $victim (rank 1)"
  s=$(date +%s%N); wait $lp; rc=$?; e=$(date +%s%N)
  echo "== sigstop: launcher exit $rc, $(( (e - s) / 1000000 )) ms after the stop"
  grep -h "TEST_HANG\|verdict" "$OUT/f6.txt"

  echo "== two launchers on loopback, one GPU each (the multi-node path)"
  CUDA_VISIBLE_DEVICES=1 "$BIN" check --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port 29701 --report-dir "$OUT/mn1" > "$OUT/mn1.txt" 2>&1 &
  n1=$!
  CUDA_VISIBLE_DEVICES=0 wall two-nodes "$BIN" check --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 29701 --report-dir "$OUT/mn0" > "$OUT/mn0.txt" 2>&1
  wait $n1; echo "node 1 exit $?"
  cat "$OUT/mn0.txt"
  echo "== one GPU"
  wall one-gpu "$BIN" check --nproc-per-node 1 --report-dir "$OUT/one" > "$OUT/one.txt" 2>&1
  grep -h "verdict\|NVIDIA" "$OUT/one.txt"
fi
echo "== bad input on the GPU machine"
wall too-many-workers "$BIN" check --nproc-per-node $((NGPU + 1)) --report-dir "$OUT/f5"
echo "== processes left:"; pgrep -fa "gpusanity (check|worker)" || echo none
tar -C "$OUT" -czf "$OUT/reports.tgz" $(cd "$OUT" && ls -d */ 2>/dev/null)
