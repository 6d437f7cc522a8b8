#!/usr/bin/env bash
# The gpusanity image, built the way CI builds it: from a binary already built and tested (no
# second compile) and the pinned CUDA libraries, on a Debian base made here with debootstrap
# and tagged as the base the Containerfile names. Users build with `podman build .` or
# `docker build .` instead (docs/install.md).
#
#   scripts/image.sh base            make the Debian base (debootstrap, cached as a tarball) and
#                                    tag it docker.io/library/debian:bookworm-slim
#   scripts/image.sh build BIN       build localhost/gpusanity:VERSION from BIN (also tagged
#                                    VERSION-COMMIT); prints IMAGE=... and SIZE_MB=...
#   scripts/image.sh training        the example training image (python3, with gpusanity copied
#                                    in by deploy/image/training.Containerfile); prints TRAINING_IMAGE=...
#   scripts/image.sh old             a Debian 11 (bullseye: glibc 2.31 and OpenSSL 1.1, as Ubuntu
#                                    20.04) image for the portable binary's test; prints OLD_BASE=...
#   scripts/image.sh save IMAGE FILE an OCI archive of IMAGE (for containerd)
#   scripts/image.sh podman ARGS     podman with the settings below
#
# Podman here: Debian's podman with Debian's runc (crun refuses cgroup v1 in hybrid mode), the
# cgroupfs manager, and no default ulimits (a container may not raise them here). Caches:
# $IMAGE_CACHE (default ~/.cache/gpusanity/image): the base tarballs; the wheels of
# scripts/cuda-libs.sh under ~/.cache/gpusanity/wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${IMAGE_CACHE:-$HOME/.cache/gpusanity/image}
SUITE=bookworm
OLD_SUITE=bullseye
OLD_BASE=localhost/gpusanity-old-base:$OLD_SUITE
BASE=docker.io/library/debian:bookworm-slim
TRAINING_BASE=localhost/gpusanity-training-base:$SUITE
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
IMAGE=localhost/gpusanity:$VERSION
TRAINING=localhost/gpusanity-training-example:$VERSION
mkdir -p "$CACHE"
conf="$CACHE/containers.conf"
[ -f "$conf" ] || printf '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n' >"$conf"
export CONTAINERS_CONF=$conf

pm() { podman --runtime runc --cgroup-manager cgroupfs "$@"; }

# A Debian root file system as a tarball, made once: `debootstrap --variant=minbase` from
# Debian's packages (about 30 s), with the packages in $2 added, of suite $3 (default $SUITE).
rootfs() {
  local name=$1 include=$2 suite=${3:-$SUITE} tar="$CACHE/$1.tar"
  if [ ! -s "$tar" ]; then
    local dir
    dir=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-rootfs.XXXXXX")
    echo "== debootstrap $suite ($name${include:+, with $include})" >&2
    debootstrap --variant=minbase ${include:+--include="$include"} "$suite" "$dir" >"$CACHE/$name.log" 2>&1 \
      || { tail -n 20 "$CACHE/$name.log" >&2; exit 1; }
    # What an image does not need: the package lists and caches, docs.
    rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/usr/share/doc/* "$dir"/usr/share/man/*
    tar -C "$dir" --numeric-owner -cf "$tar.part" .
    mv "$tar.part" "$tar"
    rm -rf "$dir"
  fi
  echo "$tar"
}

base() {
  if ! pm image exists "$BASE"; then
    pm import --quiet "$(rootfs "debian-$SUITE-minbase" "")" "$BASE" >/dev/null
  fi
}

commit() { git rev-parse --short=12 HEAD 2>/dev/null || echo unknown; }

build() {
  local bin=$1
  [ -x "$bin" ] || { echo "image: no binary at $bin" >&2; exit 1; }
  base
  rm -rf dist/gpusanity
  mkdir -p dist
  cp "$bin" dist/gpusanity
  bash scripts/cuda-libs.sh dist/cuda-libs
  pm build --quiet --build-arg BINARY=prebuilt --build-arg CUDA_LIBS=prebuilt \
    -t "$IMAGE" -t "$IMAGE-$(commit)" -f Containerfile . >/dev/null
  # What earlier builds left: their commit tags and the layers no tag holds any more.
  local old
  old=$(pm images --format '{{.Repository}}:{{.Tag}}' | grep "^$IMAGE-" | grep -vx "$IMAGE-$(commit)" || true)
  # shellcheck disable=SC2086 # one tag per word
  [ -z "$old" ] || pm rmi --force $old >/dev/null 2>&1 || true
  pm image prune --force >/dev/null 2>&1 || true
  echo "IMAGE=$IMAGE"
  echo "SIZE_MB=$(($(pm image inspect --format '{{.Size}}' "$IMAGE") / 1000000))"
}

training() {
  if ! pm image exists "$TRAINING_BASE"; then
    pm import --quiet "$(rootfs "debian-$SUITE-python3" python3-minimal)" "$TRAINING_BASE" >/dev/null
  fi
  pm build --quiet --build-arg "BASE=$TRAINING_BASE" --build-arg "GPUSANITY_IMAGE=$IMAGE" \
    -t "$TRAINING" -f deploy/image/training.Containerfile deploy/image >/dev/null
  echo "TRAINING_IMAGE=$TRAINING"
}

case "${1:-}" in
  base) base; echo "BASE=$BASE" ;;
  build) build "${2:?usage: image.sh build BIN}" ;;
  training) training ;;
  old)
    if ! pm image exists "$OLD_BASE"; then
      pm import --quiet "$(rootfs "debian-$OLD_SUITE-minbase" "" "$OLD_SUITE")" "$OLD_BASE" >/dev/null
    fi
    echo "OLD_BASE=$OLD_BASE"
    ;;
  save) rm -f "$3"; pm save --quiet --format oci-archive -o "${3:?usage: image.sh save IMAGE FILE}" "$2" ;;
  podman) shift; pm "$@" ;;
  *) sed -n '2,/^set -e/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
