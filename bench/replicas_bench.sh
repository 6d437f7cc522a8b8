#!/usr/bin/env bash
# Ingest of job events needing no check with 1, 2 and 3 replicas of `gpusanity serve` on one
# PostgreSQL and a 6-partition topic (docs/benchmarks.md, "Replicas"). Uses GPUSANITY_TEST_KAFKA
# and GPUSANITY_TEST_POSTGRES (an admin URL) when set, else starts a broker and a server here.
#   EVENTS=20000 REPLICAS=3 bench/replicas_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --example replicas_bench
cargo build --release --quiet
# shellcheck source=bench/backing.sh
. bench/backing.sh
echo "$(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), broker $boot"
target/release/examples/replicas_bench "$boot" target/release/gpusanity "$db" "${EVENTS:-20000}" "${REPLICAS:-3}"
