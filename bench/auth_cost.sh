#!/usr/bin/env bash
# The cost of the authentication: per-message sealing and opening of the agent protocol
# (bench/auth_cost.rs), and `gpusanity check` on two loopback nodes (CPU, default checks) with
# and without a rendezvous secret, alternated in one run so that the machine's noise hits both.
#   RUNS=8 bench/auth_cost.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --example auth_cost
cargo build --release --quiet
echo "$(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ)"
target/release/examples/auth_cost
bin=target/release/gpusanity
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
two_nodes() { # prints the wall time in ms of one two-node check on loopback
  local port=$((20000 + RANDOM % 40000)) s e
  s=$(date +%s%N)
  "$bin" check --device cpu --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port "$port" \
    --nproc-per-node 1 --report-dir "$dir/r1" > "$dir/n1.log" 2>&1 &
  local n1=$!
  "$bin" check --device cpu --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" \
    --nproc-per-node 1 --report-dir "$dir/r0" > "$dir/n0.log" 2>&1
  wait "$n1"
  e=$(date +%s%N)
  echo $(( (e - s) / 1000000 ))
}
off=(); on=()
for _ in $(seq "${RUNS:-8}"); do
  off+=("$(unset GPUSANITY_RDZV_SECRET; two_nodes)")
  on+=("$(GPUSANITY_RDZV_SECRET=bench-secret-0123456789abcdef two_nodes)")
done
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
echo "two-node check wall, ms: without secret ${off[*]} (median $(median "${off[@]}")); with ${on[*]} (median $(median "${on[@]}"))"
