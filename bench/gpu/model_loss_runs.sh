#!/usr/bin/env bash
# Whether a model check's loss verdict is stable: the check run RUNS times at each learning rate
# of LRS, printing per run the first and final loss, the means the verdict compares and the
# status. A healthy GPU must pass every run; two runs at one rate must give the same losses (the
# kernels sum in a fixed order).
# Usage (repository root, release binary carried):
#   BIN=.carry/gpusanity OUT=/tmp/loss MODEL=resnet LRS="2e-3 1e-3" RUNS=3 bash bench/gpu/model_loss_runs.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-loss-runs}
MODEL=${MODEL:-resnet}
LRS=${LRS:-2e-3}
RUNS=${RUNS:-3}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
. "$HERE/env.sh"
for lr in $LRS; do
  for i in $(seq 1 "$RUNS"); do
    d="$OUT/$MODEL-lr$lr-$i"
    "$BIN" check --device "$DEVICE" --micro-benchmarks= --model-benchmarks "$MODEL" \
      --check-param "$MODEL.lr=$lr" --report-dir "$d" > "$d.txt" 2>&1
    rc=$?
    python3 - "$d/report.json" "$MODEL" "$lr" "$i" "$rc" <<'PY'
import json, sys
path, model, lr, run, rc = sys.argv[1:]
try:
    rep = json.load(open(path))
except Exception as e:
    print(f"{model} lr {lr} run {run}: no report ({e}), exit {rc}")
    sys.exit(0)
for c in rep["checks"]:
    if c["name"] != model:
        continue
    for r in c["ranks"]:
        m = r.get("metrics", {})
        print(f"{model} lr {lr} run {run}: exit {rc}, status {r.get('status')}, loss first {m.get('loss_first')}"
              f" final {m.get('loss_final')}, graph steps {m.get('graph_steps')}, step ms {m.get('step_ms_median')}; {r.get('error') or ''}")
PY
  done
done
