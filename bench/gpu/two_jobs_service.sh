#!/usr/bin/env bash
# Two jobs on the one GPU of a node, through the real service: a Kafka broker from the bundle of
# scripts/service-bundle.sh (a machine without Java), `gpusanity serve` on a SQLite file
# (bench/serve_lib.sh), one `gpusanity agent` for this node, and two JobResourcesAllocated
# events for two jobs on this node published at the same moment by Kafka's console producer,
# both naming the same GPU (`gpu_ids`, docs/events.md). The later run must wait for the
# earlier one's GPU ("waiting for the GPUs of node ..."), start once it ended ("its GPUs are
# free: started"), and both pass (docs/service.md, "Shared nodes").
#
#   bench/gpu/two_jobs_service.sh BINARY BUNDLE_DIR OUT_DIR [--device cuda|cpu] [--gpu-ids same|disjoint|none]
#
# BUNDLE_DIR: the unpacked bundle (tar -xJf service-bundle.tar.xz -C BUNDLE_DIR): its
# jre/bin/java runs the broker and the console clients, its kafka/ is the jar cache.
# --device: the agent's (default cuda; cpu: CPU workers, test rigs). --gpu-ids: `same` (default)
# both jobs name GPU "0"; `none` both name no GPU (whole-node jobs, which queue too);
# `disjoint` "0" and "1", which run side by side (needs 2 GPUs on cuda, else skipped).
# Each run's check: the quick check's tests and limits (`gpusanity check --quick`) unless
# CHECK_ARGS gives other SanityCheckArgs. WAIT_S (default 600): how long to wait for both ends.
# NODE: the node's name (default `uname -n`).
#
# Prints each run (job, verdict, created, started, finished, its transitions) and a summary;
# OUT_DIR keeps serve.log, agent.log, kafka.log, producer.log, events.txt, check-events.jsonl,
# runs.json, summary.json, the database, and per job JOB/run.json (the run and its transitions)
# and JOB/report.json; the agent's work dir is OUT_DIR/agent-work. Exit 0 only if both runs
# passed and (same, none) the later one waited and they did not overlap in time.
set -euo pipefail
usage() { sed -n '10p' "$0" | sed 's/^#   //' >&2; exit 2; }
[ $# -ge 3 ] || usage
BIN=$1 BUNDLE=$2 OUT=$3
shift 3
DEVICE=cuda MODE=same
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=${2:-}; shift 2 ;;
    --device=*) DEVICE=${1#*=}; shift ;;
    --gpu-ids) MODE=${2:-}; shift 2 ;;
    --gpu-ids=*) MODE=${1#*=}; shift ;;
    *) usage ;;
  esac
done
case "$DEVICE" in cuda | cpu) ;; *) echo "--device: cuda or cpu" >&2; exit 2 ;; esac
case "$MODE" in same | disjoint | none) ;; *) echo "--gpu-ids: same, disjoint or none" >&2; exit 2 ;; esac
# The quick check (src/slurm.rs QUICK): its tests, 30 s per test, 45 s in all.
CHECK_ARGS=${CHECK_ARGS:---micro-benchmarks=gpu-health,gemm,kernel-launch,memory-bandwidth --sanity-check-timeout-per-test=0.5 --sanity-check-max-time=0.75}
WAIT_S=${WAIT_S:-600}
NODE=${NODE:-$(uname -n)}

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
BUNDLE=$(cd "$BUNDLE" && pwd)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"
[ -x "$BIN" ] || { echo "not an executable: $BIN" >&2; exit 2; }
[ -x "$BUNDLE/jre/bin/java" ] && [ -f "$BUNDLE/kafka/.complete" ] \
  || { echo "$BUNDLE: no jre/bin/java or kafka/.complete (unpack scripts/service-bundle.sh's archive there)" >&2; exit 2; }
