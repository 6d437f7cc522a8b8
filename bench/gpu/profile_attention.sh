#!/usr/bin/env bash
# Why the fused attention kernels run where they do: Nsight Compute's speed-of-light, occupancy,
# warp-state (stall reasons), compute and memory sections for one launch of each attention
# kernel of megatron-gpt's timed steps (head dim 128, t 1024), clocks left alone.
# Usage (repository root, release binary carried):
#   BIN=.carry/gpusanity OUT=/tmp/attn MODEL=megatron-gpt bash bench/gpu/profile_attention.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-attention}
MODEL=${MODEL:-megatron-gpt}
SKIP=${SKIP:-60}
mkdir -p "$OUT"
. "$HERE/env.sh"
if ! command -v ncu > /dev/null; then
  echo "ncu not found: nothing profiled"
  exit 0
fi
ncu --version | tail -1
for k in attn_fwd attn_bwd_dq attn_bwd_dkv; do
  echo "== $k ($MODEL, launch $SKIP of this kernel)"
  ncu --clock-control none --kernel-name "$k" --launch-skip "$SKIP" --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section InstructionStats \
    --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active' \
    "$BIN" check --device cuda --micro-benchmarks= --model-benchmarks "$MODEL" --sanity-check-max-time 280 \
    --report-dir "$OUT/$k-report" > "$OUT/$k.txt" 2> "$OUT/$k.err"
  echo "exit $?"
  # The sections' tables without ncu's advice paragraphs.
  grep -E '^\s+[A-Za-z].*\s{2,}\S' "$OUT/$k.txt" | grep -vE '^\s+(OPT|INF|WRN)|issue_stalled' | head -120
  # Why warps wait, per issued instruction, the largest first.
  grep -E 'issue_stalled' "$OUT/$k.txt" | awk '{print $NF, $1}' | sort -rn | head -12
done
