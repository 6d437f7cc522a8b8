#!/usr/bin/env bash
# Wall time of the whole micro-benchmark suite (8 checks) on this machine's CPU workers, from
# command start to exit, over N runs (default 5) each of: one node with 2 workers, and 2 nodes of
# 1 worker on loopback. Prints each run and the medians. Goal: <= 60 s.
set -eu
cd "$(dirname "$0")/.."
N=${N:-5}
cargo build --release --quiet
BIN=target/release/gpusanity
SUITE=gemm,kernel-launch,all-reduce,all-to-all,all-gather,multi-all-reduce,network-connectivity,matmul-all-reduce-overlap
out=$(mktemp -d)
ms() { echo $(( ($2 - $1) / 1000000 )); }
one=(); two=()
for i in $(seq "$N"); do
  s=$(date +%s%N)
  "$BIN" check --device cpu --micro-benchmarks "$SUITE" --report-dir "$out/one$i" > "$out/one$i.txt" || echo "run $i (one node): exit $?"
  e=$(date +%s%N); one+=("$(ms "$s" "$e")")
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  s=$(date +%s%N)
  "$BIN" check --device cpu --micro-benchmarks "$SUITE" --nnodes 2 --node-rank 1 --nproc-per-node 1 \
    --master-addr 127.0.0.1 --master-port "$port" --report-dir "$out/two$i-1" > /dev/null &
  n1=$!
  "$BIN" check --device cpu --micro-benchmarks "$SUITE" --nnodes 2 --node-rank 0 --nproc-per-node 1 \
    --master-addr 127.0.0.1 --master-port "$port" --report-dir "$out/two$i" > "$out/two$i.txt" || echo "run $i (two nodes): exit $?"
  wait "$n1" || true
  e=$(date +%s%N); two+=("$(ms "$s" "$e")")
  echo "run $i: one node x 2 workers ${one[-1]} ms, two nodes x 1 worker ${two[-1]} ms"
done
med() { printf '%s\n' "$@" | sort -n | sed -n "$(( ($# + 1) / 2 ))p"; }
echo "median: one node $(med "${one[@]}") ms, two nodes $(med "${two[@]}") ms over $N runs ($(nproc) cores, $(date -u +%Y-%m-%d))"
python3 - "$out/one$N/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for c in r["checks"]:
    print("%-26s %-15s %.2f s" % (c["name"], c["status"], c["duration_s"]))
PY
rm -rf "$out"
