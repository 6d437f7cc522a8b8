#!/usr/bin/env bash
# The figures the fleet simulation of the watch draws from, and the sampler's cost, on one GPU
# (docs/benchmarks/watch.md): one device call.
#   1. bench/gpu/watch_service.sh with SERVICE=0: a steady training loop (no phases) for
#      OVERHEAD_S s with `gpusanity watch-record` on and off in alternate windows (the step
#      time with and without the sampler, the sampler's CPU time), its pynvml telemetry with
#      every 100 ms clock reading (`sm_readings`);
#   2. the same loop with its phases (checkpoint, evaluation, data-loader stalls) for PHASED_S s,
#      recorded the same way;
#   3. watch_means.py (how many seconds fall how far below the median, one reading against the
#      mean of ten, how long dips last) and watch_spreads.py --means (the spreads JSON for
#      `watch_sim --spreads`) of each recording.
#
#   bench/gpu/watch_dips.sh BINARY OUT_DIR
#
# OVERHEAD_S (280), WINDOW_S (20), PHASED_S (150; 0 skips the phased loop). Everything lands in OUT_DIR and in one
# archive, OUT_DIR/watch-dips.tgz.
set -uo pipefail
[ $# -ge 2 ] || { sed -n '14p' "$0" | sed 's/^#   //' >&2; exit 2; }
BIN=$1 OUT=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
bundle=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-nobundle.XXXXXX") # SERVICE=0 starts no broker
SERVICE=0 OVERHEAD_S=${OVERHEAD_S:-280} WINDOW_S=${WINDOW_S:-20} \
  bash "$here/watch_service.sh" "$BIN" "$bundle" "$OUT" >"$OUT/cost.txt" 2>&1
echo "cost: exit $?" >>"$OUT/cost.txt"
rmdir "$bundle"
. "$here/env.sh"
recs=steady
if [ "${PHASED_S:-150}" != 0 ]; then
  python3 "$here/watch_train.py" --seconds "${PHASED_S:-150}" --steps "$OUT/steps-phased.jsonl" \
    --telemetry "$OUT/telemetry-phased.jsonl" >"$OUT/phased.txt" 2>&1
  echo "phased: exit $?" >>"$OUT/phased.txt"
  recs="steady phased"
fi
for rec in $recs; do
  python3 "$here/watch_means.py" "$OUT/telemetry-$rec.jsonl" >"$OUT/means-$rec.txt" 2>&1
  python3 "$here/watch_spreads.py" --means "$OUT/telemetry-$rec.jsonl" >"$OUT/spreads-$rec.json" 2>"$OUT/spreads-$rec.txt"
done
tar -czf "$OUT/watch-dips.tgz" -C "$OUT" --exclude agent-work --exclude '*.tgz' . 2>/dev/null
cat "$OUT/cost.txt" "$OUT/means-steady.txt" "$OUT/spreads-steady.txt"
[ ! -f "$OUT/means-phased.txt" ] || cat "$OUT/means-phased.txt"
