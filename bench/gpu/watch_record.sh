#!/usr/bin/env bash
# Records what the watch sees of a real training job on one GPU (docs/watch.md): a steady
# training loop with checkpoint, evaluation and data-loader phases, sampled every second, and
# a second process that starts computing on the same GPU mid-run (a foreign process), for
# the fleet simulation's spreads (bench/watch_sim.rs) and the judgement's unit tests.
#   bash bench/gpu/watch_record.sh OUT [SECONDS] [FOREIGN_AT] [FOREIGN_FOR]
set -u
out=${1:?OUT}; secs=${2:-330}; at=${3:-200}; dur=${4:-40}
here=$(cd "$(dirname "$0")" && pwd)
. "$here/env.sh"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv > "$out/gpu.csv"
python3 "$here/watch_train.py" --seconds "$secs" --steps "$out/steps.jsonl" --telemetry "$out/telemetry.jsonl" &
train=$!
sleep "$at"
echo "foreign start $(date +%s.%N)" > "$out/foreign.txt"
python3 "$here/corunner.py" --gpu 0 --seconds "$dur"
echo "foreign end $(date +%s.%N)" >> "$out/foreign.txt"
wait "$train"
echo "train exit $?"