# The bundle's Java and jars, whatever else this machine has; the broker of its own.
export JAVA=$BUNDLE/jre/bin/java GPUSANITY_KAFKA_CACHE=$BUNDLE/kafka GPUSANITY_BIN=$BIN
export PATH=$BUNDLE/jre/bin:$PATH GPUSANITY_LOG=${GPUSANITY_LOG:-info}
unset GPUSANITY_TEST_KAFKA JAVA_HOME
"$JAVA" -version >/dev/null 2>&1 || { echo "$JAVA does not run here:" >&2; "$JAVA" -version >&2; exit 2; }

if [ "$DEVICE" = cuda ]; then
  # The CUDA libraries of PyTorch's pip packages (env.sh is not written for set -eu).
  set +eu
  # shellcheck source=bench/gpu/env.sh
  . "$ROOT/bench/gpu/env.sh"
  set -eu
  gpus=$( (nvidia-smi -L 2>/dev/null || true) | grep -c '^GPU' || true)
  if [ "$MODE" = disjoint ] && [ "$gpus" -lt 2 ]; then
    echo "skipped: --gpu-ids disjoint needs 2 GPUs, this machine has $gpus"
    exit 0
  fi
fi

rm -rf "${OUT:?}/agent-work" "$OUT"/two-jobs-*
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
echo "binary: $BIN ($("$BIN" --version 2>/dev/null | head -n 1 || echo '?'))"
echo "java: $("$JAVA" -version 2>&1 | head -n 1) from $BUNDLE/jre"
[ "$DEVICE" != cuda ] || nvidia-smi --query-gpu=index,name,uuid,pci.bus_id --format=csv,noheader 2>/dev/null || true
echo "device $DEVICE, gpu_ids $MODE, node $NODE, SanityCheckArgs: $CHECK_ARGS"

# shellcheck source=bench/serve_lib.sh
. bench/serve_lib.sh
agent_pid='' kafka_boot='' topic_prefix=''
finish() {
  local rc=$?
  set +e
  if [ -n "$agent_pid" ]; then
    kill "$agent_pid" 2>/dev/null
    for _ in $(seq 150); do kill -0 "$agent_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$agent_pid" 2>/dev/null
    wait "$agent_pid" 2>/dev/null
  fi
  if [ -n "$kafka_boot" ] && [ -f "$state/kafka" ]; then
    # The output events as the platform reads them (and the dead letters, if any).
    "$JAVA" -cp "$BUNDLE/kafka/libs/*" org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$kafka_boot" \
      --topic "${topic_prefix}check-events" --from-beginning --timeout-ms 4000 >"$OUT/check-events.jsonl" 2>/dev/null
    "$JAVA" -cp "$BUNDLE/kafka/libs/*" org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$kafka_boot" \
      --topic "${topic_prefix}dead-letter" --from-beginning --timeout-ms 2000 >"$OUT/dead-letters.jsonl" 2>/dev/null
    [ -s "$OUT/dead-letters.jsonl" ] || rm -f "$OUT/dead-letters.jsonl"
    cp "$(sed -n 's/^dir=//p' "$state/kafka")/kafka.log" "$OUT/kafka.log" 2>/dev/null
  fi
  serve_stop "$state"
  cp "$state/serve.log" "$OUT/serve.log" 2>/dev/null
  cp "$state/gpusanity.db" "$OUT/gpusanity.db" 2>/dev/null
  rm -rf "$state"
  exit "$rc"
}
state=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-two-jobs.XXXXXX")
trap finish EXIT
trap 'exit 130' INT TERM
# The agent key file, here rather than by openssl (serve_lib.sh keeps one that is there).
python3 -c 'import secrets; print("[[key]]\nid = \"bench\"\nsecret = \"%s\"" % secrets.token_hex(32))' >"$state/agent-keys.toml"

t0=$(date +%s)
serve_sqlite "$state" "$state/gpusanity.db"
serve_healthy || { echo "the service did not answer /health; its log:" >&2; tail -20 "$state/serve.log" >&2; exit 1; }
echo "broker $kafka_boot and the service on port $port up in $(($(date +%s) - t0)) s"

