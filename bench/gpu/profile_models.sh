#!/usr/bin/env bash
# Where a model check's step time goes on the GPU: each model check under Nsight Systems, its
# CUDA kernels summed by name (the top ones by total time, with their share), the figures the
# kernel work of the model issue is planned against. Uses `nsys` where the GPU machine has it,
# else Nsight Compute (`ncu`, clocks left alone) on SKIP..SKIP+COUNT kernel launches (past the
# warm-up steps), timing each kernel once.
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
SKIP=${SKIP:-3000}
COUNT=${COUNT:-1500}
summarise() { # csv file (Name, total ns, instances), how many to show
  python3 - "$1" "$2" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
top = int(sys.argv[2])
total = sum(float(r["Total Time (ns)"]) for r in rows)
print("  %d kernels by name, %.1f ms of GPU time in all" % (len(rows), total / 1e6))
for r in rows[:top]:
    t = float(r["Total Time (ns)"])
    print("  %5.1f%%  %9.1f ms  %7s calls  %s" % (100 * t / total, t / 1e6, r["Instances"], r["Name"][:110]))
PY
}
if ! command -v nsys > /dev/null; then
  if ! command -v ncu > /dev/null; then
    echo "neither nsys nor ncu found: nothing profiled"
    exit 0
  fi
  ncu --version | tail -1
  for m in $MODELS; do
    echo "== $m: kernels $SKIP..$((SKIP + COUNT)) by total GPU time (ncu, gpu__time_duration)"
    ncu --clock-control none --metrics gpu__time_duration.sum --csv --launch-skip "$SKIP" --launch-count "$COUNT" \
      "$BIN" check --device cuda --micro-benchmarks= --model-benchmarks "$m" --sanity-check-max-time 280 \
      --report-dir "$OUT/$m-report" > "$OUT/$m.csv" 2> "$OUT/$m.err"
    echo "exit $?"
    python3 - "$OUT/$m.csv" "$OUT/$m-sum.csv" <<'PY'
import csv, collections, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
tot, n = collections.Counter(), collections.Counter()
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    scale = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(r.get("Metric Unit", "nsecond"), 1)
    tot[r["Kernel Name"]] += v * scale
    n[r["Kernel Name"]] += 1
with open(sys.argv[2], "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(["Name", "Total Time (ns)", "Instances"])
    for k, t in tot.most_common():
        w.writerow([k, t, n[k]])
PY
    summarise "$OUT/$m-sum.csv" "$TOP"
  done
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
  summarise "$OUT/${m}_cuda_gpu_kern_sum.csv" "$TOP"
done
