#!/usr/bin/env bash
# A node that cannot run the job never passes (docs/health.md, "Ready for the job"), on a
# one-GPU machine: each case's verdict, exit code and findings, and the default check's wall
# time on a clean node (at most 3 s).
#   (a) another process holds most of the GPU's memory (torch.empty of LEFTOVER_GIB, 130 GiB)
#   (b) another process computes beside the check (a torch bf16 matmul loop)
#   (c) CUDA_VISIBLE_DEVICES=7 on a one-GPU node (a GPU that does not exist)
#   (d) a clean run, the default check: its wall time
# Each case runs `check` (the default set) and `check --quick`. Self-contained: needs only the
# binary, python3 with torch, and nvidia-smi. Finishes in about a minute (under 4).
# Usage (repository root, stripped release binary carried):
#   BIN=.carry/gpusanity bash bench/gpu/readiness.sh      # log: $OUT/readiness.txt
set -u
BIN=${BIN:-.carry/gpusanity}
OUT=${OUT:-/tmp/gpusanity-readiness}
LEFTOVER_GIB=${LEFTOVER_GIB:-130}
mkdir -p "$OUT"
LOG="$OUT/readiness.txt"
exec > >(tee "$LOG") 2>&1

# NVLink multicast stays off on shared machines; the CUDA libraries are those of PyTorch's pip
# packages (every lib folder under site-packages/nvidia).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
NV=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null)
if [ -n "$NV" ]; then
  LD_LIBRARY_PATH=$(find "$NV" -maxdepth 3 -type d -name lib | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
fi
unset CUDA_VISIBLE_DEVICES SANITY_CHECK_ARGS ENABLE_SANITY_CHECK

date -u +"date: %Y-%m-%dT%H:%M:%SZ"
"$BIN" --version 2>/dev/null || true
nvidia-smi --query-gpu=index,name,pci.bus_id,driver_version,memory.total,memory.used,compute_mode,persistence_mode,mig.mode.current --format=csv,noheader

BG=""
stop_bg() {
  if [ -n "$BG" ]; then
    kill "$BG" 2>/dev/null
    wait "$BG" 2>/dev/null
    BG=""
  fi
}
trap stop_bg EXIT

# Starts python code in the background and waits (up to 90 s) for its "ready" line.
start_bg() { # name, python code
  local name=$1 code=$2
  python3 -u -c "$code" > "$OUT/$name.bg.txt" 2>&1 &
  BG=$!
  for _ in $(seq 1 180); do
    grep -q ready "$OUT/$name.bg.txt" 2>/dev/null && { cat "$OUT/$name.bg.txt"; return 0; }
    kill -0 "$BG" 2>/dev/null || break
    sleep 0.5
  done
  echo "!! $name: the background process did not start:"; cat "$OUT/$name.bg.txt"
  stop_bg
  return 1
}

summary() { # report.json
  python3 - "$1" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("   no report:", e); sys.exit()
print("   verdict:", r["status"], "| backend", r["backend"], "|", r["summary"][:300])
for c in r["checks"]:
    notes = {}
    for k in c["ranks"]:
        notes = k.get("notes", {})
    extra = ("| processes: " + notes["processes"]) if "processes" in notes else ""
    print("   %-18s %-14s %6.3f s %s" % (c["name"], c["status"], c["duration_s"], extra[:200]))
for f in r["findings"]:
    print("   finding:", f["severity"], f["code"], "node", f.get("node_rank"), f.get("host"), "|", f["message"][:300])
PY
}

run() { # case name, VAR=value assignments ("" for none), then check's extra arguments
  local name=$1 envs=$2; shift 2
  local s e rc
  rm -rf "$OUT/$name"
  s=$(date +%s%N)
  # shellcheck disable=SC2086 # the assignments are words
  env $envs "$BIN" check --report-dir "$OUT/$name" "$@" > "$OUT/$name.txt" 2>&1
  rc=$?
  e=$(date +%s%N)
  echo "== $name: exit $rc, wall $(( (e - s) / 1000000 )) ms"
  summary "$OUT/$name/report.json"
  grep -E "gpusanity: |error" "$OUT/$name.txt" | head -3 | sed 's/^/   stderr: /'
}

# (d) first: the clean node, the default check three times (the first pays the driver's start).
echo; echo "### (d) clean node, default check"
for i in 1 2 3; do run "d-clean-$i" ""; done
run d-clean-quick "" --quick

# (a) a leftover holding most of the memory.
echo; echo "### (a) a process holding ${LEFTOVER_GIB} GiB"
if start_bg a-leftover "
import torch, time
x = torch.empty(int($LEFTOVER_GIB) << 30, dtype=torch.uint8, device='cuda:0')
torch.cuda.synchronize()
print('ready: holding', x.numel() >> 30, 'GiB', flush=True)
time.sleep(600)
"; then
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
  run a-leftover ""
  run a-leftover-quick "" --quick
  stop_bg
fi

# (b) a process computing beside the check.
echo; echo "### (b) a torch matmul loop beside the check"
if start_bg b-corunner "
import torch, time
x = torch.randn(8192, 8192, device='cuda:0', dtype=torch.bfloat16)
y = torch.randn(8192, 8192, device='cuda:0', dtype=torch.bfloat16)
torch.matmul(x, y); torch.cuda.synchronize()
print('ready: bf16 8192^3 matmuls', flush=True)
end = time.time() + 600
while time.time() < end:
    for _ in range(20):
        torch.matmul(x, y)
    torch.cuda.synchronize()
"; then
  sleep 1
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
  run b-corunner ""
  run b-corunner-quick "" --quick
  stop_bg
fi

# (c) CUDA_VISIBLE_DEVICES naming a GPU this node does not have.
echo; echo "### (c) CUDA_VISIBLE_DEVICES=7 on a one-GPU node"
run c-visible-7 CUDA_VISIBLE_DEVICES=7
run c-visible-7-quick CUDA_VISIBLE_DEVICES=7 --quick
run c-visible-7-cuda CUDA_VISIBLE_DEVICES=7 --device cuda

echo; echo "== processes left:"; pgrep -fa "gpusanity (check|worker)" || echo none
date -u +"end: %Y-%m-%dT%H:%M:%SZ"
