#!/usr/bin/env bash
# The default check cold and warm, two binaries interleaved (A, B, A, B), each through
# cold_start.sh, then what gpu-health read under load in each one's last report (the clock,
# power and the load it sampled). Machines are shared and noisy: compare A and B side by side.
# Usage (repository root, stripped release binaries carried):
#   A=.carry/gpusanity B=.carry/gpusanity-before RUNS=3 bash bench/gpu/cold_start_ab.sh
#   # log: $OUT/cold_start_ab.txt
set -u
A=${A:-.carry/gpusanity}
B=${B:-.carry/gpusanity-before}
OUT=${OUT:-/tmp/gpusanity-cold-ab}
RUNS=${RUNS:-3}
mkdir -p "$OUT"
exec > >(tee "$OUT/cold_start_ab.txt") 2>&1
here=$(dirname "$0")
for round in 1 2; do
  for side in A B; do
    bin=${!side}
    echo "## $side-$round ($bin)"
    BIN=$bin OUT="$OUT/$side-$round" RUNS=$RUNS bash "$here/cold_start.sh" >/dev/null 2>&1
    grep -vE '^(date|gpusanity|[0-9]+, NVIDIA)' "$OUT/$side-$round/cold_start.txt"
  done
done
for side in A B; do
  report="$OUT/$side-2/warm-$RUNS/report.json"
  echo "## $side: gpu-health under load ($report)"
  python3 - "$report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for c in r.get("checks", []):
    if c.get("name") != "gpu-health":
        continue
    for rr in c.get("ranks", []):
        m, n = rr.get("metrics", {}), rr.get("notes", {})
        print("  rank", rr.get("rank"), "status", rr.get("status"),
              "sm_clock_load_mhz", m.get("sm_clock_load_mhz"), "sm_clock_max_mhz", m.get("sm_clock_max_mhz"),
              "power_load_w", m.get("power_load_w"), "| load:", n.get("load"))
print("  findings:", [f.get("code") for f in r.get("findings", [])])
PY
done
