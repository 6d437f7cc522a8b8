#!/usr/bin/env bash
# Wall time of the default check (gemm + all-reduce) on this machine's CPU workers, from command
# start to exit, over N runs (default 10), with the release binary. Prints each run and the median.
set -eu
cd "$(dirname "$0")/.."
N=${N:-10}
cargo build --release --quiet
BIN=target/release/gpusanity
out=$(mktemp -d)
times=()
for i in $(seq "$N"); do
  s=$(date +%s%N)
  "$BIN" check --device cpu --report-dir "$out/r$i" > /dev/null
  e=$(date +%s%N)
  ms=$(( (e - s) / 1000000 ))
  times+=("$ms")
  echo "run $i: ${ms} ms"
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
echo "median: $(echo "$sorted" | sed -n "$(( (N + 1) / 2 ))p") ms over $N runs ($(nproc) cores, $(date -u +%Y-%m-%d))"
python3 - "$out/r$N/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for c in r["checks"]:
    for k in c["ranks"]:
        m = k["metrics"]
        print(c["name"], "rank", k["rank"], {x: round(m[x], 3) for x in ("tflops", "busbw_gbps", "small_time_us") if x in m})
PY
rm -rf "$out"
