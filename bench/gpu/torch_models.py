"""PyTorch reference of gpusanity's three model checks, at the same shapes as their CUDA
defaults (docs/models.md, common/src/config/models.rs), on one GPU:

- mini-gpt: vocab 4096, ctx 512, 12 layers, 12 heads, dim 768, batch 16
- megatron-gpt (one GPU, TP 1): vocab 4096, ctx 1024, 8 layers, 16 heads, dim 2048, batch 8
- resnet: ResNet-50 (width 64, bottleneck blocks 3-4-6-3, stride on the 3x3), 224x224,
  batch 32, 10 classes, channels-last

The architecture mirrors models/src/gpt.rs and models/src/resnet.rs: GPT-2-style pre-norm
blocks (LayerNorm with bias, eps 1e-5), QKV / attention output / MLP linears with bias, MLP
ratio 4, GELU with the tanh approximation, learned position embeddings, untied LM head without
bias; ResNet convolutions without bias each followed by batch norm (batch statistics), a 1x1
projection shortcut with batch norm where the shape changes, a linear classifier with bias.
AdamW as gpusanity's (betas 0.9 / 0.95, eps 1e-8, weight decay 0.01 on matrices and
embeddings, none on norms and biases), fused; products in bf16 through autocast over fp32
weights; attention through scaled_dot_product_attention (causal).

Timing: median of 20 steps after 5 warm-up steps (warm-up includes torch.compile's
compilation), each step (forward, backward, AdamW) timed with CUDA events and synchronized.
FLOPs per step are gpusanity's `flops_per_step` (models/src/gpt.rs, models/src/resnet.rs):
matrix products only, 2 m n k each, forward plus twice the forward for the backward (x 3),
attention counted as full T x T products (causal masking not subtracted), embeddings and
element-wise ops not counted; for ResNet every convolution as its im2col product
(2 c_out (n oh ow) (c_in k k)) plus the classifier. MFU is against 989 TFLOP/s (H100/H200
dense bf16). Power (W) and SM clock (MHz) are averaged over samples taken every 20 ms through
pynvml on a thread during the timed steps only, with the reading gpusanity uses: the
instantaneous draw (NVML_FI_DEV_POWER_INSTANT) where the driver has it, else
nvmlDeviceGetPowerUsage (a one-second average on Ampere and newer).

Prints one JSON line per (model, mode). Usage:
  python3 bench/gpu/torch_models.py [--models mini-gpt,megatron-gpt,resnet] [--modes eager,compile]
  python3 bench/gpu/torch_models.py --device cpu --tiny      # a dry run of the code on CPU
"""
import argparse
import json
import math
import statistics
import sys
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

PEAK_TFLOPS = 989.0
WARMUP, TIMED = 5, 20

GPT_SHAPES = {
    "mini-gpt": dict(vocab=4096, ctx=512, layers=12, heads=12, dim=768, batch=16),
    "megatron-gpt": dict(vocab=4096, ctx=1024, layers=8, heads=16, dim=2048, batch=8),
}
RESNET_SHAPE = dict(image=224, batch=32, width=64, blocks=(3, 4, 6, 3), classes=10)
# gpusanity's CPU defaults: their FLOPs and parameter counts can be compared with a CPU report.
TINY = {
    "mini-gpt": dict(vocab=64, ctx=32, layers=2, heads=4, dim=64, batch=8),
    "megatron-gpt": dict(vocab=64, ctx=32, layers=2, heads=4, dim=64, batch=8),
    "resnet": dict(image=32, batch=8, width=8, blocks=(1, 1, 1, 1), classes=4),
}


# ---- models ----------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim, eps=1e-5)
        self.qkv = nn.Linear(dim, 3 * dim, bias=True)
        self.o = nn.Linear(dim, dim, bias=True)
        self.ln2 = nn.LayerNorm(dim, eps=1e-5)
        self.fc = nn.Linear(dim, 4 * dim, bias=True)
        self.proj = nn.Linear(4 * dim, dim, bias=True)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, c))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, ctx, layers, heads, dim, **_):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.lnf = nn.LayerNorm(dim, eps=1e-5)
        self.lm = nn.Linear(dim, vocab, bias=False)
        # gpusanity: uniform with the standard deviation 0.02 (the projections scaled down by
        # sqrt(2 layers)); the figures measured do not depend on it.
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("o.weight", "proj.weight")) else 0.02
                nn.init.normal_(p, std=std)

    def forward(self, tok, tgt):
        pos = torch.arange(tok.shape[1], device=tok.device)
        x = self.wte(tok) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.lm(self.lnf(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), tgt.view(-1))


