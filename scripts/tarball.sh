#!/usr/bin/env bash
# The release tarball for sites without containers (Slurm): the portable binary, the example
# configuration, the systemd units of serve and agent, and what fills lib/gpusanity/ with the
# pinned CUDA libraries on the site's side (they are 900 MB; the tarball stays small).
#
#   scripts/tarball.sh BIN OUTDIR     writes OUTDIR/gpusanity-VERSION-x86_64-linux.tar.gz, prints its path
#
# Layout (docs/install.md): bin/gpusanity, lib/gpusanity/ (the binary's DT_RUNPATH,
# $ORIGIN/../lib/gpusanity), share/gpusanity/{service.toml, systemd/, cuda-libs.sh,
# cuda-libs.txt}, docs/.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: tarball.sh BIN OUTDIR}
out=${2:?usage: tarball.sh BIN OUTDIR}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
name=gpusanity-$version-x86_64-linux
stage=$(mktemp -d "${TMPDIR:-/tmp}/gpusanity-tarball.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/$name
install -D -m 0755 "$bin" "$root/bin/gpusanity"
mkdir -p "$root/lib/gpusanity" "$root/share/gpusanity/systemd" "$root/share/gpusanity/scripts" \
  "$root/share/gpusanity/deploy/image" "$root/docs"
printf '%s\n' "The CUDA libraries gpusanity opens go here (the binary searches this folder first):" \
  "  share/gpusanity/scripts/cuda-libs.sh lib/gpusanity" \
  "fetches NVIDIA's wheels at the pinned versions and hashes of share/gpusanity/deploy/image/cuda-libs.txt." \
  >"$root/lib/gpusanity/README"
install -m 0644 deploy/config/service.toml "$root/share/gpusanity/service.toml"
install -m 0644 deploy/systemd/*.service "$root/share/gpusanity/systemd/"
install -m 0755 scripts/cuda-libs.sh "$root/share/gpusanity/scripts/cuda-libs.sh"
install -m 0644 deploy/image/cuda-libs.txt "$root/share/gpusanity/deploy/image/cuda-libs.txt"
install -m 0644 README.md "$root/README.md"
install -m 0644 docs/install.md docs/slurm.md docs/service.md docs/cuda.md docs/health.md "$root/docs/"
mkdir -p "$out"
tar -C "$stage" --owner=0 --group=0 --numeric-owner -czf "$out/$name.tar.gz" "$name"
echo "$out/$name.tar.gz"
