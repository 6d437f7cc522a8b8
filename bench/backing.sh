# Sourced (from the repository's root) by the service benchmarks: a Kafka broker and a PostgreSQL
# server, the ones GPUSANITY_TEST_KAFKA and GPUSANITY_TEST_POSTGRES (an admin URL) name, else
# started here and stopped on exit (with an API server a benchmark started under "$state/kube").
# Sets $state (a temp folder), $boot and $db.
state=$(mktemp -d)
chmod 755 "$state"
backing_cleanup() {
  KAFKA_STATE="$state/kafka" bash scripts/kafka.sh stop 2>/dev/null || true
  PG_STATE="$state/pg" bash scripts/postgres.sh stop 2>/dev/null || true
  KUBE_STATE="$state/kube" bash scripts/kube-apiserver.sh stop 2>/dev/null || true
  rm -rf "$state"
}
trap backing_cleanup EXIT
boot=${GPUSANITY_TEST_KAFKA:-}
if [ -z "$boot" ]; then
  boot=$(KAFKA_STATE="$state/kafka" TMPDIR="$state" bash scripts/kafka.sh start | sed -n 's/^KAFKA_BOOTSTRAP=//p')
fi
db=${GPUSANITY_TEST_POSTGRES:-}
if [ -z "$db" ]; then
  db=$(PG_STATE="$state/pg" TMPDIR="$state" bash scripts/postgres.sh start | sed -n 's/^DATABASE_URL=//p')
fi
