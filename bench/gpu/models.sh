#!/usr/bin/env bash
# GPU run of the model checks on an NVIDIA machine with PyTorch's pip packages (the H200 test
# machines): the CUDA-vs-CPU op tests of the models crate, then mini-gpt, megatron-gpt and
# resnet on every GPU with their wall times, figures and injected faults.
# Usage (from the repository root; binaries built on any x86-64 Linux machine):
#   cargo build --release && cargo test --release -p gpusanity-models --no-run   # prints TESTS
#   BIN=target/release/gpusanity TESTS=target/release/deps/gpusanity_models-HASH OUT=/tmp/m \
#     bash bench/gpu/models.sh
set -u
BIN=${BIN:-target/release/gpusanity}
TESTS=${TESTS:-}
OUT=${OUT:-/tmp/gpusanity-models}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The CUDA libraries of PyTorch's pip packages (libnvrtc included): every lib folder under
# site-packages/nvidia, plus a libnccl.so link where only libnccl.so.2 exists (docs/cuda.md).
NV=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null)
if [ -n "$NV" ]; then
  LD_LIBRARY_PATH=$(find "$NV" -maxdepth 3 -type d -name lib | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  nccl2=$(find "$NV" -name 'libnccl.so.2' | head -1)
  if [ -n "$nccl2" ] && [ -z "$(find "$NV" -name 'libnccl.so')" ]; then
    mkdir -p /tmp/gpusanity-lib && ln -sf "$nccl2" /tmp/gpusanity-lib/libnccl.so
    LD_LIBRARY_PATH=/tmp/gpusanity-lib:$LD_LIBRARY_PATH
  fi
  export LD_LIBRARY_PATH
  echo "NVRTC: $(find "$NV" -name 'libnvrtc.so*' | paste -sd' ')"
fi
nvidia-smi -L
date -u +"date: %Y-%m-%dT%H:%M:%SZ"

wall() { # name, output file, then the command: prints its wall time and exit code
  local name=$1 out=$2; shift 2
  local s e rc
  s=$(date +%s%N); "$@" > "$out" 2>&1; rc=$?; e=$(date +%s%N)
  echo "== $name: wall $(( (e - s) / 1000000 )) ms, exit $rc"
}

summary() { # report.json
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("status", r["status"], "|", r["summary"])
for c in r["checks"]:
    print(c["name"], c["status"], "%.2f s" % c["duration_s"])
    for k in c["ranks"]:
        m, n = k["metrics"], k.get("notes", {})
        thr = m.get("tokens_per_s") or m.get("images_per_s") or 0
        unit = "tokens/s" if "tokens_per_s" in m else "images/s"
        print("  rank %d %s: step %.1f ms (compute %.1f), %.0f %s, %.1f TFLOP/s, MFU %.1f%%, loss %.3f -> %.3f, %s, params %.1fM, checksum %s"
              % (k["rank"], k["status"], m.get("step_ms_median", 0), m.get("compute_ms_median", 0), thr, unit,
                 m.get("tflops", 0), 100 * m.get("mfu", 0), m.get("loss_first", float("nan")),
                 m.get("loss_final", float("nan")), n.get("layout"), m.get("params", 0) / 1e6, n.get("param_checksum")))
        if k.get("error"):
            print("    error:", k["error"])
for f in r["findings"]:
    print("  finding", f["severity"], f["code"], "rank", f["rank"], f["message"][:200])
PY
}

if [ -n "$TESTS" ]; then
  echo "== CUDA ops against CPU ops (models crate, ignored tests)"
  wall op-tests "$OUT/op-tests.txt" "$TESTS" --ignored --test-threads=1 cuda::
  tail -12 "$OUT/op-tests.txt"
fi

for m in mini-gpt megatron-gpt resnet; do
  echo "== $m on every GPU"
  wall "$m" "$OUT/$m.txt" "$BIN" check --device cuda --micro-benchmarks= --model-benchmarks "$m" --report-dir "$OUT/$m"
  summary "$OUT/$m/report.json"
done
echo "== the three in one run"
wall all-three "$OUT/all.txt" "$BIN" check --device cuda --micro-benchmarks= --model-benchmarks mini-gpt,megatron-gpt,resnet --report-dir "$OUT/all"
summary "$OUT/all/report.json" | grep -v "^  rank"

echo "== injected faults on the GPU (each must fail and name the rank)"
wall model-corrupt "$OUT/f1.txt" "$BIN" check --device cuda --micro-benchmarks= --model-benchmarks mini-gpt --check-param mini-gpt.steps=12 \
  --test-faults --sanity-check-envs GPUSANITY_FAULT=model-corrupt@1 --report-dir "$OUT/f1"
summary "$OUT/f1/report.json" | grep -E "finding|^status"
wall model-nan "$OUT/f2.txt" "$BIN" check --device cuda --micro-benchmarks= --model-benchmarks resnet --check-param resnet.steps=9 \
  --test-faults --sanity-check-envs GPUSANITY_FAULT=model-nan@0 --report-dir "$OUT/f2"
summary "$OUT/f2/report.json" | grep -E "finding|^status"
echo "== processes left:"; pgrep -fa "gpusanity (check|worker)" || echo none
tar -C "$OUT" -czf "$OUT/reports.tgz" $(cd "$OUT" && ls -d */ 2>/dev/null)
