"""PyTorch reference for gpusanity's memory-bandwidth and host-bandwidth figures, measured the
same way on the same machine: per GPU, a device-to-device copy dst.copy_(src) of MEM_BYTES
(GB/s counting bytes read plus written), and pinned host-to-device / device-to-host copies of
HOST_BYTES (GB/s one way), each copy between two CUDA events, median of the timed copies after
warm-up. GPUs one after the other (gpusanity's single figures are also one GPU at a time).
Prints one JSON line: {"gpus": [{"index", "name", "d2d_gbps", "h2d_gbps", "d2h_gbps"}]}."""
import json
import os
import statistics

import torch


def timed(fn, warmup, iters):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    return statistics.median(times)


def one(dev, mem_bytes, host_bytes):
    torch.cuda.set_device(dev)
    src = torch.empty(mem_bytes, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    d2d = 2 * mem_bytes / timed(lambda: dst.copy_(src), 5, 20) / 1e9
    assert torch.equal(dst, src), "PyTorch's own copy is wrong"
    del src, dst
    host = torch.empty(host_bytes, dtype=torch.uint8, pin_memory=True).random_(0, 255)
    dev_buf = torch.empty(host_bytes, dtype=torch.uint8, device=dev)
    h2d = host_bytes / timed(lambda: dev_buf.copy_(host, non_blocking=True), 3, 10) / 1e9
    back = torch.empty(host_bytes, dtype=torch.uint8, pin_memory=True)
    d2h = host_bytes / timed(lambda: back.copy_(dev_buf, non_blocking=True), 3, 10) / 1e9
    torch.cuda.synchronize()
    assert torch.equal(back, host), "PyTorch's pinned round trip is wrong"
    return {"index": dev, "name": torch.cuda.get_device_name(dev), "d2d_gbps": d2d, "h2d_gbps": h2d, "d2h_gbps": d2h}


if __name__ == "__main__":
    mem_bytes = int(os.environ.get("MEM_BYTES", 4 << 30))
    host_bytes = int(os.environ.get("HOST_BYTES", 256 << 20))
    gpus = [one(d, mem_bytes, host_bytes) for d in range(torch.cuda.device_count())]
    print(json.dumps({"gpus": gpus}))
