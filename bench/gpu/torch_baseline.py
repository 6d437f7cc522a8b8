"""PyTorch baseline for gpusanity's GPU figures, measured in the same run on the same machine:
bf16 GEMM 8192^3 (median of CUDA-event-timed products after warm-up, random data) per GPU,
and NCCL all-reduce of bf16 through torch.distributed (busbw by nccl-tests' formula)."""
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def gemm(dev, n=8192, warmup=50, iters=50):
    torch.cuda.set_device(dev)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(warmup):
        a @ b
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return 2 * n**3 / statistics.median(times) / 1e12


def worker(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    for nbytes in (1 << 20, 1 << 30):
        x = torch.ones(nbytes // 2, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        for _ in range(5):
            dist.all_reduce(x)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        iters = 20
        s.record()
        for _ in range(iters):
            dist.all_reduce(x)
        e.record()
        e.synchronize()
        t = s.elapsed_time(e) / 1e3 / iters
        if rank == 0:
            print(f"torch all-reduce {nbytes} B: {t * 1e6:.1f} us, busbw {nbytes / t / 1e9 * 2 * (world - 1) / world:.1f} GB/s")
        del y
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else torch.cuda.device_count()
    for d in range(n):
        print(f"torch bf16 GEMM 8192^3 on GPU {d}: {gemm(f'cuda:{d}'):.1f} TFLOP/s median")
    if n > 1:
        mp.spawn(worker, args=(n, 29533), nprocs=n)
