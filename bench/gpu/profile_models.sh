#!/usr/bin/env bash
# Where a model check's step time goes on the GPU: each model check under Nsight Systems, its
# CUDA kernels summed by name (the top ones by total time, with their share), the figures the
# kernel work of the model issue is planned against. Needs `nsys` on the GPU machine.
# Usage (repository root, release binary carried):
#   BIN=.carry/gpusanity OUT=/tmp/prof MODELS="mini-gpt megatron-gpt resnet" bash bench/gpu/profile_models.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-profile}
MODELS=${MODELS:-mini-gpt megatron-gpt resnet}
TOP=${TOP:-15}
mkdir -p "$OUT"
. "$HERE/env.sh"
if ! command -v nsys > /dev/null; then
  echo "nsys not found: nothing profiled"
  exit 0
fi
nsys --version
for m in $MODELS; do
  echo "== $m: the kernels by total GPU time (whole check: warm-up and timed steps)"
  nsys profile --trace=cuda --sample=none --cpuctxsw=none -f true -o "$OUT/$m" \
    "$BIN" check --device cuda --micro-benchmarks= --model-benchmarks "$m" --report-dir "$OUT/$m-report" \
    > "$OUT/$m.txt" 2>&1
  echo "exit $?"
  nsys stats --report cuda_gpu_kern_sum --format csv --output "$OUT/$m" "$OUT/$m.nsys-rep" > /dev/null 2>&1
  python3 - "$OUT/${m}_cuda_gpu_kern_sum.csv" "$TOP" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
top = int(sys.argv[2])
total = sum(float(r["Total Time (ns)"]) for r in rows)
print("  %d kernels by name, %.1f ms of GPU time in all" % (len(rows), total / 1e6))
for r in rows[:top]:
    t = float(r["Total Time (ns)"])
    print("  %5.1f%%  %9.1f ms  %7s calls  %s" % (100 * t / total, t / 1e6, r["Instances"], r["Name"][:110]))
PY
done
