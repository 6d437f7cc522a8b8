#!/usr/bin/env bash
# The image's library layout on a GPU machine: the portable binary in bin/, the CUDA libraries
# in lib/gpusanity/ beside it (as scripts/cuda-libs.sh lays them out in the image and the
# tarball), nothing on LD_LIBRARY_PATH, and the default check. The libraries come from the
# machine's own NVIDIA wheels (PyTorch's pip packages): the pinned wheels are 900 MB and the
# GPU machine reaches no registry. LD_DEBUG=libs shows where each library was found.
#
#   BIN=.carry/gpusanity OUT=/tmp/bundled bash bench/gpu/bundled_libs.sh
set -u
BIN=${BIN:-target/x86_64-unknown-linux-gnu/release/gpusanity}
OUT=${OUT:-/tmp/gpusanity-bundled}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
unset LD_LIBRARY_PATH
nvidia-smi -L
nvidia-smi --query-gpu=driver_version --format=csv,noheader
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
ldd --version | head -n 1

NV=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])')
root=$(mktemp -d)/gpusanity
install -D -m 0755 "$BIN" "$root/bin/gpusanity"
lib=$root/lib/gpusanity
mkdir -p "$lib"
for f in libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13 libnvrtc-builtins.so.13.0; do
  cp "$(find "$NV" -name "$f" | head -n 1)" "$lib/"
done
cp "$(find "$NV" -name libnccl.so.2 | head -n 1)" "$lib/"
# NVRTC's run path, as scripts/cuda-libs.sh sets it (PATCHELF: a patchelf binary, carried).
"${PATCHELF:-patchelf}" --set-rpath '$ORIGIN' "$lib/libnvrtc.so.13"
# The unversioned names the binary tries first, as scripts/cuda-libs.sh links them.
for f in libcublas.so.13 libcublasLt.so.13 libnvrtc.so.13 libnccl.so.2; do ln -s "$f" "$lib/${f%%.so*}.so"; done
# The manifest, with the versions of the packages the files came from.
python3 - "$lib" <<'PY'
import hashlib, importlib.metadata as md, sys
lib = sys.argv[1]
rows = [("nvidia-cublas", ["libcublas.so.13", "libcublasLt.so.13"]),
        ("nvidia-cuda-nvrtc", ["libnvrtc.so.13", "libnvrtc-builtins.so.13.0"]),
        ("nvidia-nccl-cu13", ["libnccl.so.2"])]
with open(lib + "/cuda-libs.toml", "w") as out:
    for pkg, files in rows:
        try:
            v = md.version(pkg)
        except md.PackageNotFoundError:
            v = "unknown"
        names = ", ".join('"%s"' % f for f in files)
        out.write('[[library]]\npackage = "%s"\nversion = "%s"\nwheel_sha256 = "%s"\nfiles = [%s]\n\n' % (pkg, v, "0" * 64, names))
PY
ls -la "$lib"
echo "== what the loader's cache offers besides (a toolkit the bundle must win against):"
ldconfig -p | grep -E 'libcublas|libnccl|libnvrtc' || echo "   (none)"
echo "== the binary's run path"
readelf -d "$root/bin/gpusanity" | grep -E 'RPATH|RUNPATH|NEEDED'
echo "== --version"
"$root/bin/gpusanity" --version
echo "== the default check, LD_LIBRARY_PATH unset"
s=$(date +%s%N)
LD_DEBUG=libs LD_DEBUG_OUTPUT=$OUT/ld "$root/bin/gpusanity" check --report-dir "$OUT/default" >"$OUT/default.txt" 2>&1
rc=$?
e=$(date +%s%N)
cat "$OUT/default.txt"
echo "== exit $rc, wall $(( (e - s) / 1000000 )) ms"
echo "== the libraries the processes loaded (LD_DEBUG=libs: 'calling init' names the file)"
cat "$OUT"/ld.* 2>/dev/null | grep -oE 'calling init: [^ ]*(libcuda|libcublas|libnccl|libnvrtc|libnvidia-ml)[^ ]*' \
  | sort | uniq -c | sort -rn
if cat "$OUT"/ld.* 2>/dev/null | grep -E 'calling init: ' | grep -E 'libcublas|libnccl|libnvrtc' | grep -qv "$root/"; then
  echo "BUNDLE NOT USED: a CUDA library came from outside $lib"
else
  echo "every cuBLAS, NCCL and NVRTC library came from $lib"
fi
echo "== a model check too (its kernels are compiled at run time by NVRTC)"
LD_DEBUG=libs LD_DEBUG_OUTPUT=$OUT/ld-model "$root/bin/gpusanity" check --micro-benchmarks gemm --model-benchmarks mini-gpt \
  --report-dir "$OUT/model" >"$OUT/model.txt" 2>&1
echo "== exit $?"
grep -E '^verdict' "$OUT/model.txt"
cat "$OUT"/ld-model.* 2>/dev/null | grep -oE 'calling init: [^ ]*libnvrtc[^ ]*' | sort | uniq -c
if cat "$OUT"/ld-model.* 2>/dev/null | grep -E 'calling init: [^ ]*libnvrtc' | grep -qv "$root/"; then
  echo "BUNDLE NOT USED: NVRTC or its builtins came from outside $lib"
else
  echo "NVRTC and its builtins came from $lib"
fi
python3 - "$OUT/default/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("status:", r["status"], "backend:", r["backend"])
for c in r["checks"]:
    print(" ", c["name"], c["status"])
    for k in c["ranks"]:
        if c["name"] == "gemm":
            print("    rank %d: %.1f TFLOP/s" % (k["rank"], k["metrics"]["tflops"]))
PY
rm -rf "$(dirname "$root")"
