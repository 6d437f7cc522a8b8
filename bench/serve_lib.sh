# Shared by the benchmarks that time a real `gpusanity serve` on a SQLite file (source it):
# `serve_sqlite STATE DB` writes its configuration (public pages, a bench token) and starts
# it in the background, its Kafka from GPUSANITY_TEST_KAFKA or a broker of its own under
# STATE, and an agent key file of its own (STATE/agent-keys.toml, unless one is there already);
# sets `serve_pid`, `port`, `token`, `kafka_boot` and `topic_prefix`. `serve_stop STATE` ends both.
# GPUSANITY_BIN: the binary (default target/release/gpusanity). Without curl, python3 asks /health.
token=bench-token-0123456789
serve_pid=
serve_sqlite() {
  local state=$1 db=$2 boot=${GPUSANITY_TEST_KAFKA:-} p="b$$."
  if [ -z "$boot" ]; then
    boot=$(KAFKA_STATE="$state/kafka" TMPDIR="$state" bash scripts/kafka.sh start | sed -n 's/^KAFKA_BOOTSTRAP=//p')
  fi
  kafka_boot=$boot topic_prefix=$p
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat > "$state/gpusanity.toml" <<TOML
[kafka]
bootstrap = "$boot"
group = "${p}service"
[topics]
job_events = "${p}job-events"
output = "${p}check-events"
dead_letter = "${p}dead-letter"
agent_tasks = "${p}agent-tasks"
agent_reports = "${p}agent-reports"
telemetry = "${p}telemetry"
[database]
url = "sqlite://$db"
[http]
listen = "127.0.0.1:$port"
browser_public = true
TOML
  [ -f "$state/agent-keys.toml" ] || printf '[[key]]\nid = "bench"\nsecret = "%s"\n' "$(openssl rand -hex 32)" > "$state/agent-keys.toml"
  chmod 600 "$state/agent-keys.toml"
  GPUSANITY_AGENT_KEYS="$state/agent-keys.toml" GPUSANITY_API_TOKEN=$token "${GPUSANITY_BIN:-target/release/gpusanity}" serve --config "$state/gpusanity.toml" >"$state/serve.log" 2>&1 &
  serve_pid=$!
  for _ in $(seq 100); do serve_healthy && break; sleep 0.2; done
}
serve_healthy() {
  if command -v curl >/dev/null; then
    curl -sf "http://127.0.0.1:$port/health" >/dev/null
  else
    python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "http://127.0.0.1:$port/health" 2>/dev/null
  fi
}
serve_stop() {
  if [ -n "$serve_pid" ]; then kill "$serve_pid" 2>/dev/null || true; wait "$serve_pid" 2>/dev/null || true; fi
  [ -n "${GPUSANITY_TEST_KAFKA:-}" ] || KAFKA_STATE="$1/kafka" bash scripts/kafka.sh stop >/dev/null 2>&1 || true
}