def conv_bn(ci, co, k, stride):
    return nn.Sequential(nn.Conv2d(ci, co, k, stride, k // 2, bias=False), nn.BatchNorm2d(co))


class Bottleneck(nn.Module):
    def __init__(self, ci, planes, stride):
        super().__init__()
        self.c1 = conv_bn(ci, planes, 1, 1)
        self.c2 = conv_bn(planes, planes, 3, stride)
        self.c3 = conv_bn(planes, 4 * planes, 1, 1)
        self.short = conv_bn(ci, 4 * planes, 1, stride) if stride != 1 or ci != 4 * planes else None

    def forward(self, x):
        y = F.relu(self.c2(F.relu(self.c1(x))))
        y = self.c3(y)
        return F.relu(y + (x if self.short is None else self.short(x)))


class Resnet(nn.Module):
    def __init__(self, width, blocks, classes, **_):
        super().__init__()
        self.stem = conv_bn(3, width, 7, 2)
        layers, ci = [], width
        for s, count in enumerate(blocks):
            planes = width << s
            for i in range(count):
                layers.append(Bottleneck(ci, planes, 2 if s > 0 and i == 0 else 1))
                ci = 4 * planes
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(ci, classes, bias=True)

    def forward(self, x, labels):
        x = F.max_pool2d(F.relu(self.stem(x)), 3, 2, 1)
        x = self.layers(x).mean(dim=(2, 3))
        return F.cross_entropy(self.fc(x).float(), labels)


# ---- gpusanity's FLOP count ----------------------------------------------------------


def gpt_flops(vocab, ctx, layers, heads, dim, batch):
    """models/src/gpt.rs `flops_per_step` with TP 1."""
    n, d = batch * ctx, dim // heads
    mm = lambda m, nn_, k, b=1: 2.0 * m * nn_ * k * b  # noqa: E731
    per_layer = mm(n, 3 * dim, dim) + 2 * mm(ctx, ctx, d, batch * heads) + mm(n, dim, dim) + 2 * mm(n, 4 * dim, dim)
    return 3.0 * (layers * per_layer + mm(n, vocab, dim))


def resnet_flops(model, x, labels):
    """models/src/resnet.rs `flops_per_step`: 3 x (every convolution's im2col product + the
    classifier's), counted with hooks on one forward pass."""
    total = [0.0]

    def conv(mod, inp, out):
        n, co, oh, ow = out.shape
        ci, kh, kw = mod.in_channels // mod.groups, *mod.kernel_size
        total[0] += 2.0 * co * (n * oh * ow) * (ci * kh * kw)

    def lin(mod, inp, out):
        total[0] += 2.0 * inp[0].shape[0] * mod.in_features * mod.out_features

    hooks = [m.register_forward_hook(conv) for m in model.modules() if isinstance(m, nn.Conv2d)]
    hooks += [m.register_forward_hook(lin) for m in model.modules() if isinstance(m, nn.Linear)]
    with torch.no_grad():
        model(x, labels)
    for h in hooks:
        h.remove()
    return 3.0 * total[0]


# ---- power and clock ---------------------------------------------------------------------


class Sampler:
    """Power and SM clock of one GPU every `period` s on a thread, as gpusanity samples them."""

    def __init__(self, device, period=0.02):
        self.period, self.error, self.instant = period, None, False
        self.power, self.mhz = [], []
        self.stop_flag = threading.Event()
        self.thread = None
        try:
            import pynvml

            self.nv = pynvml
            pynvml.nvmlInit()
            self.handle = self._handle(device)
            self.instant = self._instant_w() is not None
        except Exception as e:  # no pynvml, no driver, no GPU: no figures
            self.error = f"{type(e).__name__}: {e}"

    def _handle(self, device):
        nv = self.nv
        props = torch.cuda.get_device_properties(device)
        try:
            bus = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            return nv.nvmlDeviceGetHandleByPciBusId(bus.encode())
        except (AttributeError, nv.NVMLError):
            return nv.nvmlDeviceGetHandleByUUID(("GPU-" + str(props.uuid)).encode())

    def _instant_w(self):
        nv = self.nv
        fid = getattr(nv, "NVML_FI_DEV_POWER_INSTANT", 186)
        try:
            v = nv.nvmlDeviceGetFieldValues(self.handle, [fid])[0]
        except Exception:  # an older pynvml or driver: no instantaneous reading
            return None
        if v.nvmlReturn != 0:
            return None
        field = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(v.valueType, "uiVal")
        mw = float(getattr(v.value, field))
        return mw / 1000.0 if mw > 0 else None

    def _run(self):
        nv = self.nv
        while True:
            try:
                self.mhz.append(nv.nvmlDeviceGetClockInfo(self.handle, nv.NVML_CLOCK_SM))
                w = self._instant_w() if self.instant else nv.nvmlDeviceGetPowerUsage(self.handle) / 1000.0
                if w is not None:
                    self.power.append(w)
            except Exception as e:
                self.error = self.error or f"{type(e).__name__}: {e}"
            if self.stop_flag.wait(self.period):
                return

    def start(self):
        if self.error is None:
            self.thread = threading.Thread(target=self._run, name="nvml-sampler", daemon=True)
            self.thread.start()

    def stop(self):
        self.stop_flag.set()
        if self.thread is not None:
            self.thread.join()
        mean = lambda v: round(statistics.fmean(v), 1) if v else None  # noqa: E731
        return {
            "power_w_mean": mean(self.power),
            "power_w_max": max(self.power, default=None),
            "power_samples": len(self.power),
            "sm_mhz_mean": mean(self.mhz),
            "sm_mhz_max": max(self.mhz, default=None),
            "power_source": ("instant" if self.instant else "nvmlDeviceGetPowerUsage") if self.power else None,
            "nvml_error": self.error,
        }


# ---- one run -------------------------------------------------------------------------------


def build(name, shape, device):
    g = torch.Generator(device="cpu").manual_seed(0)
    if name in GPT_SHAPES:
        model = Gpt(**shape).to(device)
        b, t, v = shape["batch"], shape["ctx"], shape["vocab"]
        tokens = [torch.randint(0, v, (b, t), generator=g).to(device) for _ in range(4)]
        # Next-token targets: the inputs shifted (what the loss sees does not change the time).
        batches = [(x, torch.roll(x, -1, dims=1)) for x in tokens]
        flops, items, unit = gpt_flops(**shape), b * t, "tokens"
    else:
        model = Resnet(**shape).to(device).to(memory_format=torch.channels_last)
        n, s, c = shape["batch"], shape["image"], shape["classes"]
        batches = [
            (
                torch.randn(n, 3, s, s, generator=g).to(device).contiguous(memory_format=torch.channels_last),
                torch.randint(0, c, (n,), generator=g).to(device),
            )
            for _ in range(4)
        ]
        flops, items, unit = resnet_flops(model, *batches[0]), n, "images"
    return model, batches, flops, items, unit


def optimizer(model, device):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.01}, {"params": rest, "weight_decay": 0.0}]
    fused = {"fused": True} if device.type == "cuda" else {"foreach": True}
    return torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), eps=1e-8, **fused)


