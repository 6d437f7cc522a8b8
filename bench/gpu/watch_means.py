"""How much steadier the watch's interval means are than one reading (docs/watch.md).

Reads recordings of `bench/gpu/watch_train.py --telemetry FILE` and prints, over the busy
samples (utilization 90 % or more) of the training phase:

- the coefficient of variation of the SM clock read once at each line (`sm_mhz`) against the
  mean of the readings every 0.1 s within its period (`sm_mean_mhz`, as the agent's sampler
  reads it), and the same of the power (`power_w`, `power_mean_w`);
- how many samples of each kind fall 3, 5, 6 and 8 % below the recording's median: the
  judgement calls a sample low only past `clock_gap` (6 %), so these are its false-alarm
  material;
- where the lines carry the readings themselves (`sm_readings`), the dips of single readings
  (8 % below the median) as the fleet simulation draws them, counted by
  bench/gpu/watch_spreads.py (whose --means gives them to `watch_sim`): per reading the chance
  one starts, their mean depth, and their lengths in readings; and the same spread and counts
  for the median of each sample's readings (the sampler's alternative to their mean, which a dip
  of fewer than half the readings leaves unmoved: `watch_sim`'s `statistic`).

  python3 bench/gpu/watch_means.py tele.jsonl [more.jsonl ...]
"""
import json
import os
import statistics as st
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from watch_spreads import DIP, reading_dips  # noqa: E402

DEFICITS = (0.03, 0.05, 0.06, 0.08)


def cv(values):
    return st.pstdev(values) / st.fmean(values) if len(values) > 1 else 0.0


def below(values):
    """How many of `values` lie at least each of DEFICITS below their median."""
    mid = st.median(values)
    return {f"{d:.0%}": sum(1 for v in values if v <= mid * (1 - d)) for d in DEFICITS}


def main():
    for path in sys.argv[1:]:
        try:
            with open(path) as f:
                rows = [json.loads(line) for line in f if line.strip() and '"error"' not in line]
        except FileNotFoundError:
            print(path, "missing")
            continue
        busy = [
            r
            for r in rows
            if r.get("phase", "train") == "train" and (r.get("util") or 0) >= 90 and r.get("sm_mean_mhz")
        ]
        print(f"{path}: {len(rows)} lines, {len(busy)} busy training samples")
        if not busy:
            continue
        one = [r["sm_mhz"] for r in busy]
        mean = [r["sm_mean_mhz"] for r in busy]
        per = st.median(r.get("clk_samples") or len(r.get("sm_readings") or [1]) for r in busy)
        print(f"  clock, one reading:    cv {cv(one):.4f}, min {min(one)} MHz, below the median {below(one)}")
        print(f"  clock, mean of {per:g}: cv {cv(mean):.4f}, min {min(mean):.0f} MHz, below the median {below(mean)}")
        if all(r.get("sm_readings") for r in busy):
            med = [st.median(r["sm_readings"]) for r in busy]
            print(f"  clock, median of {per:g}: cv {cv(med):.4f}, min {min(med):.0f} MHz, below the median {below(med)}")
            d, _ = reading_dips(busy)
            lens = d["dip_lens"]
            print(
                f"  readings: {sum(len(r['sm_readings']) for r in busy)}; dips {DIP:.0%} below: "
                f"{d['dip_p']:.5f} start per reading, {d['dip_depth']:.3f} deep, "
                f"{st.fmean(lens) if lens else 0:.2f} readings long (the longest {max(lens, default=0)})"
            )
        power = [r["power_mean_w"] for r in busy if r.get("power_mean_w")]
        print(f"  power: one reading cv {cv([r['power_w'] for r in busy]):.4f}, mean cv {cv(power):.4f}")


if __name__ == "__main__":
    main()
