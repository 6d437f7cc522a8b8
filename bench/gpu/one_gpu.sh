#!/usr/bin/env bash
# One GPU is a real topology: the default check must pass a healthy GPU, fast, and still name a
# slow, wrong or hung one (the expected figure of its model is then the only comparison).
# Prints: the default check's wall time five times, alternated with a PyTorch GEMM loop that
# measures the same way (bench/gpu/torch_gemm_sustained.py); the whole micro suite on one GPU
# (the checks that need peers must say not_applicable); injected faults.
# Usage (repository root, release binary carried): BIN=.carry/gpusanity OUT=/tmp/one bash bench/gpu/one_gpu.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-one-gpu}
mkdir -p "$OUT"
. "$HERE/env.sh"
nvidia-smi -L
nvidia-smi --query-gpu=index,name,driver_version,power.limit,clocks.max.sm --format=csv,noheader
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}

to() { # file, then the command: its output goes to the file (so `wall` still prints here)
  local f=$1; shift
  "$@" > "$f" 2>&1
}

summary() { # report.json
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("status:", r["status"], "|", r["summary"])
for c in r["checks"]:
    for k in c["ranks"]:
        m, n = k["metrics"], k.get("notes", {})
        fig = " ".join("%s=%.4g" % (x, m[x]) for x in ["tflops", "busbw_gbps", "round_trip_us"] if x in m)
        why = n.get("not_applicable") or n.get("compared_with") or ""
        print("  %-26s %-14s %5.2f s  r%d %s | %s" % (c["name"], c["status"], c["duration_s"], k["rank"], fig, why))
for f in r["findings"]:
    print("  finding:", f["severity"], f["code"], "rank", f.get("rank"), "|", f["message"][:160])
PY
}

echo "== default check, five times, each beside a PyTorch GEMM loop measured the same way"
for i in 1 2 3 4 5; do
  wall "default-$i" to "$OUT/d$i.txt" "$BIN" check --report-dir "$OUT/d$i"
  summary "$OUT/d$i/report.json" | head -3
  python3 "$HERE/torch_gemm_sustained.py" 1
done
echo "== the whole micro suite on one GPU"
wall micro-suite to "$OUT/suite.txt" "$BIN" check \
  --micro-benchmarks gemm,kernel-launch,all-reduce,all-to-all,all-gather,multi-all-reduce,network-connectivity,matmul-all-reduce-overlap \
  --report-dir "$OUT/suite"
summary "$OUT/suite/report.json"
echo "== injected faults on one GPU (each must fail and name rank 0)"
wall gemm-slow to "$OUT/f1.txt" "$BIN" check --test-faults --sanity-check-envs GPUSANITY_FAULT=gemm-slow@0 --report-dir "$OUT/f1"
summary "$OUT/f1/report.json" | grep -E "^status|finding"
wall gemm-wrong to "$OUT/f2.txt" "$BIN" check --test-faults --sanity-check-envs GPUSANITY_FAULT=gemm-wrong@0 --report-dir "$OUT/f2"
summary "$OUT/f2/report.json" | grep -E "^status|finding"
wall hang to "$OUT/f3.txt" "$BIN" check --sanity-check-timeout-per-test 0.15 --test-faults --sanity-check-envs GPUSANITY_FAULT=hang@0 \
  --report-dir "$OUT/f3"
summary "$OUT/f3/report.json" | grep -E "^status|finding"
echo "== a hang named by the stall time (default per-test limit of 6 min; diagnosis.stall-s=5)"
wall hang-stall to "$OUT/f4.txt" "$BIN" check --test-faults --sanity-check-envs GPUSANITY_FAULT=hang@0 \
  --check-param diagnosis.stall-s=5 --report-dir "$OUT/f4"
summary "$OUT/f4/report.json" | grep -E "^status|finding"
echo "== sizes that do not fit the GPU are refused up front (exit 2)"
"$BIN" check --micro-benchmarks all-reduce --check-param all-reduce.max-bytes=214748364800 --report-dir "$OUT/f5"; echo "exit $?"
echo "== the default check with a rendezvous secret"
GPUSANITY_RDZV_SECRET=0123456789abcdef0123456789abcdef wall secret to "$OUT/s1.txt" "$BIN" check --report-dir "$OUT/s1"
summary "$OUT/s1/report.json" | head -2
echo "== processes left:"; pgrep -fa "gpusanity (check|worker)" || echo none