class Timer:
    """A step's time: CUDA events on a GPU, the host clock on CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def __enter__(self):
        if self.cuda:
            self.s, self.e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self.s.record()
        else:
            self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.e.record()
            self.e.synchronize()
            self.ms = self.s.elapsed_time(self.e)
        else:
            self.ms = (time.perf_counter() - self.t0) * 1e3


def run(name, mode, shape, device, warmup, timed):
    t0 = time.perf_counter()
    model, batches, flops, items, unit = build(name, shape, device)
    opt = optimizer(model, device)
    fwd = torch.compile(model) if mode == "compile" else model
    sampler = Sampler(device) if device.type == "cuda" else None
    times, losses = [], []
    for step in range(warmup + timed):
        if step == warmup:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            warm_s = time.perf_counter() - t0
            if sampler:
                sampler.start()
        with Timer(device) as tm:
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
                loss = fwd(*batches[step % len(batches)])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step >= warmup:
            times.append(tm.ms)
    load = sampler.stop() if sampler else {"nvml_error": "no GPU"}
    step_ms = statistics.median(times)
    tflops = flops / (step_ms / 1e3) / 1e12
    out = {
        "model": name,
        "mode": mode,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "step_ms": round(step_ms, 3),
        "step_ms_min": round(min(times), 3),
        f"{unit}_per_s": round(items / (step_ms / 1e3), 1),
        "tokens_or_images_per_s": round(items / (step_ms / 1e3), 1),
        "tflops": round(tflops, 2),
        "mfu": round(tflops / PEAK_TFLOPS, 4),
        "flops_per_step": flops,
        "params": sum(p.numel() for p in model.parameters()),
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "warmup_s": round(warm_s, 1),
        "total_s": round(time.perf_counter() - t0, 1),
        "shape": {k: list(v) if isinstance(v, tuple) else v for k, v in shape.items()},
    }
    out.update(load)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="mini-gpt,megatron-gpt,resnet")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--device", default="cuda", help="cuda (cuda:N) or cpu")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (a dry run of the code)")
    ap.add_argument("--warmup", type=int, default=WARMUP)
    ap.add_argument("--steps", type=int, default=TIMED, help="timed steps after the warm-up")
    args = ap.parse_args()
    if args.steps < 1 or args.warmup < 0:
        sys.exit("--steps must be at least 1 and --warmup at least 0")
    device = torch.device(args.device)
    if device.type == "cuda":
        # "cuda" alone is the first visible GPU (set_device wants an index).
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.backends.cudnn.benchmark = True
    models = [m for m in args.models.split(",") if m]
    modes = [m for m in args.modes.split(",") if m]
    for m in models:
        if m not in TINY:
            sys.exit(f"unknown model {m} (mini-gpt, megatron-gpt, resnet)")
    for m in modes:
        if m not in ("eager", "compile"):
            sys.exit(f"unknown mode {m} (eager, compile)")
    failed = False
    for name in models:
        shape = TINY[name] if args.tiny else GPT_SHAPES.get(name, RESNET_SHAPE)
        for mode in modes:
            try:
                out = run(name, mode, shape, device, args.warmup, args.steps)
            except Exception as e:  # one failed run does not hide the others
                out, failed = {"model": name, "mode": mode, "error": f"{type(e).__name__}: {e}"}, True
            print(json.dumps(out), flush=True)
            if hasattr(torch, "_dynamo"):
                torch._dynamo.reset()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
