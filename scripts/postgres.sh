#!/usr/bin/env bash
# A throwaway PostgreSQL cluster for tests and trials, on loopback, in a temp dir.
#
#   scripts/postgres.sh start [PORT]   initdb + start; prints
#                                      "DATABASE_URL=postgres://gpusanity@127.0.0.1:PORT/postgres"
#   scripts/postgres.sh stop           stop it (pg_ctl stop) and remove its folder
#   scripts/postgres.sh halt           stop the server, keeping its data (an outage, for tests)
#   scripts/postgres.sh resume         start the halted server again on the same port
#
# Uses Debian's server (/usr/lib/postgresql/*/bin, `apt-get install postgresql`). As root the
# cluster runs as the `postgres` user. State file: $PG_STATE (default $TMPDIR/gpusanity-pg.state).
# PG_TLS=1: the server takes TLS connections only (ssl=on, `hostssl` alone in pg_hba.conf) with
# a throwaway CA and server certificate for 127.0.0.1 and localhost (scripts/tls-certs.sh,
# openssl); `start` prints a URL with "?sslmode=verify-full&sslrootcert=CA" and "PG_CA=CA".
set -euo pipefail
STATE=${PG_STATE:-${TMPDIR:-/tmp}/gpusanity-pg.state}
BIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
# shellcheck source=scripts/ports.sh
. "$(dirname "$0")/ports.sh"
[ -n "$BIN" ] || { echo "no PostgreSQL server under /usr/lib/postgresql: apt-get install -y postgresql" >&2; exit 1; }

as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() {
  local port=${1:-$(free_port)}
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-pg.XXXXXX")
  chmod 755 "$dir"
  [ "$(id -u)" = 0 ] && chown postgres "$dir"
  as_owner "$BIN/initdb" -D "$dir/data" -U gpusanity -A trust -E UTF8 >"$dir/initdb.log" 2>&1 \
    || { cat "$dir/initdb.log" >&2; exit 1; }
  local opts="-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200"
  local query=
  if [ -n "${PG_TLS:-}" ] && [ "${PG_TLS:-}" != 0 ]; then
    bash "$(dirname "$0")/tls-certs.sh" "$dir/tls"
    [ "$(id -u)" = 0 ] && chown -R postgres "$dir/tls"
    # The socket for local administration; over TCP, TLS or nothing.
    printf 'local all all trust\nhostssl all all 127.0.0.1/32 trust\n' >"$dir/data/pg_hba.conf"
    opts="$opts -c ssl=on -c ssl_cert_file=$dir/tls/server.pem -c ssl_key_file=$dir/tls/server.key"
    query="?sslmode=verify-full&sslrootcert=$dir/tls/ca.pem"
  fi
  as_owner "$BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$opts" start >/dev/null \
    || { cat "$dir/server.log" >&2; exit 1; }
  printf 'dir=%s\nport=%s\nopts=%s\n' "$dir" "$port" "$opts" >"$STATE"
  echo "DATABASE_URL=postgres://gpusanity@127.0.0.1:$port/postgres$query"
  [ -z "$query" ] || echo "PG_CA=$dir/tls/ca.pem"
}

stop() {
  [ -f "$STATE" ] || { echo "no state file $STATE" >&2; exit 1; }
  local dir
  dir=$(sed -n 's/^dir=//p' "$STATE")
  as_owner "$BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$dir" "$STATE"
}

halt() {
  [ -f "$STATE" ] || { echo "no state file $STATE" >&2; exit 1; }
  local dir
  dir=$(sed -n 's/^dir=//p' "$STATE")
  as_owner "$BIN/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null
}

resume() {
  [ -f "$STATE" ] || { echo "no state file $STATE" >&2; exit 1; }
  local dir opts
  dir=$(sed -n 's/^dir=//p' "$STATE")
  opts=$(sed -n 's/^opts=//p' "$STATE")
  as_owner "$BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -o "$opts" start >/dev/null \
    || { tail -20 "$dir/server.log" >&2; exit 1; }
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  halt) halt ;;
  resume) resume ;;
  *) echo "usage: $0 start [PORT]|stop|halt|resume" >&2; exit 2 ;;
esac
