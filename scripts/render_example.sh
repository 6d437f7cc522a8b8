#!/usr/bin/env bash
# Regenerates docs/examples/report-cpu.html (and the report.json it comes from): a real CPU run
# of all eleven checks on three single-worker nodes on loopback (so the link test runs too),
# with rank 1's gemm slowed by the fault hook (GPUSANITY_FAULT=gemm-slow@1) so that the page
# shows a faulty node. Then renders the page again with `gpusanity report` and checks that it
# is byte-identical, and prints the page's size and the render time.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet
BIN=$PWD/target/release/gpusanity
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for node in 2 1 0; do
  "$BIN" check --device cpu --report-dir "$work/report" \
    --micro-benchmarks=gemm,kernel-launch,all-reduce,all-to-all,all-gather,multi-all-reduce,network-connectivity,matmul-all-reduce-overlap \
    --model-benchmarks=mini-gpt,megatron-gpt,resnet \
    --test-faults --sanity-check-envs=GPUSANITY_FAULT=gemm-slow@1 --check-param diagnosis.slow-fraction=0.8 \
    --nnodes 3 --node-rank "$node" --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$port" \
    > "$work/node$node.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || true; done
test -s "$work/report/report.json" || { cat "$work"/node*.log >&2; exit 1; }
head -2 "$work/node0.log"
mkdir -p docs/examples
cp "$work/report/report.json" docs/examples/report-cpu.json
cp "$work/report/report.html" docs/examples/report-cpu.html
s=$(date +%s%N)
"$BIN" report docs/examples/report-cpu.json -o "$work/again.html" > /dev/null
e=$(date +%s%N)
cmp docs/examples/report-cpu.html "$work/again.html"
echo "docs/examples/report-cpu.html: $(wc -c < docs/examples/report-cpu.html) bytes, $(grep -o '<svg' docs/examples/report-cpu.html | wc -l) charts;" \
  "\`gpusanity report\` renders it again byte-identical in $(( (e - s) / 1000000 )) ms ($(nproc) cores, $(date -u +%Y-%m-%d))"
# The GPU examples: report.json files of real runs on 2 x H200 (bench/gpu/gemm_expected.sh and a
# gemm-wrong fault in the same call), rendered again here.
for name in report-full-h200x2 report-gemm-wrong-h200x2; do
  "$BIN" report "docs/gpu-runs/2026-11-30-$name.json" -o "docs/examples/$name.html" > /dev/null
  echo "docs/examples/$name.html: $(wc -c < "docs/examples/$name.html") bytes, $(grep -o '<svg' "docs/examples/$name.html" | wc -l) charts"
done
