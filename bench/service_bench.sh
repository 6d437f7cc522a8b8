#!/usr/bin/env bash
# The service's figures: ingest throughput of job events needing no check, and latency from a
# job event to Checking and from the last agent result to CheckPassed (p50/p99), against a real
# Kafka broker (GPUSANITY_TEST_KAFKA, else one started here) with SQLite.
#   EVENTS=20000 RUNS=40 bench/service_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --example service_bench
cargo build --release --quiet
boot=${GPUSANITY_TEST_KAFKA:-}
if [ -z "$boot" ]; then
  state=$(mktemp -d)
  trap 'KAFKA_STATE="$state/kafka" bash scripts/kafka.sh stop; rm -rf "$state"' EXIT
  boot=$(KAFKA_STATE="$state/kafka" TMPDIR="$state" bash scripts/kafka.sh start | sed -n 's/^KAFKA_BOOTSTRAP=//p')
fi
echo "$(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), broker $boot"
target/release/examples/service_bench "$boot" target/release/gpusanity "${EVENTS:-20000}" "${RUNS:-40}"
