#!/usr/bin/env bash
# The portable Linux build: one x86_64 binary whose highest glibc symbol version is 2.28 (RHEL 8,
# Ubuntu 20.04 and every newer distribution) and that needs no system OpenSSL (librdkafka's TLS
# links OpenSSL built from source, statically: rdkafka's `ssl-vendored`). Zig's linker and its
# glibc 2.28 stubs do the linking (cargo-zigbuild); what Rust compiles is the same as the
# developer build's.
#
#   scripts/portable.sh setup      install zig (PyPI: ziglang) and cargo-zigbuild (crates.io) if missing
#   scripts/portable.sh build      build the binary: prints nothing, see `path`
#   scripts/portable.sh test ARGS  build and run the workspace's tests against it (as CI does)
#   scripts/portable.sh path       the binary's path
#   scripts/portable.sh verify BIN refuse a binary above the glibc floor or needing a library
#                                  outside the floor's set (libssl, libcrypto...)
#   scripts/portable.sh tarball DIR  the release tarball (binary, configurations, systemd units)
#
# The developer build (`cargo build --release`) stays as it is: linked by the system's cc
# against the system's glibc.
set -euo pipefail
cd "$(dirname "$0")/.."
ZIG_VERSION=0.17.1
ZIGBUILD_VERSION=0.24.1
GLIBC_FLOOR=2.28
TRIPLE=x86_64-unknown-linux-gnu
TARGET=$TRIPLE.$GLIBC_FLOOR
# The only shared libraries the binary may need: glibc's own (the CUDA libraries, NVML and the
# rest are opened at run time with dlopen, never linked).
# No debug sections (the developer profile keeps line tables): the binary CI tests is the one
# that ships, and it must stay small enough to carry; symbols stay, so backtraces name functions.
export CARGO_PROFILE_RELEASE_DEBUG=false CARGO_PROFILE_RELEASE_STRIP=debuginfo
ALLOWED_NEEDED='^(libc|libm|libdl|libpthread|librt|libgcc_s|ld-linux-x86-64)\.so'

setup() {
  if ! python3 -m ziglang version 2>/dev/null | grep -qx "$ZIG_VERSION"; then
    echo "== installing zig $ZIG_VERSION (PyPI: ziglang)" >&2
    python3 -m pip install --quiet "ziglang==$ZIG_VERSION" >&2
  fi
  if ! cargo-zigbuild --version 2>/dev/null | grep -q " $ZIGBUILD_VERSION\$"; then
    echo "== installing cargo-zigbuild $ZIGBUILD_VERSION" >&2
    cargo install --quiet --locked --version "$ZIGBUILD_VERSION" cargo-zigbuild >&2
  fi
}

# zig's own binary from the ziglang package, so that each compiler call skips Python.
zig_path() {
  python3 -c 'import os, ziglang; print(os.path.join(os.path.dirname(ziglang.__file__), "zig"))'
}

path() { echo "target/$TRIPLE/release/gpusanity"; }

verify() {
  local bin=$1 max needed
  [ -x "$bin" ] || { echo "portable: no binary at $bin" >&2; exit 1; }
  # The highest GLIBC_x.y version among the symbols the binary imports.
  max=$(objdump -T "$bin" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -n 1)
  if [ "$(printf '%s\n%s\n' "$max" "$GLIBC_FLOOR" | sort -V | tail -n 1)" != "$GLIBC_FLOOR" ]; then
    echo "portable: $bin needs glibc $max, above the floor $GLIBC_FLOOR:" >&2
    objdump -T "$bin" | grep -E "GLIBC_$max\b" | head >&2
    exit 1
  fi
  needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  if grep -vE "$ALLOWED_NEEDED" <<<"$needed" | grep -q .; then
    echo "portable: $bin needs libraries outside glibc's: $(grep -vE "$ALLOWED_NEEDED" <<<"$needed" | paste -sd' ')" >&2
    exit 1
  fi
  echo "portable: $bin: highest glibc symbol $max (floor $GLIBC_FLOOR); needs $(paste -sd' ' <<<"$needed")"
}

case "${1:-}" in
  setup) setup ;;
  build)
    setup
    CARGO_ZIGBUILD_ZIG_PATH=$(zig_path)
    export CARGO_ZIGBUILD_ZIG_PATH
    cargo-zigbuild zigbuild --release --locked --target "$TARGET" --bin gpusanity
    ;;
  test)
    shift
    setup
    CARGO_ZIGBUILD_ZIG_PATH=$(zig_path)
    export CARGO_ZIGBUILD_ZIG_PATH
    cargo-zigbuild test --release --locked --workspace --target "$TARGET" "$@"
    ;;
  path) path ;;
  verify) verify "${2:?usage: portable.sh verify BIN}" ;;
  tarball) bash scripts/tarball.sh "$(path)" "${2:?usage: portable.sh tarball DIR}" ;;
  *) sed -n '2,/^set -e/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
