"""A steady training loop with a real job's phases, for the watch (docs/watch.md).

It trains the megatron-gpt shape of torch_models.py (bf16 autocast, fused AdamW) on one GPU
for --seconds, and every --ckpt-every s pauses as a checkpoint does (a state_dict copied to
the host and written to disk), every --eval-every s runs an evaluation phase (forward only,
no grad), and every --stall-every s waits on a slow data loader (host sleep). Each step's time
goes to --steps (JSON lines: t, step, phase, ms), so that a run with and without the watch can
be compared step for step.

With --telemetry FILE it also samples the GPU through pynvml every --period s on a thread (the
readings the watch takes: SM clock, power and its limit, temperature, utilization, memory used,
clock-event reasons) and writes them as JSON lines: the spreads the fleet simulation draws from
(bench/watch_sim.rs). Each line has the SM clock and power both as one reading now (`sm_mhz`,
`power_w`) and as the means over the period since the line before, as the agent's sampler
reads them (`sm_mean_mhz`, `power_mean_w`: read every 0.1 s; `clk_samples`: how many readings the means
are of; `sm_readings`: the clock readings themselves, in order, for the dips of one reading and
how many readings in a row they last).

  python3 bench/gpu/watch_train.py --seconds 300 --steps steps.jsonl --telemetry tele.jsonl
  python3 bench/gpu/watch_train.py --device cpu --tiny --seconds 5 --steps /dev/null
"""
import argparse
import json
import os
import sys
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_models import GPT_SHAPES, Gpt, optimizer  # noqa: E402


class Telemetry:
    """pynvml readings of one GPU every `period` s on a thread, as JSON lines."""

    def __init__(self, path, device, period):
        import pynvml as nv

        self.nv, self.period, self.out = nv, period, open(path, "w")
        nv.nvmlInit()
        idx = device.index or 0
        self.h = nv.nvmlDeviceGetHandleByIndex(idx)
        self.stop_flag = threading.Event()
        self.phase = "start"
        self.clocks, self.powers = [], []
        self.means()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def sub_sample(self):
        """One more SM clock and power reading within the period (as the agent's sampler, every
        0.1 s)."""
        nv, h = self.nv, self.h
        try:
            self.clocks.append(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
            self.powers.append(nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
        except nv.NVMLError:
            pass

    def means(self):
        """The mean SM clock and power of the readings since the last call, and the clock
        readings themselves."""
        self.sub_sample()
        clocks, n = self.clocks, len(self.clocks)
        clk = round(sum(clocks) / n, 1) if n else None
        power = round(sum(self.powers) / len(self.powers), 2) if self.powers else None
        self.clocks, self.powers = [], []
        return clk, clocks, power

    def read(self):
        nv, h = self.nv, self.h
        clk, clocks, power = self.means()
        util = nv.nvmlDeviceGetUtilizationRates(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        return {
            "t": round(time.time(), 3),
            "phase": self.phase,
            "sm_mhz": nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
            "max_sm_mhz": nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
            "power_w": nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_mean_mhz": clk,
            "clk_samples": len(clocks),
            "sm_readings": clocks,
            "power_mean_w": power,
            "limit_w": nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0,
            "temp_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
            "util": util.gpu,
            "mem_mib": mem.used // (1 << 20),
            "reasons": nv.nvmlDeviceGetCurrentClocksEventReasons(h),
            "pids": sorted(q.pid for q in nv.nvmlDeviceGetComputeRunningProcesses(h)),
        }

    def run(self):
        while not self.stop_flag.is_set():
            t0 = time.monotonic()
            for k in range(1, int(self.period / 0.1)):
                if self.stop_flag.wait(max(0.0, t0 + 0.1 * k - time.monotonic())):
                    return
                self.sub_sample()
            try:
                self.out.write(json.dumps(self.read()) + "\n")
            except Exception as e:  # a reading the driver lacks: say so once a line
                self.out.write(json.dumps({"t": time.time(), "error": str(e)}) + "\n")
            self.out.flush()
            self.stop_flag.wait(max(0.0, self.period - (time.monotonic() - t0)))

    def stop(self):
        self.stop_flag.set()
        self.thread.join()
        self.out.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=300)
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--steps", required=True)
    p.add_argument("--telemetry")
    p.add_argument("--period", type=float, default=1.0)
    p.add_argument("--ckpt-every", type=float, default=60)
    p.add_argument("--eval-every", type=float, default=45)
    p.add_argument("--stall-every", type=float, default=25)
    a = p.parse_args()
    dev = torch.device(a.device)
    shape = dict(GPT_SHAPES["megatron-gpt"])
    if a.tiny:
        shape.update(vocab=256, ctx=64, layers=2, heads=2, dim=64, batch=2)
    model = Gpt(**shape).to(dev)
    opt = optimizer(model, dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randint(0, shape["vocab"], (shape["batch"], shape["ctx"]), generator=g).to(dev)
    y = torch.roll(x, -1, dims=1)
    tele = Telemetry(a.telemetry, dev, a.period) if a.telemetry else None
    if tele:
        tele.thread.start()
    out = open(a.steps, "w")
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    start = time.monotonic()
    last = {"ckpt": start, "eval": start, "stall": start}
    step = 0

    def phase(name):
        if tele:
            tele.phase = name

    while time.monotonic() - start < a.seconds:
        now = time.monotonic()
        if now - last["ckpt"] >= a.ckpt_every:
            phase("checkpoint")
            state = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
            torch.save(state, "/tmp/watch_ckpt.pt")
            os.remove("/tmp/watch_ckpt.pt")
            last["ckpt"] = time.monotonic()
            continue
        if now - last["eval"] >= a.eval_every:
            phase("eval")
            with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16):
                for _ in range(20):
                    model(x, y)
            sync()
            last["eval"] = time.monotonic()
            continue
        if now - last["stall"] >= a.stall_every:
            phase("stall")
            time.sleep(2.0)
            last["stall"] = time.monotonic()
            continue
        phase("train")
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        ms = (time.perf_counter() - t0) * 1000.0
        out.write(json.dumps({"t": round(time.time(), 3), "step": step, "ms": round(ms, 3)}) + "\n")
        step += 1
    out.close()
    if tele:
        tele.stop()
    print(json.dumps({"steps": step, "seconds": round(time.monotonic() - start, 1)}))


if __name__ == "__main__":
    main()
