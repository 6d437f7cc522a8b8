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
  (8 % below the median) as the fleet simulation draws them: per reading the chance one
  starts, their mean depth and length in readings (bench/gpu/watch_spreads.py --means gives
  the same to `watch_sim`).

  python3 bench/gpu/watch_means.py tele.jsonl [more.jsonl ...]
"""
import json
import statistics as st
import sys

DEFICITS = (0.03, 0.05, 0.06, 0.08)
DIP = 0.08


def cv(values):
    return st.pstdev(values) / st.fmean(values) if len(values) > 1 else 0.0


def below(values):
    """How many of `values` lie at least each of DEFICITS below their median."""
    mid = st.median(values)
    return {f"{d:.0%}": sum(1 for v in values if v <= mid * (1 - d)) for d in DEFICITS}


def dips(rows):
    """Dips of single readings: (readings, starts per reading outside a dip, mean depth, mean
    length, the longest)."""
    readings = [c for r in rows for c in r["sm_readings"]]
    mid = st.median(readings)
    low = [c < mid * (1 - DIP) for c in readings]
    starts = sum(1 for i, x in enumerate(low) if x and (i == 0 or not low[i - 1]))
    dipped = sum(low)
    depth = st.fmean(1 - c / mid for c, x in zip(readings, low) if x) if dipped else 0.0
    longest, run = 0, 0
    for x in low:
        run = run + 1 if x else 0
        longest = max(longest, run)
    return len(readings), starts / max(1, len(readings) - dipped), depth, (dipped / starts if starts else 0.0), longest


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
        power = [r["power_mean_w"] for r in busy if r.get("power_mean_w")]
        print(f"  power: one reading cv {cv([r['power_w'] for r in busy]):.4f}, mean cv {cv(power):.4f}")
        if all(r.get("sm_readings") for r in busy):
            n, p, depth, length, longest = dips(busy)
            print(
                f"  readings: {n}; dips {DIP:.0%} below: {p:.5f} start per reading, "
                f"{depth:.3f} deep, {length:.2f} readings long (the longest {longest})"
            )


if __name__ == "__main__":
    main()
