#!/usr/bin/env bash
# The whole suite on every GPU of one machine: the default check twice, then all twelve
# micro-benchmarks (gpu-health, the bandwidths and rdma-ports included) and the three model
# checks in one `gpusanity check`, twice (the first run warms the driver's caches), with wall
# times and each check's duration; then, with two GPUs or more, the slow-GPU co-runner scenario
# (bench/gpu/corunner.sh). Works for any number of GPUs.
# Usage (repository root, release binary built anywhere and carried):
#   BIN=.carry/gpusanity OUT=/tmp/full bash bench/gpu/full_suite.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-full}
mkdir -p "$OUT"
. "$HERE/env.sh"
nvidia-smi -L
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
MICRO=gemm,kernel-launch,memory-bandwidth,host-bandwidth,all-reduce,all-to-all,all-gather,reduce-scatter,multi-all-reduce,network-connectivity,matmul-all-reduce-overlap,rdma-ports,gpu-health
MODELS=mini-gpt,megatron-gpt,resnet
to() { # file, then the command: its output goes to the file (so `wall` still prints here)
  local f=$1; shift
  "$@" > "$f" 2>&1
}

durations() { # report.json: status, each check's duration and headline figures per rank
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("status:", r["status"], "|", r["summary"])
keys = ["tflops", "busbw_gbps", "launch_us", "round_trip_us", "busbw_gbps_min", "overlap_efficiency",
        "step_ms_median", "tokens_per_s", "images_per_s", "mfu", "loss_first", "loss_final", "graph_steps"]
for c in r["checks"]:
    figs = []
    for k in c["ranks"]:
        m = k["metrics"]
        figs.append("r%d " % k["rank"] + " ".join("%s=%.4g" % (x, m[x]) for x in keys if x in m))
    print("  %-26s %-8s %6.2f s  %s" % (c["name"], c["status"], c["duration_s"], " | ".join(figs)))
for f in r["findings"]:
    print("  finding:", f["severity"], f["code"], "rank", f.get("rank"), "|", f["message"])
PY
}

for i in 1 2; do
  wall "default-$i" to "$OUT/default$i.txt" "$BIN" check --report-dir "$OUT/default$i"
  durations "$OUT/default$i/report.json"
done
for i in 1 2; do
  wall "whole-suite-$i" to "$OUT/suite$i.txt" timeout -k 5 300 "$BIN" check --micro-benchmarks "$MICRO" \
    --model-benchmarks "$MODELS" --report-dir "$OUT/suite$i"
  durations "$OUT/suite$i/report.json"
done
if [ "$(nvidia-smi -L | grep -c '^GPU')" -ge 2 ]; then
  echo "== co-runner scenario"
  BIN="$BIN" OUT="$OUT/corunner" bash "$HERE/corunner.sh"
else
  echo "== co-runner scenario: needs two GPUs (bench/gpu/shared_device.sh is the one-GPU case)"
fi
echo "== processes left"
pgrep -ax gpusanity || echo none
