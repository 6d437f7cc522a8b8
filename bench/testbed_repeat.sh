#!/usr/bin/env bash
# Repeatability of the multi-node test bed (tests/testbed.rs, three network namespaces, needs
# root): the clean scenario 20 times and each fault 5 times; prints per scenario the runs,
# found, missed, false findings (findings naming another node; for the clean scenario any
# finding), runs that left a process behind, and the mean wall time.
# Usage: bash bench/testbed_repeat.sh [CLEAN_RUNS] [FAULT_RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
export TESTBED_CLEAN_RUNS=${1:-20} TESTBED_FAULT_RUNS=${2:-5}
nproc | sed 's/^/cores: /'
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
cargo test --release --test testbed testbed_repeat -- --ignored --nocapture 2>&1 | grep --line-buffered -v '^running\|^test \|^$'
