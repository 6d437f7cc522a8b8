#!/usr/bin/env bash
# The figure behind H200's `gemm.tflops` entry of common/data/expected.toml: gpusanity's gemm
# check (sustained throughput over its timed window) and a PyTorch loop measuring the same way,
# alternated five times on every GPU of the machine at once, then the whole suite once so its
# report.json can be rendered (docs/examples/).
# Usage (repository root, release binary carried): BIN=.carry/gpusanity OUT=/tmp/ge bash bench/gpu/gemm_expected.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-gemm-expected}
mkdir -p "$OUT"
. "$HERE/env.sh"
nvidia-smi -L
nvidia-smi --query-gpu=index,name,driver_version,power.limit,clocks.max.sm,temperature.gpu --format=csv
NGPU=$(nvidia-smi -L | grep -c '^GPU')
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
for i in 1 2 3 4 5; do
  "$BIN" check --micro-benchmarks gemm --report-dir "$OUT/gemm$i" > "$OUT/gemm$i.txt" 2>&1
  echo "gpusanity run $i exit $?: $(python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))
c = r["checks"][0]
print(" | ".join("rank %d tflops %.1f median %.1f" % (k["rank"], k["metrics"]["tflops"], k["metrics"].get("tflops_median", 0)) for k in c["ranks"]), "| findings:", " ".join(f["code"] for f in r["findings"]) or "none")
' "$OUT/gemm$i/report.json")"
  python3 "$HERE/torch_gemm_sustained.py" "$NGPU"
done
MICRO=gemm,kernel-launch,all-reduce,all-to-all,all-gather,multi-all-reduce,network-connectivity,matmul-all-reduce-overlap
wall full-suite "$BIN" check --micro-benchmarks "$MICRO" --model-benchmarks mini-gpt,megatron-gpt,resnet --report-dir "$OUT/full" > "$OUT/full.txt" 2>&1
tail -5 "$OUT/full.txt"
