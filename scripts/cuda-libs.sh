#!/usr/bin/env bash
# Puts the CUDA user-space libraries that gpusanity opens at run time (cuBLAS, cuBLASLt, NVRTC,
# NCCL) into one folder, from NVIDIA's wheels pinned with their hashes in
# deploy/image/cuda-libs.txt, and writes the folder's manifest (cuda-libs.toml) that
# `gpusanity --version` reads.
#
#   scripts/cuda-libs.sh DEST
#
# DEST is the folder beside the binary that the binary searches (its DT_RUNPATH is
# $ORIGIN/../lib/gpusanity): /usr/local/lib/gpusanity in the image, lib/gpusanity in the
# tarball. Wheels are kept in $CUDA_WHEELS (default ~/.cache/gpusanity/wheels), so a second run
# downloads nothing. Needs python3 with pip (the wheels are zip files) and patchelf.
#
# One change to NVIDIA's files: libnvrtc.so.13 gets the run path $ORIGIN that the cuBLAS
# libraries already carry. NVRTC opens libnvrtc-builtins.so.13.0 itself, by that name; without
# a run path of its own the loader's cache answers, and a CUDA toolkit installed on the machine
# gave its builtins to the bundled NVRTC (seen on an H100 machine, docs/gpu-runs/).
set -euo pipefail
dest=${1:?usage: cuda-libs.sh DEST}
here=$(cd "$(dirname "$0")/.." && pwd)
req=${CUDA_LIBS_REQUIREMENTS:-$here/deploy/image/cuda-libs.txt}
cache=${CUDA_WHEELS:-$HOME/.cache/gpusanity/wheels}
mkdir -p "$cache" "$dest"
command -v patchelf >/dev/null 2>&1 || { echo "cuda-libs: patchelf is missing (Debian: patchelf; PyPI: patchelf)" >&2; exit 1; }

# Download what the cache lacks; pip refuses a wheel whose hash differs from the pin.
python3 -m pip download --quiet --no-deps --only-binary=:all: --require-hashes -r "$req" -d "$cache" >&2

python3 - "$req" "$cache" "$dest" <<'PY'
import hashlib, os, re, sys, zipfile
req, cache, dest = sys.argv[1:4]
# The files each package gives, by the name the binary or its libraries open.
wanted = {
    "nvidia-cublas": ["libcublas.so.13", "libcublasLt.so.13"],
    "nvidia-cuda-nvrtc": ["libnvrtc.so.13", "libnvrtc-builtins.so.13.0"],
    "nvidia-nccl-cu13": ["libnccl.so.2"],
}
pins = []
for line in open(req):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    m = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9._+-]+)\s+--hash=sha256:([0-9a-f]{64})", line)
    if not m:
        sys.exit(f"cuda-libs: malformed pin: {line!r}")
    pins.append(m.groups())
manifest = ["# The CUDA libraries in this folder, written by scripts/cuda-libs.sh.", ""]
for name, version, sha in pins:
    if name not in wanted:
        sys.exit(f"cuda-libs: no file list for {name}")
    stem = name.replace("-", "_") + "-" + version + "-"
    wheels = [w for w in os.listdir(cache) if w.startswith(stem) and w.endswith(".whl")]
    wheel = next((os.path.join(cache, w) for w in wheels
                  if hashlib.sha256(open(os.path.join(cache, w), "rb").read()).hexdigest() == sha), None)
    if wheel is None:
        sys.exit(f"cuda-libs: no wheel of {name} {version} with sha256 {sha} in {cache}")
    with zipfile.ZipFile(wheel) as z:
        by_base = {os.path.basename(i.filename): i for i in z.infolist() if "/lib/" in i.filename}
        for f in wanted[name]:
            if f not in by_base:
                sys.exit(f"cuda-libs: {os.path.basename(wheel)} has no {f}")
            tmp = os.path.join(dest, f + ".part")
            with z.open(by_base[f]) as src, open(tmp, "wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
            os.chmod(tmp, 0o755)
            os.replace(tmp, os.path.join(dest, f))
    files = ", ".join(f'"{f}"' for f in wanted[name])
    manifest += ["[[library]]", f'package = "{name}"', f'version = "{version}"',
                 f'wheel_sha256 = "{sha}"', f"files = [{files}]", ""]
# The binary tries the unversioned name of each library first (docs/cuda.md): in this folder it
# must find ours, before the loader's cache offers a toolkit's (and libnccl.so.2 is never tried).
for target in ["libcublas.so.13", "libcublasLt.so.13", "libnvrtc.so.13", "libnccl.so.2"]:
    link = os.path.join(dest, target.split(".so")[0] + ".so")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(target, link)
with open(os.path.join(dest, "cuda-libs.toml"), "w") as out:
    out.write("\n".join(manifest))
PY
patchelf --set-rpath '$ORIGIN' "$dest/libnvrtc.so.13"
echo "cuda-libs: $(du -sh "$dest" | cut -f1) in $dest" >&2
