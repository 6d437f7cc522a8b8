#!/usr/bin/env bash
# `gpusanity check --quick` (the prolog's and HealthCheckProgram's single-node mode,
# docs/slurm.md) on this GPU node, RUNS times: wall time, exit code and each check's time, to
# show that it ends well inside slurmd's 60 s.
# Usage (repository root on the GPU machine): BIN=target/release/gpusanity RUNS=3 bash bench/gpu/quick_check.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-target/release/gpusanity}
RUNS=${RUNS:-3}
OUT=${OUT:-/tmp/gpusanity-quick}
mkdir -p "$OUT"
# shellcheck source=bench/gpu/env.sh
. "$HERE/env.sh"
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
for i in $(seq 1 "$RUNS"); do
  s=$(date +%s%N)
  "$BIN" check --quick --report-dir "$OUT/run-$i" > "$OUT/run-$i.txt" 2>&1
  rc=$?
  e=$(date +%s%N)
  echo "== quick check $i: wall $(( (e - s) / 1000000 )) ms, exit $rc"
  python3 - "$OUT/run-$i/report.json" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("  no report:", e); sys.exit()
print("  status", r["status"], "|", r["summary"])
for c in r["checks"]:
    print("  %-20s %-15s %.2f s" % (c["name"], c["status"], c["duration_s"]))
PY
done
echo "== processes left:"; pgrep -fa "gpusanity (check|worker)" || echo none
