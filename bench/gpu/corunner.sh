#!/usr/bin/env bash
# Slow-GPU diagnosis on a 2-GPU machine: a co-runner (PyTorch matmul loop) loads GPU 1 while
# `gpusanity check` runs; GPU 1's rank must be named slow in gemm (GEMM_SLOW or
# GEMM_BELOW_EXPECTED, after a re-measure) and its node faulty, while clean runs before and
# after pass with no finding.
# Usage (repository root, release binary built anywhere and carried):
#   BIN=.carry/gpusanity OUT=/tmp/corunner bash bench/gpu/corunner.sh
set -u
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-corunner}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
. "$HERE/env.sh"
nvidia-smi -L
date -u +"date: %Y-%m-%dT%H:%M:%SZ"

summary() { # report.json: status, findings, verdicts, re-measures, gemm figures
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("status:", r["status"], "| faulty nodes:", r.get("faulty_nodes"), "| re-measured:", r.get("remeasured", []))
for f in r["findings"]:
    print("  finding:", f["severity"], f["code"], "rank", f.get("rank"), "measured", f.get("measured"),
          "peers", f.get("peers_median"), "expected", f.get("expected"), "|", f["message"])
for c in r["checks"]:
    if c["name"] == "gemm":
        for k in c["ranks"]:
            m = k["metrics"]
            print("  gemm rank %d: %.1f TFLOP/s (first measurement %s)" % (k["rank"], m.get("tflops", 0), m.get("first_tflops", "-")))
PY
}

for i in 1 2; do
  echo "== clean run $i"
  "$BIN" check --report-dir "$OUT/clean$i" > "$OUT/clean$i.txt" 2>&1; echo "exit $?"
  summary "$OUT/clean$i/report.json"
done

for size in 8192 4096; do
  echo "== co-runner on GPU 1 (bf16 ${size}^3 matmul loop)"
  python3 "$HERE/corunner.py" --gpu 1 --size "$size" --seconds 300 > "$OUT/corunner$size.txt" 2>&1 &
  co=$!
  # Start the check only once the co-runner loads the GPU (importing PyTorch alone takes seconds).
  for _ in $(seq 120); do grep -q "co-runner ready" "$OUT/corunner$size.txt" && break; sleep 0.5; done
  grep "co-runner ready" "$OUT/corunner$size.txt" || echo "co-runner not ready after 60 s"
  "$BIN" check --report-dir "$OUT/loaded$size" > "$OUT/loaded$size.txt" 2>&1; echo "exit $? (expected 1)"
  kill "$co"; wait "$co" 2>/dev/null
  summary "$OUT/loaded$size/report.json"
done

echo "== clean run after"
"$BIN" check --report-dir "$OUT/clean3" > "$OUT/clean3.txt" 2>&1; echo "exit $?"
summary "$OUT/clean3/report.json"
