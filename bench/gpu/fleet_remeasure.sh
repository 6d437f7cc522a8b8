#!/usr/bin/env bash
# The re-measure before a fleet finding on a GPU: a baseline at this GPU's own GEMM figure
# (spread 1%, a least gap of 50%), then injected slowness that the fleet judgement must tell
# apart: `gemm-slow-once` (below the floor in the first measurement only) and `gemm-slow-twice`
# (the first two) pass after the further measurements; `gemm-slow` (every measurement) is
# BELOW_FLEET, measured five times. Prints each run's status, findings, the `remeasured` note
# and the rank's measurement count.
# Usage (repository root, release binary carried): BIN=.carry/gpusanity OUT=/tmp/fleet bash bench/gpu/fleet_remeasure.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-fleet-remeasure}
mkdir -p "$OUT"
. "$HERE/env.sh"
nvidia-smi -L
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
ARGS=(--nproc-per-node 1 --micro-benchmarks gemm)

wall plain "$BIN" check "${ARGS[@]}" --report-dir "$OUT/plain" > "$OUT/plain.txt" 2>&1
python3 - "$OUT/plain/report.json" "$OUT/baseline.toml" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
g = next(c for c in r["checks"] if c["name"] == "gemm")
rank = g["ranks"][0]
centre = rank["metrics"]["tflops"]
device = r["ranks"][0]["device"]
print("plain: %s, GEMM %.1f TFLOP/s on %s, size %d" % (r["status"], centre, device, g["config"]["size"]))
open(sys.argv[2], "w").write(
    "[judging]\nk = 4.0\nmin_gap = 0.5\n\n[[entry]]\ndevice = %s\ncheck = \"gemm\"\nmetric = \"tflops\"\n"
    "value = %r\nspread = %r\nsamples = 40\nnodes = 5\nwindow = 200\nsize = %d\nsingle_node = true\n"
    "ranks_per_node = 1\nsource = \"this GPU\"\n" % (json.dumps(device), centre, 0.01 * centre, g["config"]["size"]))
PY

for fault in gemm-slow-once@0 gemm-slow-twice@0 gemm-slow@0; do
  wall "$fault" "$BIN" check "${ARGS[@]}" --test-faults --sanity-check-envs "GPUSANITY_FAULT=$fault" \
    --baseline "$OUT/baseline.toml" --report-dir "$OUT/${fault%@*}" > "$OUT/${fault%@*}.txt" 2>&1
  python3 - "$OUT/${fault%@*}/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
g = next(c for c in r["checks"] if c["name"] == "gemm")
m = g["ranks"][0]["metrics"]
print("  status %s, %.4g s; tflops %.1f, measurements %s" % (r["status"], g["duration_s"], m.get("tflops", 0), m.get("measurements", 1)))
for n in r.get("remeasured", []):
    print("  remeasured:", n)
for f in r["findings"]:
    print("  finding:", f["code"], "rank", f.get("rank"), "|", f["message"])
PY
done
echo "== processes left"
pgrep -ax gpusanity || echo none
