# Sourced by the GPU scripts: the environment of the H200 test machines (PyTorch's pip packages
# provide the CUDA libraries) and a timing helper.
# NVLink multicast stays off on shared machines.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The CUDA libraries of PyTorch's pip packages: every lib folder under site-packages/nvidia.
NV=$(python3 -c 'import nvidia, os; print(list(nvidia.__path__)[0])' 2>/dev/null)
if [ -n "$NV" ]; then
  LD_LIBRARY_PATH=$(find "$NV" -maxdepth 3 -type d -name lib | paste -sd:)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LD_LIBRARY_PATH
fi

wall() { # name, then the command: prints its wall time and exit code
  local name=$1; shift
  local s e rc
  s=$(date +%s%N); "$@"; rc=$?; e=$(date +%s%N)
  echo "== $name: wall $(( (e - s) / 1000000 )) ms, exit $rc"
}
