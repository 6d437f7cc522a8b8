#!/usr/bin/env bash
# One job of NODES nodes (default 2048) x GPUS ranks (default 8) through a real `gpusanity
# serve` on SQLite and a real Kafka broker (bench/serve_lib.sh): the agents simulated in one
# process over the real protocol (bench/sim_agents.rs), each node with its own key (KEYS=node,
# the default) or all with the cluster key (KEYS=cluster). Prints per phase the wall time from
# the job event and serve's peak RSS, the job's output events by type (exactly one
# SanityCheckStarted and one verdict, or the bench fails), then the stored report (complete:
# every rank) and the run's page (curl; headless Chromium's load when installed).
#   NODES=2048 GPUS=8 KEYS=node bench/service_scale.sh
set -euo pipefail
cd "$(dirname "$0")/.."
nodes=${NODES:-2048}
gpus=${GPUS:-8}
[ -n "${NO_BUILD:-}" ] || cargo build --release --quiet --bin gpusanity --example service_scale
state=$(mktemp -d)
. bench/serve_lib.sh
trap 'serve_stop "$state"; [ -n "${KEEP:-}" ] && echo "kept $state" || rm -rf "$state"' EXIT
python3 - "$nodes" "${KEYS:-node}" "$state/agent-keys.toml" <<'PY'
import os, sys
n, mode, path = int(sys.argv[1]), sys.argv[2], sys.argv[3]
keys = [("cluster", None)] if mode == "cluster" else [("node-%d" % k, "node-%d" % k) for k in range(n)]
with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
    for kid, node in keys:
        f.write('[[key]]\nid = "%s"\nsecret = "%s"\n' % (kid, os.urandom(32).hex()))
        if node:
            f.write('nodes = ["%s"]\n' % node)
PY
serve_sqlite "$state" "$state/gpusanity.db"
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $nodes nodes x $gpus ranks, ${KEYS:-node} keys, SQLite, broker $kafka_boot"
target/release/examples/service_scale "$kafka_boot" "$topic_prefix" "$state/agent-keys.toml" "$nodes" "$serve_pid" "$gpus" \
  | tee "$state/bench.out"
run=$(sed -n 's/^RUN_ID=//p' "$state/bench.out")
base="http://127.0.0.1:$port"
read -r code bytes secs < <(curl -s -o "$state/report.json" -w '%{http_code} %{size_download} %{time_total}\n' \
  -H "Authorization: Bearer $token" "$base/v1/runs/$run/report")
ranks=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(len(r["ranks"]), len(r["checks"]), sum(len(c["ranks"]) for c in r["checks"]))' "$state/report.json" 2>/dev/null || echo "none")
echo "GET /v1/runs/{run}/report: $code, $bytes bytes in $secs s; ranks, checks, rank results: $ranks"
[ "$code" = 200 ] && [ "${ranks%% *}" = $((nodes * gpus)) ] || { echo "the stored report is not complete"; exit 1; }
for route in "/ui/runs/$run"; do
  curl -s -o /dev/null -w "GET $route: %{http_code}, %{size_download} bytes in %{time_total} s\n" "$base$route"
done
if command -v chromium > /dev/null; then
  for route in "/ui/runs/$run"; do
    start=$(date +%s%N)
    chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
      --disable-component-update --disable-sync --disable-dev-shm-usage --user-data-dir="$state/chrome" \
      --dump-dom "$base$route" > "$state/dom.html" 2>/dev/null
    echo "chromium: $route loaded in $(( ($(date +%s%N) - start) / 1000000 )) ms, $(wc -c < "$state/dom.html") bytes of DOM"
  done
fi
echo "serve at the end: peak RSS $(awk '/VmHWM/ { printf "%.1f MiB", $2 / 1024 }' "/proc/$serve_pid/status"), CPU time $(ps -o cputime= -p "$serve_pid")"
if command -v chromium > /dev/null; then
  echo '<!doctype html><title>empty</title>' > "$state/empty.html"
  start=$(date +%s%N)
  chromium --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$state/chrome" --dump-dom "file://$state/empty.html" > /dev/null 2>&1
  echo "chromium: an empty page loads in $(( ($(date +%s%N) - start) / 1000000 )) ms (the browser's own start)"
fi
