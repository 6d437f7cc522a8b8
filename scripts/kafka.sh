#!/usr/bin/env bash
# A local Apache Kafka for users and tests: one KRaft broker+controller on loopback.
#
#   scripts/kafka.sh fetch            download Kafka 4.4.0 and its runtime jars (Maven, once)
#   scripts/kafka.sh halt             stop the broker, keeping its log dir (an outage, for tests)
#   scripts/kafka.sh resume           start the halted broker again from its log dir, same port
#   scripts/kafka.sh start [PORT]     format a fresh log dir in a temp dir and start the broker;
#                                     prints "KAFKA_BOOTSTRAP=127.0.0.1:PORT" when it accepts
#                                     connections; state (pid, dir) goes to $KAFKA_STATE
#   scripts/kafka.sh stop             stop the broker started by `start` (by its pid)
#
# Environment: GPUSANITY_KAFKA_CACHE (jar cache, default ~/.cache/gpusanity/kafka-4.4.0; `fetch`
# does nothing where it holds `.complete`, e.g. the kafka/ folder of scripts/service-bundle.sh),
# JAVA (the java to run, default `java` on PATH; e.g. the bundle's jre/bin/java),
# KAFKA_STATE (state file, default $TMPDIR/gpusanity-kafka.state), KAFKA_LISTEN=ADDR[:PORT]
# (a second listener on ADDR:PORT, advertised as such, PORT a free one if not given: for
# clients that cannot reach the host's loopback, e.g. network namespaces on a bridge whose
# host side has ADDR; ADDR must be an address of this host; `start` then also prints
# "KAFKA_EXTERNAL=ADDR:PORT"). Without it the broker listens on loopback alone.
# KAFKA_SASL_SSL=1: also a SASL_SSL listener on another loopback port, with a throwaway CA and
# server certificate (scripts/tls-certs.sh, openssl) and the SCRAM-SHA-512 and SCRAM-SHA-256
# user `gpusanity` (password KAFKA_SASL_PASSWORD, letters, digits, `._-`, else a random one);
# `start` then also prints "KAFKA_SASL_SSL=127.0.0.1:PORT", "KAFKA_CA=FILE" (the CA to trust),
# "KAFKA_SASL_USER=gpusanity" and "KAFKA_SASL_PASSWORD_FILE=FILE" (mode 0600). The controller
# and inter-broker listeners stay PLAINTEXT on loopback.
set -euo pipefail
VERSION=4.4.0
CACHE=${GPUSANITY_KAFKA_CACHE:-$HOME/.cache/gpusanity/kafka-$VERSION}
STATE=${KAFKA_STATE:-${TMPDIR:-/tmp}/gpusanity-kafka.state}
JAVA=${JAVA:-java}

