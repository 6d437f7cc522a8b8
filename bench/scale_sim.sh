#!/usr/bin/env bash
# The control plane of a run of N ranks (bench/scale_sim.rs): node 0's real store, launcher,
# diagnosis, report.json and HTML in one process, every other launcher and rank as async
# clients of the real protocol in another. Prints per phase the wall time and node 0's peak RSS.
#   bench/scale_sim.sh [RANKS...]      (default 1024 4096 16384; GPUS_PER_NODE=8)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --example scale_sim
echo "# $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, open files $(ulimit -Hn)"
exec target/release/examples/scale_sim "$@"
