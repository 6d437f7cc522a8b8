"""PyTorch reference for gpusanity's all-gather and all-to-all figures, measured in the same run:
torch.distributed (NCCL) all_gather_into_tensor and all_to_all_single of 1 GiB bf16 (nccl-tests'
sizes: the gathered buffer, each rank's send buffer), busbw = algbw (n-1)/n."""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def timed(fn, iters=20, warmup=5):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / 1e3 / iters


def worker(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    nbytes = 1 << 30
    out = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    inp = torch.ones(nbytes // 2 // world, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: dist.all_gather_into_tensor(out, inp))
    if rank == 0:
        print(f"torch all-gather {nbytes} B: {t * 1e6:.1f} us, busbw {nbytes / t / 1e9 * (world - 1) / world:.1f} GB/s")
    send = torch.ones(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    t = timed(lambda: dist.all_to_all_single(out, send))
    if rank == 0:
        print(f"torch all-to-all {nbytes} B: {t * 1e6:.1f} us, busbw {nbytes / t / 1e9 * (world - 1) / world:.1f} GB/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else torch.cuda.device_count()
    if n > 1:
        mp.spawn(worker, args=(n, 29534), nprocs=n)
