#!/usr/bin/env bash
# Time from a NodeIsolated event on the output topic to gpusanity's taint visible on the Node,
# with 1 and 3 replicas of `gpusanity serve` on PostgreSQL (docs/benchmarks/kubernetes.md). Uses
# GPUSANITY_TEST_KAFKA, GPUSANITY_TEST_POSTGRES (an admin URL) and GPUSANITY_TEST_KUBECONFIG when
# set, else starts a broker, a database server and an API server (scripts/kube-apiserver.sh) here.
#   ISOLATIONS=50 bench/kube_isolation.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --quiet --example kube_isolation
cargo build --release --quiet
# shellcheck source=bench/backing.sh
. bench/backing.sh
kubeconfig=${GPUSANITY_TEST_KUBECONFIG:-}
if [ -z "$kubeconfig" ]; then
  kubeconfig=$(KUBE_STATE="$state/kube" TMPDIR="$state" bash scripts/kube-apiserver.sh start | sed -n 's/^KUBECONFIG=//p')
fi
echo "$(nproc) cores, $(date -u +%Y-%m-%dT%H:%MZ), broker $boot"
target/release/examples/kube_isolation "$boot" target/release/gpusanity "$db" "$kubeconfig" "${ISOLATIONS:-50}"
