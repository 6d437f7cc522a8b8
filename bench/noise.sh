#!/usr/bin/env bash
# False findings on a loaded machine: RUNS runs (default 20) of NODES loopback nodes (default 8,
# one CPU worker each) with HOGS busy loops (default: one per core) running beside them.
# Prints each run's exit codes and findings, then the count of runs with any finding; the goal
# is 0 (docs/benchmarks.md).
set -eu
cd "$(dirname "$0")/.."
RUNS=${RUNS:-20}
NODES=${NODES:-8}
HOGS=${HOGS:-$(nproc)}
CHECKS=${CHECKS:-gemm,all-reduce,network-connectivity}
[ -n "${NO_BUILD:-}" ] || cargo build --release --quiet
hogs=()
for _ in $(seq "$HOGS"); do
  sh -c 'while :; do :; done' &
  hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null || true' EXIT
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $HOGS busy loops beside $NODES nodes, checks $CHECKS"
bad=0
for i in $(seq "$RUNS"); do
  line=$(NO_BUILD=1 NODES=$NODES CHECKS=$CHECKS bash bench/scale.sh | tail -1)
  echo "run $i: $line"
  case "$line" in
    *" none") ;;
    *) bad=$((bad + 1)) ;;
  esac
done
echo "runs with a finding: $bad of $RUNS"
