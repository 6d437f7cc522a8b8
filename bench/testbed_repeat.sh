#!/usr/bin/env bash
# Repeatability of the multi-node test bed (tests/testbed/, three network namespaces, needs
# root): the clean scenario 20 times and each fault 5 times, then the two scenarios through the
# service (serve on the host, an agent per namespace; needs Java for Kafka) 5 times each;
# prints per scenario the runs, found, missed, false findings (findings naming another node;
# for the clean scenario any finding), runs that left a process behind, and the mean wall time
# (through the service: from the allocation, or the kill, to the verdict). 0 skips a group.
# Usage: bash bench/testbed_repeat.sh [CLEAN_RUNS] [FAULT_RUNS] [SERVICE_RUNS]
set -euo pipefail
cd "$(dirname "$0")/.."
export TESTBED_CLEAN_RUNS=${1:-20} TESTBED_FAULT_RUNS=${2:-5} TESTBED_SERVICE_RUNS=${3:-5}
nproc | sed 's/^/cores: /'
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
cargo test --release --test testbed testbed_repeat -- --ignored --nocapture 2>&1 | grep --line-buffered -v '^running\|^test \|^$'
