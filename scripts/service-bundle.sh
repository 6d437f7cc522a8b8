#!/usr/bin/env bash
# A self-contained Kafka for a machine without Java: a jlink'd Java runtime made from this
# machine's JDK 17 and the Kafka 4.4.0 jars that the KRaft broker, its storage tool and the
# console producer and consumer load (no Connect, Jetty, Jersey, ...), in one .tar.xz.
#
#   scripts/service-bundle.sh OUT.tar.xz
#
# The archive unpacks (tar -xJf OUT.tar.xz -C DIR) into
#   DIR/jre/              the runtime: DIR/jre/bin/java (x86-64 Linux, glibc 2.34 or later,
#                         the host's zlib and libstdc++)
#   DIR/kafka/.complete   a jar cache as scripts/kafka.sh keeps one:
#   DIR/kafka/libs/*.jar  JAVA=DIR/jre/bin/java GPUSANITY_KAFKA_CACHE=DIR/kafka scripts/kafka.sh start
#   DIR/bundle.txt        what is in it
# (bench/gpu/two_jobs_service.sh runs the service on it).
#
# Environment: JDK (default /usr/lib/jvm/java-17-openjdk-amd64, with its jmods), GPUSANITY_KAFKA_CACHE
# (the jars, default ~/.cache/gpusanity/kafka-4.4.0, as `scripts/kafka.sh fetch` fills it).
# The jars are rewritten uncompressed (stored; the same entries, bytes and order) and the
# runtime left uncompressed, so that xz compresses the classes themselves: 21 MB for the jars
# instead of 41 MB as they come.
set -euo pipefail
OUT=${1:?usage: scripts/service-bundle.sh OUT.tar.xz}
JDK=${JDK:-/usr/lib/jvm/java-17-openjdk-amd64}
CACHE=${GPUSANITY_KAFKA_CACHE:-$HOME/.cache/gpusanity/kafka-4.4.0}

# The runtime's modules: jdeps --print-module-deps over the jars below, plus java.logging and
# java.xml (log4j-core), jdk.crypto.ec (TLS) and jdk.management. java.desktop stays, though
# large: log4j-core's LoggerContext loads java.beans.PropertyChangeEvent at the first logger.
MODULES=java.base,java.compiler,java.desktop,java.logging,java.management,java.naming,java.rmi
MODULES+=,java.scripting,java.security.jgss,java.security.sasl,java.sql,java.xml,jdk.unsupported
MODULES+=,jdk.management,jdk.crypto.ec

# The jars, by artifact (any version): the broker (kafka_2.13 and the kafka-* modules it runs),
# the tools (StorageTool, console producer and consumer), their runtime libraries and logging.
JARS=(
  kafka_2.13 kafka-clients kafka-coordinator-common kafka-group-coordinator kafka-group-coordinator-api
  kafka-metadata kafka-raft kafka-server kafka-server-common kafka-share-coordinator kafka-storage
  kafka-storage-api kafka-tools kafka-tools-api kafka-transaction-coordinator
  scala-library scala-logging_2.13 scala-reflect
  slf4j-api log4j-api log4j-core log4j-slf4j2-impl
  jackson-annotations jackson-core jackson-databind jackson-dataformat-yaml snakeyaml
  jackson-dataformat-csv jackson-datatype-jdk8
  jopt-simple argparse4j metrics-core pcollections caffeine hash4j re2j HdrHistogram jose4j
  commons-validator jspecify
  lz4-java snappy-java zstd-jni
)

[ -x "$JDK/bin/jlink" ] && [ -d "$JDK/jmods" ] || { echo "no JDK with jmods at $JDK (set JDK)" >&2; exit 1; }
[ -d "$CACHE/libs" ] || { echo "no Kafka jars in $CACHE/libs: run scripts/kafka.sh fetch" >&2; exit 1; }
command -v xz >/dev/null || { echo "xz is needed" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-bundle.XXXXXX")
trap 'rm -rf "$work"' EXIT
dir=$work/bundle
mkdir -p "$dir/kafka/libs"

"$JDK/bin/jlink" --module-path "$JDK/jmods" --add-modules "$MODULES" \
  --strip-debug --no-header-files --no-man-pages --output "$dir/jre"

jars=()
for a in "${JARS[@]}"; do
  # ARTIFACT-VERSION.jar: a version starts with a digit, so kafka-server-common-4.4.0.jar is
  # not one of kafka-server.
  found=()
  for f in "$CACHE/libs/$a"-[0-9]*.jar; do
    [ -e "$f" ] && found+=("$f")
  done
  [ "${#found[@]}" = 1 ] || { echo "expected one jar of $a in $CACHE/libs, found ${#found[@]}: ${found[*]:-}" >&2; exit 1; }
  jars+=("${found[0]}")
done
# Each jar rewritten stored: the same entries in the same order, with their times and bytes.
python3 - "$dir/kafka/libs" "${jars[@]}" <<'PY'
import os, sys, zipfile
out = sys.argv[1]
for src in sys.argv[2:]:
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(os.path.join(out, os.path.basename(src)), "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            info.compress_type = zipfile.ZIP_STORED
            info.extra = b""
            zout.writestr(info, data)
PY
touch "$dir/kafka/.complete"

{
  echo "A Java runtime and the Kafka jars for scripts/kafka.sh on a machine without Java."
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) from $("$JDK/bin/java" -version 2>&1 | head -n 1)"
  echo "use:  JAVA=\$DIR/jre/bin/java GPUSANITY_KAFKA_CACHE=\$DIR/kafka scripts/kafka.sh start"
  echo "runtime modules: $("$dir/jre/bin/java" --list-modules | sed 's/@.*//' | paste -sd, -)"
  echo "jars (${#jars[@]}):"
  for f in "${jars[@]}"; do echo "  ${f##*/}"; done
} >"$dir/bundle.txt"

mkdir -p "$(dirname "$OUT")"
tar -C "$dir" -cf - jre kafka bundle.txt | xz -9 -T2 >"$OUT.tmp"
mv "$OUT.tmp" "$OUT"
echo "$OUT: $(stat -c %s "$OUT") bytes ($(du -sh "$dir" | cut -f1) unpacked): runtime $(du -sh "$dir/jre" | cut -f1), ${#jars[@]} jars $(du -sh "$dir/kafka/libs" | cut -f1)"
