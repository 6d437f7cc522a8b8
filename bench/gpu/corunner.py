"""A co-runner for the slow-GPU test: keeps one GPU busy with bf16 matmuls until killed (or
for --seconds), so that a health check running beside it sees that GPU slow."""
import argparse
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--gpu", type=int, default=1)
p.add_argument("--size", type=int, default=8192)
p.add_argument("--seconds", type=float, default=600.0)
a = p.parse_args()
dev = torch.device(f"cuda:{a.gpu}")
x = torch.randn(a.size, a.size, device=dev, dtype=torch.bfloat16)
y = torch.randn(a.size, a.size, device=dev, dtype=torch.bfloat16)
end = time.time() + a.seconds
torch.matmul(x, y)
torch.cuda.synchronize(dev)
# The script waits for this line: the GPU is loaded from here on.
print(f"co-runner ready: bf16 {a.size}^3 matmuls on GPU {a.gpu}", flush=True)
while time.time() < end:
    for _ in range(20):
        torch.matmul(x, y)
    torch.cuda.synchronize(dev)