agent_args=(agent --node "$NODE" --config "$state/gpusanity.toml" --agent-keys "$state/agent-keys.toml"
  --device "$DEVICE" --work-dir "$OUT/agent-work" --heartbeat-s 1)
[ "$DEVICE" = cpu ] && agent_args+=(--nproc-per-node 1)
"$BIN" "${agent_args[@]}" >"$OUT/agent.log" 2>&1 &
agent_pid=$!
# The service hears the agent (gpusanity_agents_live) before the jobs come.
python3 - "$port" "$token" "$agent_pid" <<'PY' || { echo "the agent was not heard within 60 s; its log:" >&2; tail -20 "$OUT/agent.log" >&2; exit 1; }
import os, sys, time, urllib.request
port, token, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"})
end = time.time() + 60
while time.time() < end:
    os.kill(pid, 0)
    try:
        for line in urllib.request.urlopen(req, timeout=5).read().decode().splitlines():
            if line.startswith("gpusanity_agents_live ") and float(line.split()[1]) >= 1:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.3)
sys.exit(1)
PY
echo "agent for node $NODE heard ($DEVICE)"

# The two events, keyed by job id, in one producer call: the same moment.
python3 - "$NODE" "$MODE" "$CHECK_ARGS" "$topic_prefix" >"$OUT/events.txt" <<'PY'
import datetime, json, sys
node, mode, args, prefix = sys.argv[1:5]
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
ids = {"same": [["0"], ["0"]], "disjoint": [["0"], ["1"]], "none": [None, None]}[mode]
for k, gpu_ids in enumerate(ids, 1):
    entry = {"name": node, "address": "127.0.0.1", "gpus": 1}
    if gpu_ids is not None:
        entry["gpu_ids"] = gpu_ids
    job = f"two-jobs-{k}"
    ev = {"version": 1, "type": "JobResourcesAllocated", "event_id": f"{prefix}ev-{k}", "job_id": job,
          "workspace_id": "bench", "occurred_at": now, "attempt": 0, "framework": "PyTorch", "nodes": [entry],
          "settings": {"EnableSanityCheck": True, "SanityCheckArgs": args}}
    print(f"{job}\t{json.dumps(ev)}")
PY
"$JAVA" -cp "$BUNDLE/kafka/libs/*" org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$kafka_boot" \
  --topic "${topic_prefix}job-events" --reader-property parse.key=true --reader-property key.separator=$'\t' \
  <"$OUT/events.txt" >"$OUT/producer.log" 2>&1 \
  || { echo "the console producer failed; its log:" >&2; tail -20 "$OUT/producer.log" >&2; exit 1; }
echo "published two JobResourcesAllocated (two-jobs-1, two-jobs-2) on node $NODE"

# The runs, from the service's HTTP API, until both ended; then the record and the verdict.
python3 - "$port" "$token" "$OUT" "$WAIT_S" "$MODE" <<'PY'
import datetime, json, os, sys, time, urllib.error, urllib.request
port, token, out, wait_s, mode = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
jobs = ["two-jobs-1", "two-jobs-2"]
ENDED = {"CheckPassed", "CheckFailed", "CheckCancelled"}

def get(path):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)

def at(ms):
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.timezone.utc).strftime("%H:%M:%S.%f")[:-3]

start, seen, runs = time.time(), {}, {}
while True:
    runs = {r["job_id"]: r for r in get("/v1/runs?workspace=bench&per_page=100")["runs"]}
    for j in jobs:
        s = runs[j]["state"] if j in runs else "-"
        if seen.get(j) != s:
            seen[j] = s
            print(f"  {time.time() - start:6.1f} s  {j}: {s}", flush=True)
    if all(j in runs and runs[j]["state"] in ENDED for j in jobs):
        break
    if time.time() - start > wait_s:
        print(f"both runs had not ended within {wait_s:.0f} s: {seen}")
        break
    time.sleep(0.3)

with open(os.path.join(out, "runs.json"), "w") as f:
    json.dump(get("/v1/runs?workspace=bench&per_page=100"), f, indent=2)
