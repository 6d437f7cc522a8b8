#!/usr/bin/env bash
# The default check's wall time on one GPU, cold and warm, with the phases of its start-up
# (GPUSANITY_LOG=debug: the workers' lines reach the launcher's stderr at debug): the
# launcher's CUDA probe beside its library check (probe_ms), each worker's backend open (open_ms: CUDA context, stream, cuBLAS) and NVML's load beside it
# (nvml_ms). Cold: the page cache is dropped before each run when this shell may do so (root),
# else the first run of a fresh machine is the cold one. Target: at most 3 s cold.
# Usage (repository root, stripped release binary carried):
#   BIN=.carry/gpusanity RUNS=3 bash bench/gpu/cold_start.sh     # log: $OUT/cold_start.txt
# Compare with the binary before the change (the same script, BIN pointing at it).
set -u
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-cold}
RUNS=${RUNS:-3}
mkdir -p "$OUT"
exec > >(tee "$OUT/cold_start.txt") 2>&1
. "$(dirname "$0")/env.sh"
unset CUDA_VISIBLE_DEVICES SANITY_CHECK_ARGS ENABLE_SANITY_CHECK
date -u +"date: %Y-%m-%dT%H:%M:%SZ"
"$BIN" --version 2>/dev/null || true
nvidia-smi --query-gpu=index,name,driver_version,persistence_mode --format=csv,noheader

check_once() { # report dir: the default check, its output beside the dir (the wall line stays in the log)
  env GPUSANITY_LOG=debug "$BIN" check --report-dir "$1" >"$1.out" 2>"$1.err"
}

one() { # name, drop: runs the default check once, prints wall, exit and the start-up phases
  local name=$1 drop=$2 dir="$OUT/$1"
  rm -rf "$dir"
  if [ "$drop" = 1 ]; then
    sync
    if ! echo 3 2>/dev/null >/proc/sys/vm/drop_caches; then echo "   (page cache not dropped: not root)"; fi
  fi
  wall "$name" check_once "$dir"
  grep -ohE '(probe_ms|open_ms|nvml_ms|inputs_ms|load_ms|products_ms|verify_ms)=[0-9]+' "$dir.err" | sort | uniq -c | sed 's/^/   /'
  grep -E '^\s*(gemm|gpu-health|all-reduce) ' "$dir.out" | sed 's/^/   /'
}

for i in $(seq 1 "$RUNS"); do one "cold-$i" 1; done
for i in $(seq 1 "$RUNS"); do one "warm-$i" 0; done
