#!/usr/bin/env bash
# Two checks on the one GPU of this machine, as the agent starts them for jobs that name their
# GPUs (`gpu_ids`, docs/events.md): the launcher given the GPU by UUID, then by index in PCI
# order (CUDA_VISIBLE_DEVICES, as service/src/agent/launch.rs sets it), each run's report naming
# the GPU it checked; then two `--quick` checks at once on the same GPU (what the service no
# longer does: each sees the other), and the same two one after the other (what its queue does).
#
#   BIN=/tmp/b/new/gpusanity bash bench/gpu/two_runs_one_gpu.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-target/x86_64-unknown-linux-gnu/release/gpusanity}
OUT=${OUT:-/tmp/gpusanity-two-runs}
mkdir -p "$OUT"
# shellcheck source=bench/gpu/env.sh
. "$HERE/env.sh"
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader | head -n 1)
nvidia-smi --query-gpu=name,uuid,pci.bus_id --format=csv,noheader
summary() {
  python3 - "$1" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no report:", e); sys.exit()
gpus = [h["readings"]["gpus"] for h in r.get("hosts", [])]
print("  status", r["status"], "| GPUs checked", gpus, "|", r["summary"][:400])
PY
}
echo "== by UUID ($uuid)"
CUDA_VISIBLE_DEVICES=$uuid "$BIN" check --quick --report-dir "$OUT/uuid" > "$OUT/uuid.txt" 2>&1
echo "exit $?"; summary "$OUT/uuid/report.json"
echo "== by index in PCI order (0)"
CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 "$BIN" check --quick --report-dir "$OUT/index" > "$OUT/index.txt" 2>&1
echo "exit $?"; summary "$OUT/index/report.json"
echo "== two at once on the same GPU"
"$BIN" check --quick --report-dir "$OUT/at-once-1" > "$OUT/at-once-1.txt" 2>&1 &
p1=$!
"$BIN" check --quick --report-dir "$OUT/at-once-2" > "$OUT/at-once-2.txt" 2>&1 &
p2=$!
wait $p1; e1=$?; wait $p2; e2=$?
echo "exits $e1 $e2"; summary "$OUT/at-once-1/report.json"; summary "$OUT/at-once-2/report.json"
echo "== one after the other"
for i in 1 2; do
  "$BIN" check --quick --report-dir "$OUT/in-turn-$i" > "$OUT/in-turn-$i.txt" 2>&1
  echo "exit $?"; summary "$OUT/in-turn-$i/report.json"
done
echo "== processes left:"; pgrep -fa "gpusanity (check|worker)" || echo none
