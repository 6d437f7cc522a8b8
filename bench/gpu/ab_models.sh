#!/usr/bin/env bash
# Two gpusanity binaries side by side on the model checks, alternated ROUNDS times in one
# call (A, B, A, B, ...), printing each run's median step time: a change's effect measured on
# the same GPU minutes apart, free of the machine-to-machine spread between device calls.
# Usage (repository root on the GPU machine):
#   A=.carry/gpusanity-old B=.carry/gpusanity MODELS=mini-gpt,megatron-gpt ROUNDS=3 bash bench/gpu/ab_models.sh
# DEVICE=cpu runs them on CPU workers (2 ranks, data parallel) instead, anywhere.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
A=${A:?the first binary}
B=${B:?the second binary}
MODELS=${MODELS:-mini-gpt,megatron-gpt,resnet}
ROUNDS=${ROUNDS:-3}
DEVICE=${DEVICE:-cuda}
OUT=${OUT:-/tmp/gpusanity-ab}
mkdir -p "$OUT"
# shellcheck source=bench/gpu/env.sh
. "$HERE/env.sh"
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
for r in $(seq 1 "$ROUNDS"); do
  for side in A B; do
    bin=${!side}
    "$bin" check --device "$DEVICE" --micro-benchmarks= --model-benchmarks "$MODELS" --report-dir "$OUT/$side-$r" > "$OUT/$side-$r.txt" 2>&1
    rc=$?
    python3 - "$OUT/$side-$r/report.json" "$side" "$r" "$rc" <<'PY'
import json, sys
path, side, r, rc = sys.argv[1:]
try:
    rep = json.load(open(path))
except Exception as e:
    print(f"round {r} {side}: exit {rc}, no report ({e})"); sys.exit()
cells = []
for c in rep["checks"]:
    m = c["ranks"][0]["metrics"] if c["ranks"] else {}
    extra = " (%d all-reduces a step)" % m["dp_all_reduces_per_step"] if m.get("dp_all_reduces_per_step") else ""
    cells.append("%s %.1f ms%s" % (c["name"], m.get("step_ms_median", float("nan")), extra))
print(f"round {r} {side}: exit {rc}, " + ", ".join(cells))
PY
  done
done
echo "== processes left:"; pgrep -fa "gpusanity (check|worker)" || echo none
