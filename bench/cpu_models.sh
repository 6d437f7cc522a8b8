#!/usr/bin/env bash
# Wall time of each model check (mini-gpt, megatron-gpt, resnet) on this machine's CPU workers
# (2 by default), from command start to exit, with the release binary and the default CPU
# sizes; budget 60 s each. Prints each run, the check's own figures and the slowest run.
set -eu
cd "$(dirname "$0")/.."
NPROC=${NPROC:-2}
cargo build --release --quiet
BIN=target/release/gpusanity
out=$(mktemp -d)
worst=0
for m in mini-gpt megatron-gpt resnet; do
  s=$(date +%s%N)
  "$BIN" check --device cpu --nproc-per-node "$NPROC" --micro-benchmarks= --model-benchmarks "$m" --report-dir "$out/$m" > /dev/null
  e=$(date +%s%N)
  ms=$(( (e - s) / 1000000 ))
  [ "$ms" -gt "$worst" ] && worst=$ms
  python3 - "$out/$m/report.json" "$m" "$ms" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
c = r["checks"][0]
k = c["ranks"][0]
m = k["metrics"]
thr = m.get("tokens_per_s") or m.get("images_per_s")
print("%s: wall %s ms, %s, step %.1f ms, %.0f %s/s per rank, loss %.3f -> %.3f, %s"
      % (sys.argv[2], sys.argv[3], c["status"], m["step_ms_median"], thr,
         "tokens" if "tokens_per_s" in m else "images", m["loss_first"], m["loss_final"], k["notes"]["layout"]))
PY
done
echo "slowest: ${worst} ms ($NPROC workers, $(nproc) cores, $(date -u +%Y-%m-%d))"
rm -rf "$out"
