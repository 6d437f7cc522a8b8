#!/usr/bin/env bash
# GPU run after the restructuring of the CUDA set-up: every worker opens one CUDA device
# (context, stream, cuBLAS handle; cuda/) that the backend and the models share. Runs the GPU
# tests of the cuda, executor and models crates, then the default check, the whole suite, and
# micro and model checks in one run (the same workers use the device for both), on every GPU.
# Usage (repository root; release binaries built anywhere, stripped and carried):
#   cargo build --release && cargo test --release -p gpusanity-cuda -p gpusanity-executor \
#     -p gpusanity-models --lib --no-run
#   mkdir -p .carry && cp target/release/gpusanity .carry/ && \
#     cp target/release/deps/gpusanity_{cuda,executor,models}-HASH .carry/  (named *-tests)
#   strip .carry/*
#   D=.carry OUT=/tmp/shared bash bench/gpu/shared_device.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
D=${D:-.carry}
BIN=$D/gpusanity
OUT=${OUT:-/tmp/gpusanity-shared}
mkdir -p "$OUT"
. "$HERE/env.sh"
# NCCL of PyTorch's packages ships libnccl.so.2 only; the loader asks for libnccl.so first.
NV=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null)
nccl2=$(find "$NV" -name 'libnccl.so.2' 2>/dev/null | head -1)
if [ -n "$nccl2" ] && [ -z "$(find "$NV" -name 'libnccl.so' 2>/dev/null)" ]; then
  mkdir -p /tmp/gpusanity-lib && ln -sf "$nccl2" /tmp/gpusanity-lib/libnccl.so
  export LD_LIBRARY_PATH=/tmp/gpusanity-lib:$LD_LIBRARY_PATH
fi
nvidia-smi -L
date -u +"date: %Y-%m-%dT%H:%M:%SZ"

summary() { # report.json
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("status:", r["status"], "|", r["summary"])
keys = ["tflops", "busbw_gbps", "round_trip_us", "launch_us", "overlap_efficiency", "step_ms_median", "mfu",
        "loss_first", "loss_final"]
for c in r["checks"]:
    figs = []
    for k in c["ranks"]:
        m = k["metrics"]
        figs.append("r%d %s " % (k["rank"], k["status"]) + " ".join("%s=%.4g" % (x, m[x]) for x in keys if x in m)
                    + (" error=" + k["error"][:160] if k.get("error") else ""))
    print("  %-26s %-14s %6.2f s  %s" % (c["name"], c["status"], c["duration_s"], " | ".join(figs)))
for f in r["findings"]:
    print("  finding:", f["severity"], f["code"], "rank", f.get("rank"), "|", f["message"][:200])
PY
}

echo "== GPU tests: the shared device (cuda crate)"
wall cuda-tests timeout 120 "$D/cuda-tests" --ignored --test-threads=1 > "$OUT/cuda-tests.txt" 2>&1
grep -E "^test |test result" "$OUT/cuda-tests.txt"
echo "== GPU tests: backend and model ops on its device (executor crate)"
wall executor-tests timeout 240 "$D/executor-tests" --ignored --test-threads=1 > "$OUT/executor-tests.txt" 2>&1
grep -E "^test |test result" "$OUT/executor-tests.txt"
echo "== GPU tests: CUDA ops against CPU ops (models crate)"
wall models-tests timeout 300 "$D/models-tests" --ignored --test-threads=1 cuda:: > "$OUT/models-tests.txt" 2>&1
grep -E "^test |test result" "$OUT/models-tests.txt"

echo "== default check, twice"
wall default-1 "$BIN" check --report-dir "$OUT/d1" > "$OUT/d1.txt" 2>&1
wall default-2 "$BIN" check --report-dir "$OUT/d2" > "$OUT/d2.txt" 2>&1
summary "$OUT/d2/report.json"
echo "== micro and model checks in one run (one device, used by the backend and the models)"
wall micro+models "$BIN" check --device cuda --micro-benchmarks gemm,kernel-launch,all-reduce \
  --model-benchmarks mini-gpt,resnet,megatron-gpt --report-dir "$OUT/both" > "$OUT/both.txt" 2>&1
summary "$OUT/both/report.json"
echo "== the whole suite"
wall suite "$BIN" check --device cuda \
  --micro-benchmarks gemm,kernel-launch,all-reduce,all-to-all,all-gather,multi-all-reduce,network-connectivity,matmul-all-reduce-overlap \
  --model-benchmarks mini-gpt,megatron-gpt,resnet --report-dir "$OUT/suite" > "$OUT/suite.txt" 2>&1
summary "$OUT/suite/report.json"
echo "== injected faults (each must fail and name the rank)"
wall gemm-wrong "$BIN" check --micro-benchmarks gemm --test-faults --sanity-check-envs GPUSANITY_FAULT=gemm-wrong@0 \
  --report-dir "$OUT/f1" > "$OUT/f1.txt" 2>&1
summary "$OUT/f1/report.json" | grep -E "^status|finding"
wall model-nan "$BIN" check --device cuda --micro-benchmarks= --model-benchmarks resnet \
  --check-param resnet.steps=9 --test-faults --sanity-check-envs GPUSANITY_FAULT=model-nan@0 \
  --report-dir "$OUT/f2" > "$OUT/f2.txt" 2>&1
summary "$OUT/f2/report.json" | grep -E "^status|finding"
echo "== processes left:"; pgrep -fa "gpusanity (check|worker)" || echo none
