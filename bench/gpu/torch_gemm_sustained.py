"""Sustained bf16 GEMM throughput per GPU measured with PyTorch the way gpusanity's gemm check
measures it: after warm-up, ITERS products of N^3 issued back to back with one CUDA event pair
around all of them; every GPU at once (one process each), as in a check. Also prints the median
of single products timed one at a time, the figure of torch_baseline.py.
Usage: python3 torch_gemm_sustained.py NGPU [N] [ITERS]"""
import statistics
import sys

import torch
import torch.multiprocessing as mp


def run(dev, n, iters, q):
    torch.cuda.set_device(dev)
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(50):
        a @ b
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        a @ b
    e.record()
    e.synchronize()
    sustained = 2 * n**3 * iters / (s.elapsed_time(e) / 1e3) / 1e12
    single = []
    for _ in range(iters):
        s.record()
        a @ b
        e.record()
        e.synchronize()
        single.append(s.elapsed_time(e) / 1e3)
    q.put((dev, sustained, 2 * n**3 / statistics.median(single) / 1e12))


if __name__ == "__main__":
    ngpu = int(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 8192
    iters = int(sys.argv[3]) if len(sys.argv) > 3 else 50
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    ps = [ctx.Process(target=run, args=(d, n, iters, q)) for d in range(ngpu)]
    for p in ps:
        p.start()
    res = sorted(q.get() for _ in ps)
    for p in ps:
        p.join()
    for dev, sus, med in res:
        print(f"torch gemm {n}^3 GPU{dev}: sustained {sus:.1f} TFLOP/s over {iters} back-to-back, single-product median {med:.1f}")
