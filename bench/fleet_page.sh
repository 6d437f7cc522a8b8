#!/usr/bin/env bash
# The fleet page's cost at fleet scale: NODES nodes x RUNS passed runs of 8 ranks (GEMM and
# all-reduce figures) seeded through the db crate (bench/fleet_seed.rs) into the SQLite file of
# a real `gpusanity serve`, then COUNT requests per route with curl (median and slowest), and,
# with SHOTS=DIR, headless Chromium screenshots of the fleet page and the slow node's page.
#   NODES=10000 RUNS=2 COUNT=10 SHOTS=docs/examples bench/fleet_page.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --bin gpusanity --example fleet_seed
nodes=${NODES:-10000}
runs=${RUNS:-2}
count=${COUNT:-10}
state=$(mktemp -d)
. bench/serve_lib.sh
trap 'serve_stop "$state"; rm -rf "$state"' EXIT
db="$state/gpusanity.db"
target/release/examples/fleet_seed "sqlite://$db?mode=rwc" "$nodes" "$runs"
serve_sqlite "$state" "$db"
echo "$(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), SQLite, $nodes nodes x $runs runs, $count requests per route"
for route in "/v1/fleet" "/ui/fleet" "/v1/nodes/node-7/figures" "/ui/nodes/node-7" "/metrics"; do
  for _ in $(seq "$count"); do
    curl -s -o "$state/body" -w '%{http_code} %{time_total} %{size_download}\n' -H "Authorization: Bearer $token" "http://127.0.0.1:$port$route"
  done >"$state/times"
  bad=$(awk '$1 != 200' "$state/times" | wc -l)
  sort -k2 -n "$state/times" | awk -v r="$route" -v bad="$bad" '{ t[NR] = $2 * 1000; b = $3 } END {
    printf "%-28s median %7.1f ms  max %7.1f ms  %8d bytes%s\n", r, t[int((NR + 1) / 2)], t[NR], b, (bad > 0) ? "  (" bad " non-200)" : "" }'
done
if [ -n "${SHOTS:-}" ]; then
  for page in fleet:/ui/fleet node:/ui/nodes/node-7; do
    name=${page%%:*}
    start=$(date +%s.%N)
    chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
      --disable-component-update --disable-sync --disable-dev-shm-usage --user-data-dir="$state/chrome-$name" \
      --window-size=1300,1100 --screenshot="$SHOTS/fleet-$name.png" "http://127.0.0.1:$port${page#*:}" >/dev/null 2>&1
    echo "chromium: ${page#*:} loaded and drawn in $(echo "$(date +%s.%N) - $start" | bc) s -> $SHOTS/fleet-$name.png"
  done
fi
