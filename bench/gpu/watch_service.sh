#!/usr/bin/env bash
# The watch on a real GPU, through the real service (docs/watch.md): a Kafka broker from the
# bundle of scripts/service-bundle.sh, `gpusanity serve` on SQLite (bench/serve_lib.sh), one
# `gpusanity agent --device cuda`; one JobResourcesAllocated on this node; once its check passed,
# the job runs (bench/gpu/watch_train.py: a real training loop with its phases, its own pynvml
# telemetry recorded), and FOREIGN_AT s in another process starts computing on the same GPU
# (bench/gpu/corunner.py) for FOREIGN_FOR s. The service must publish NodeSuspected
# WATCH_FOREIGN_PROCESS for this node within 10 s of that start, and nothing before it.
# Then the watch's cost: the same loop for OVERHEAD_S s with `gpusanity watch-record` on and off
# in alternate windows of WINDOW_S s (step times compared window by window; the sampler's own
# CPU time from its output).
#
#   bench/gpu/watch_service.sh BINARY BUNDLE_DIR OUT_DIR
#
# TRAIN_S (150), FOREIGN_AT (90), FOREIGN_FOR (30), OVERHEAD_S (160), WINDOW_S (20); SERVICE=0
# skips the service's part (the cost and the steady loop's telemetry alone).
# Exit 0 only if the foreign process was suspected in time and nothing else was.
set -euo pipefail
[ $# -ge 3 ] || { sed -n '13p' "$0" | sed 's/^#   //' >&2; exit 2; }
BIN=$1 BUNDLE=$2 OUT=$3
TRAIN_S=${TRAIN_S:-150} FOREIGN_AT=${FOREIGN_AT:-90} FOREIGN_FOR=${FOREIGN_FOR:-30}
OVERHEAD_S=${OVERHEAD_S:-160} WINDOW_S=${WINDOW_S:-20}
NODE=${NODE:-$(uname -n)}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
BUNDLE=$(cd "$BUNDLE" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"
export JAVA=$BUNDLE/jre/bin/java GPUSANITY_KAFKA_CACHE=$BUNDLE/kafka GPUSANITY_BIN=$BIN
export PATH=$BUNDLE/jre/bin:$PATH GPUSANITY_LOG=${GPUSANITY_LOG:-info}
unset GPUSANITY_TEST_KAFKA JAVA_HOME
set +eu
# shellcheck source=bench/gpu/env.sh
. "$ROOT/bench/gpu/env.sh"
set -eu
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
nvidia-smi --query-gpu=index,name,uuid,driver_version,power.limit --format=csv,noheader || true
# shellcheck source=bench/serve_lib.sh
. bench/serve_lib.sh
agent_pid='' kafka_boot='' topic_prefix=''
finish() {
  local rc=$?
  set +e
  [ -z "$agent_pid" ] || { kill "$agent_pid" 2>/dev/null; wait "$agent_pid" 2>/dev/null; }
  if [ -n "$kafka_boot" ]; then
    "$JAVA" -cp "$BUNDLE/kafka/libs/*" org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$kafka_boot" \
      --topic "${topic_prefix}check-events" --from-beginning --timeout-ms 4000 >"$OUT/check-events.jsonl" 2>/dev/null
    "$JAVA" -cp "$BUNDLE/kafka/libs/*" org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$kafka_boot" \
      --topic "${topic_prefix}telemetry" --from-beginning --timeout-ms 4000 >"$OUT/telemetry-envelopes.jsonl" 2>/dev/null
  fi
  serve_stop "$state"
  cp "$state/serve.log" "$OUT/serve.log" 2>/dev/null
  rm -rf "$state"
  tar -czf "$OUT/watch-gpu.tgz" -C "$OUT" --exclude agent-work --exclude watch-gpu.tgz . 2>/dev/null || true
  exit "$rc"
}
state=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-watch.XXXXXX")
trap finish EXIT
python3 -c 'import secrets; print("[[key]]\nid = \"bench\"\nsecret = \"%s\"" % secrets.token_hex(32))' >"$state/agent-keys.toml"
rc=0
if [ "${SERVICE:-1}" = 1 ]; then
serve_sqlite "$state" "$state/gpusanity.db"
serve_healthy || { tail -20 "$state/serve.log" >&2; exit 1; }
"$BIN" agent --node "$NODE" --config "$state/gpusanity.toml" --agent-keys "$state/agent-keys.toml" \
  --device cuda --work-dir "$OUT/agent-work" --heartbeat-s 1 >"$OUT/agent.log" 2>&1 &
agent_pid=$!
sleep 3
now=$(date -u +%Y-%m-%dT%H:%M:%S.000Z)
printf 'watch-1\t{"version":1,"type":"JobResourcesAllocated","event_id":"%sev-1","job_id":"watch-1","workspace_id":"bench","occurred_at":"%s","attempt":0,"framework":"PyTorch","nodes":[{"name":"%s","address":"127.0.0.1","gpus":1}],"settings":{"EnableSanityCheck":true,"SanityCheckArgs":"--micro-benchmarks=gpu-health,gemm,kernel-launch --sanity-check-timeout-per-test=0.5 --sanity-check-max-time=0.75"}}\n' \
  "$topic_prefix" "$now" "$NODE" | "$JAVA" -cp "$BUNDLE/kafka/libs/*" org.apache.kafka.tools.ConsoleProducer \
  --bootstrap-server "$kafka_boot" --topic "${topic_prefix}job-events" --reader-property parse.key=true \
  --reader-property key.separator=$'\t' >"$OUT/producer.log" 2>&1
api() { python3 -c 'import json,sys,urllib.request; r=urllib.request.Request("http://127.0.0.1:%s%s" % (sys.argv[1], sys.argv[2]), headers={"Authorization": "Bearer " + sys.argv[3]}); print(json.dumps(json.load(urllib.request.urlopen(r, timeout=10))))' "$port" "$1" "$token"; }
for _ in $(seq 240); do
  state_now=$(api "/v1/runs?workspace=bench" | python3 -c 'import json,sys; r=json.load(sys.stdin)["runs"]; print(r[0]["state"] if r else "-")')
  [ "$state_now" = Checking ] || [ "$state_now" = - ] || break
  sleep 0.5
done
echo "the check: $state_now"
[ "$state_now" = CheckPassed ] || { tail -30 "$OUT/agent.log"; exit 1; }
# The job runs; then a process that is not the job's starts computing on its GPU.
python3 bench/gpu/watch_train.py --seconds "$TRAIN_S" --steps "$OUT/steps-service.jsonl" --telemetry "$OUT/telemetry.jsonl" &
train=$!
sleep "$FOREIGN_AT"
date +%s.%N > "$OUT/foreign_start"
python3 bench/gpu/corunner.py --gpu 0 --seconds "$FOREIGN_FOR" &
wait "$train"
api "/v1/nodes/$NODE/reputation" > "$OUT/reputation.json"
python3 - "$OUT" "$NODE" <<'PY'
import json, sys
out, node = sys.argv[1], sys.argv[2]
start = float(open(f"{out}/foreign_start").read())
rep = json.load(open(f"{out}/reputation.json"))
sus = rep.get("suspicions", [])
for s in sus:
    print(f"suspected {s['code']} on {s['gpu']} at {s['at_ms']/1000 - start:+.2f} s from the foreign start "
          f"(since {s['since_ms']/1000 - start:+.2f} s): {s['evidence']}")
foreign = [s for s in sus if s["code"] == "WATCH_FOREIGN_PROCESS"]
ok = len(foreign) == 1 and 0 <= foreign[0]["at_ms"] / 1000 - start <= 10 and len(sus) == 1
print("RESULT:", "PASS" if ok else "FAIL", f"({len(sus)} suspicion(s))")
json.dump({"foreign_start": start, "suspicions": sus, "pass": ok}, open(f"{out}/watch-summary.json", "w"), indent=2)
PY
rc=$?
kill "$agent_pid" 2>/dev/null; wait "$agent_pid" 2>/dev/null || true; agent_pid=''
fi
# The cost: the loop with the sampler on and off in alternate windows.
python3 bench/gpu/watch_train.py --seconds "$OVERHEAD_S" --steps "$OUT/steps-overhead.jsonl" --telemetry "$OUT/telemetry-steady.jsonl" --ckpt-every 100000 --eval-every 100000 --stall-every 100000 &
train=$!
sleep 10
: > "$OUT/windows.txt"
on=1
while kill -0 "$train" 2>/dev/null; do
  s=$(date +%s.%N)
  if [ $on = 1 ]; then
    "$BIN" watch-record --seconds "$WINDOW_S" --out "$OUT/record-$s.jsonl" 2>>"$OUT/watch-record.log" || true
  else
    sleep "$WINDOW_S"
  fi
  echo "$on $s $(date +%s.%N)" >> "$OUT/windows.txt"
  on=$((1 - on))
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
out = sys.argv[1]
steps = [json.loads(l) for l in open(f"{out}/steps-overhead.jsonl")]
wins = [l.split() for l in open(f"{out}/windows.txt")]
by = {"1": [], "0": []}
pairs = []
for on, a, b in wins:
    ms = [s["ms"] for s in steps if float(a) + 1 <= s["t"] <= float(b) - 0.5]
    if len(ms) > 20:
        by[on].append(statistics.median(ms))
for on, meds in by.items():
    print(f"watch {'on ' if on == '1' else 'off'}: window medians {[round(m, 3) for m in meds]} ms")
if by["1"] and by["0"]:
    a, b = statistics.median(by["1"]), statistics.median(by["0"])
    print(f"step time with the watch {a:.3f} ms, without {b:.3f} ms: {100 * (a - b) / b:+.2f}%")
PY
cat "$OUT/watch-record.log"
# One archive of the figures (a GPU machine may return only a few files).
tar -czf "$OUT/watch-gpu.tgz" -C "$OUT" --exclude agent-work --exclude watch-gpu.tgz . 2>/dev/null || true
exit $rc