fetch() {
  if [ -f "$CACHE/.complete" ]; then return 0; fi
  mkdir -p "$CACHE/libs"
  local pom
  pom=$(mktemp -d)
  cat >"$pom/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.gpusanity</groupId><artifactId>kafka-fetch</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-server</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka-tools</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j2-impl</artifactId><version>2.25.5</version></dependency>
  </dependencies>
</project>
POM
  (cd "$pom" && mvn -q -B dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$CACHE/libs")
  rm -rf "$pom"
  touch "$CACHE/.complete"
}

# shellcheck source=scripts/ports.sh
. "$(dirname "$0")/ports.sh"

start() {
  local ext=${KAFKA_LISTEN:-}
  if [ -n "$ext" ] && ! [[ "$ext" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+(:[0-9]+)?$ ]]; then
    echo "KAFKA_LISTEN=$ext: expected IPV4-ADDRESS[:PORT]" >&2
    exit 2
  fi
  local secure=${KAFKA_SASL_SSL:-}
  [ "$secure" = 0 ] && secure=
  local password=${KAFKA_SASL_PASSWORD:-}
  if [ -n "$password" ] && ! [[ "$password" =~ ^[A-Za-z0-9._-]+$ ]]; then
    echo "KAFKA_SASL_PASSWORD: letters, digits and ._- only" >&2
    exit 2
  fi
  fetch
  local port=${1:-$(free_port)}
  if [ -n "$ext" ] && [[ "$ext" != *:* ]]; then ext="$ext:$(free_port)"; fi
  local ctrl
  ctrl=$(free_port)
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-kafka.XXXXXX")
  local sport= scram=()
  if [ -n "$secure" ]; then
    sport=$(free_port)
    bash "$(dirname "$0")/tls-certs.sh" "$dir/tls"
    [ -n "$password" ] || password=$(openssl rand -hex 16)
    (umask 077 && printf '%s\n' "$password" >"$dir/tls/sasl-password")
    scram=(--add-scram "SCRAM-SHA-512=[name=gpusanity,password=$password]"
      --add-scram "SCRAM-SHA-256=[name=gpusanity,password=$password]")
  fi
  cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$ctrl
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$ctrl${ext:+,EXTERNAL://$ext}${sport:+,SASL_SSL://127.0.0.1:$sport}
advertised.listeners=PLAINTEXT://127.0.0.1:$port${ext:+,EXTERNAL://$ext}${sport:+,SASL_SSL://127.0.0.1:$sport}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,EXTERNAL:PLAINTEXT,SASL_SSL:SASL_SSL
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/logs
num.partitions=1
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
PROPS
  if [ -n "$secure" ]; then
    # PEM key store inline (Kafka takes an unencrypted key only this way), on one line each.
    cat >>"$dir/server.properties" <<PROPS
sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.ssl.keystore.type=PEM
listener.name.sasl_ssl.ssl.keystore.certificate.chain=$(tr '\n' ' ' <"$dir/tls/server.pem")
listener.name.sasl_ssl.ssl.keystore.key=$(tr '\n' ' ' <"$dir/tls/server.key")
PROPS
    chmod 600 "$dir/server.properties"
  fi
  cat >"$dir/log4j2.yaml" <<'LOG'
Configuration:
  Appenders:
    Console:
      name: STDOUT
      PatternLayout:
        pattern: "[%d] %p %m (%c)%n"
  Loggers:
    Root:
      level: WARN
      AppenderRef:
        - ref: STDOUT
LOG
  local cp="$CACHE/libs/*"
  local jopts=(-Xmx512m -XX:+UseSerialGC -Dlog4j2.configurationFile="$dir/log4j2.yaml")
  "$JAVA" "${jopts[@]}" -cp "$cp" org.apache.kafka.tools.StorageTool format -t "$("$JAVA" -cp "$cp" org.apache.kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)" \
    -c "$dir/server.properties" --standalone "${scram[@]}" >"$dir/format.log" 2>&1 \
    || "$JAVA" "${jopts[@]}" -cp "$cp" kafka.tools.StorageTool format -t "$("$JAVA" -cp "$cp" kafka.tools.StorageTool random-uuid | tail -1)" \
      -c "$dir/server.properties" "${scram[@]}" >"$dir/format.log" 2>&1
  nohup "$JAVA" "${jopts[@]}" -cp "$cp" kafka.Kafka "$dir/server.properties" >"$dir/kafka.log" 2>&1 &
  local pid=$!
  printf 'pid=%s\ndir=%s\nport=%s\n' "$pid" "$dir" "$port" >"$STATE"
  wait_listening "$pid" "$dir" "$port" "$ext" "$sport"
}

# start, again on fresh ports (up to three times) when the broker exits while starting and no
# port was asked for: its logger prints nothing, and a lost race for a port is the usual cause.
start_retrying() {
  local n rc
  for n in 1 2 3; do
    # Outside any && list, so that errexit holds inside start.
    set +e
    (
      set -e
      start "$@"
    )
    rc=$?
    set -e
    [ "$rc" = 0 ] && return 0
    if [ "$rc" != 3 ] || [ -n "${1:-}" ]; then exit "$rc"; fi
    echo "kafka exited while starting (attempt $n of 3)" >&2
  done
  exit 1
}

# Waits until the broker PID listens on PORT (and EXT and SPORT when given); prints the addresses.
wait_listening() {
  local pid=$1 dir=$2 port=$3 ext=$4 sport=$5
  for _ in $(seq 1 600); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "kafka exited; last lines of $dir/kafka.log:" >&2
      tail -20 "$dir/kafka.log" >&2
      return 3
    fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null \
      && { [ -z "$ext" ] || (exec 3<>"/dev/tcp/${ext%:*}/${ext##*:}") 2>/dev/null; } \
      && { [ -z "$sport" ] || (exec 3<>"/dev/tcp/127.0.0.1/$sport") 2>/dev/null; }; then
      echo "KAFKA_BOOTSTRAP=127.0.0.1:$port"
      [ -z "$ext" ] || echo "KAFKA_EXTERNAL=$ext"
      if [ -n "$sport" ]; then
        echo "KAFKA_SASL_SSL=127.0.0.1:$sport"
        echo "KAFKA_CA=$dir/tls/ca.pem"
        echo "KAFKA_SASL_USER=gpusanity"
        echo "KAFKA_SASL_PASSWORD_FILE=$dir/tls/sasl-password"
      fi
      return 0
    fi
    sleep 0.1
  done
  echo "kafka did not listen on $port${ext:+ and $ext}${sport:+ and $sport} within 60 s" >&2
  exit 1
}

stop() {
  [ -f "$STATE" ] || { echo "no state file $STATE" >&2; exit 1; }
  local pid dir
  pid=$(sed -n 's/^pid=//p' "$STATE")
  dir=$(sed -n 's/^dir=//p' "$STATE")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -rf "$dir" "$STATE"
}

# Stops the broker, keeping its log dir and state (an outage, for tests).
halt() {
  [ -f "$STATE" ] || { echo "no state file $STATE" >&2; exit 1; }
  local pid
  pid=$(sed -n 's/^pid=//p' "$STATE")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  return 0
}

# Starts a halted broker again from its log dir, on the same ports (plaintext listener only).
resume() {
  [ -f "$STATE" ] || { echo "no state file $STATE" >&2; exit 1; }
  local dir port
  dir=$(sed -n 's/^dir=//p' "$STATE")
  port=$(sed -n 's/^port=//p' "$STATE")
  local cp="$CACHE/libs/*"
  nohup "$JAVA" -Xmx512m -XX:+UseSerialGC -Dlog4j2.configurationFile="$dir/log4j2.yaml" -cp "$cp" kafka.Kafka \
    "$dir/server.properties" >>"$dir/kafka.log" 2>&1 &
  local pid=$!
  printf 'pid=%s\ndir=%s\nport=%s\n' "$pid" "$dir" "$port" >"$STATE"
  wait_listening "$pid" "$dir" "$port" "" ""
}

case "${1:-}" in
  fetch) fetch ;;
  start) shift; start_retrying "$@" ;;
  stop) stop ;;
  halt) halt ;;
  resume) resume ;;
  *) echo "usage: $0 fetch|start [PORT]|stop|halt|resume" >&2; exit 2 ;;
esac