rec = {}
for j in jobs:
    if j not in runs:
        print(f"{j}: no run")
        continue
    d = get(f"/v1/runs/{runs[j]['run_id']}")
    os.makedirs(os.path.join(out, j), exist_ok=True)
    with open(os.path.join(out, j, "run.json"), "w") as f:
        json.dump(d, f, indent=2)
    report = None
    try:
        report = get(f"/v1/runs/{runs[j]['run_id']}/report")
        with open(os.path.join(out, j, "report.json"), "w") as f:
            json.dump(report, f, indent=2)
    except urllib.error.HTTPError as e:
        print(f"{j}: no report ({e.code})")
    run, ts = d["run"], d["transitions"]
    waited = next((t for t in ts if t["detail"].startswith("waiting for the GPUs of node")), None)
    freed = next((t for t in ts if "GPUs are free" in t["detail"]), None)
    # A run that did not wait starts at its creation (its first task goes out then).
    rec[j] = {"run_id": run["run_id"], "state": run["state"], "created_at": run["created_at"],
              "started_at": freed["at_ms"] if freed else run["created_at"], "finished_at": run["finished_at"],
              "waited": waited is not None, "summary": run["summary"],
              "report_status": report.get("status") if report else None,
              "gpus_checked": [h.get("readings", {}).get("gpus") for h in report.get("hosts", [])] if report else None,
              "transitions": [(t["at_ms"], t["state"], t["detail"]) for t in ts]}
    r = rec[j]
    fin = at(r["finished_at"]) if r["finished_at"] else "-"
    took = f"{(r['finished_at'] - r['started_at']) / 1000:.2f} s" if r["finished_at"] else "-"
    print(f"== {j} (run {r['run_id']}): {r['state']}")
    print(f"   created {at(r['created_at'])}  started {at(r['started_at'])}"
          f"{' (after waiting %.2f s)' % ((r['started_at'] - r['created_at']) / 1000) if freed else ''}"
          f"  finished {fin}  (check {took})")
    print(f"   report: {r['report_status']}, GPUs checked {r['gpus_checked']}: {r['summary'][:300]}")
    for ms, st, detail in r["transitions"]:
        print(f"   {at(ms)}  {st:<14} {detail[:300]}")

ok, why = True, []
states = {j: rec[j]["state"] if j in rec else "no run (a dead letter? see dead-letters.jsonl)" for j in jobs}
if any(s != "CheckPassed" for s in states.values()):
    ok = False
    why.append("not both passed: " + ", ".join(f"{j} {s}" for j, s in states.items()))
overlap = None
if len(rec) == 2 and all(r["finished_at"] for r in rec.values()):
    a, b = sorted(rec.values(), key=lambda r: r["started_at"])
    overlap = (min(a["finished_at"], b["finished_at"]) - b["started_at"]) / 1000
    if mode == "disjoint":
        line = f"they overlapped {overlap:.2f} s (disjoint GPUs: side by side)" if overlap > 0 else \
            f"they did not overlap ({-overlap:.2f} s apart) although their GPUs are disjoint"
        if any(r["waited"] for r in rec.values()):
            ok = False
            why.append("a run on disjoint GPUs waited")
    else:
        line = (f"no overlap: {b['run_id'][:8]} started {-overlap:.3f} s after {a['run_id'][:8]} finished"
                if overlap <= 0 else f"OVERLAP of {overlap:.3f} s")
        if overlap > 0:
            ok = False
            why.append("the runs overlapped")
        if not b["waited"]:
            ok = False
            why.append("the later run did not wait for the GPUs")
    print("timing:", line)
elif ok:
    ok = False
    why.append("a run has no end time")
summary = {"mode": mode, "passed": ok, "why_not": why, "overlap_s": overlap, "runs": rec}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
print("RESULT:", "PASS" if ok else "FAIL: " + "; ".join(why),
      "|", ", ".join(f"{j} {states[j]}{' (waited)' if j in rec and rec[j]['waited'] else ''}" for j in jobs))
sys.exit(0 if ok else 1)
PY
