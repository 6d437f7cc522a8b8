#!/usr/bin/env bash
# The report browser's latency on a full database: RUNS runs (4 nodes each, 1 in 10 failed,
# 10 workspaces) seeded into the SQLite file of a real `gpusanity serve`, then COUNT requests
# per route with curl; prints the median and the slowest time of each.
#   RUNS=20000 COUNT=30 bench/browser_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
runs=${RUNS:-20000}
count=${COUNT:-30}
state=$(mktemp -d)
. bench/serve_lib.sh
trap 'serve_stop "$state"; rm -rf "$state"' EXIT
db="$state/gpusanity.db"
serve_sqlite "$state" "$db"
python3 - "$db" "$runs" <<'PY'
import json, sqlite3, sys
db, n = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(db)
t0 = 1_790_000_000_000
for i in range(n):
    rid, job, ws, at = f"run-{i:06d}", f"job-{i % 500}", f"ws-{i % 10}", t0 + i * 60_000
    names = [f"node-{(i * 4 + k) % 400}" for k in range(4)]
    nodes = json.dumps([{"name": m, "address": "10.0.0.1", "gpus": 8} for m in names], separators=(",", ":"))
    failed = i % 10 == 0
    state = "CheckFailed" if failed else "CheckPassed"
    c.execute("INSERT INTO runs (run_id, job_id, workspace_id, attempt, cause_event_id, nodes, check_args, settings, state, held, created_at, deadline_at, finished_at, summary) VALUES (?,?,?,0,?,?,'','{}',?,0,?,?,?,?)",
              (rid, job, ws, f"ev-{i}", nodes, state, at, at + 600_000, at + 30_000, state))
    for k, m in enumerate(names):
        bad = failed and k == 1
        c.execute("INSERT INTO node_health (node_name, run_id, job_id, healthy, codes, at) VALUES (?,?,?,?,?,?)", (m, rid, job, 0 if bad else 1, "GEMM_SLOW" if bad else "", at + 30_000))
c.commit()
PY
echo "$(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), SQLite, $runs runs, $count requests per route"
for route in "/v1/runs" "/v1/runs?workspace=ws-3" "/v1/runs?state=CheckFailed" "/v1/runs?node=node-7" \
  "/v1/runs?from=2026-09-25T00:00&to=2026-09-26T00:00" "/v1/runs?page=300" "/v1/nodes/node-7/history" "/ui/runs" "/ui/runs?node=node-7" "/ui/nodes/node-7"; do
  for _ in $(seq "$count"); do
    curl -s -o /dev/null -w '%{http_code} %{time_total}\n' -H "Authorization: Bearer $token" "http://127.0.0.1:$port$route"
  done >"$state/times"
  bad=$(awk '$1 != 200' "$state/times" | wc -l)
  sort -k2 -n "$state/times" | awk -v r="$route" -v bad="$bad" '{ t[NR] = $2 * 1000 } END {
    printf "%-55s median %6.1f ms  max %6.1f ms%s\n", r, t[int((NR + 1) / 2)], t[NR], (bad > 0) ? "  (" bad " non-200)" : "" }'
done
