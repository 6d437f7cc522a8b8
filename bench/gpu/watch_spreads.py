"""The spreads of the fleet simulation of the watch (bench/watch_sim.rs) from GPU recordings.

Reads the JSON lines that `bench/gpu/watch_train.py --telemetry FILE` writes (one file per GPU:
t, phase, sm_mhz, max_sm_mhz, power_w, limit_w, temp_c, util, mem_mib, reasons, pids) and
prints a spreads JSON for `watch_sim --spreads`: per phase (train, checkpoint, eval, stall) the
mean SM clock, power and utilization and their per-sample coefficients of variation, and for
the phases other than train their length and period as observed; clock dips, a slow drift, the fraction of training samples showing SW power cap, the power limit. What one
recording cannot show is left out (the simulation keeps its default) and said on stderr: the
offsets between GPUs need several files (one per GPU), the skew between nodes several nodes.

With --means the SM clock and power of a sample are the means over its period, as the agent's
sampler reads them. Where the recording also has the readings themselves (`sm_readings`), the
dips are counted reading by reading, as the simulation draws them (`readings` per sample,
`dip_p` per reading, `dip_depth`, and `dip_lens`: each dip's length in readings), and the training clock's spread is
that of the means of the readings outside dips (the simulation adds the dips on top). Without
the readings a dip is a whole sample 8 % below the median (the simulation's `readings` 1).

  python3 bench/gpu/watch_spreads.py tele.jsonl > spreads.json
  python3 bench/gpu/watch_spreads.py --means tele.jsonl > spreads.json
  python3 bench/gpu/watch_spreads.py gpu0.jsonl gpu1.jsonl ... > spreads.json
"""
import argparse
import json
import statistics as st
import sys

PHASES = ("train", "checkpoint", "eval", "stall")
SW_POWER_CAP = 0x4  # nvmlClocksEventReasonSwPowerCap
# A training sample this far below the training median is a dip, not noise.
DIP = 0.08


def reading_dips(rows):
    """Dips of single readings in training rows that carry `sm_readings`: the per-reading start
    chance, mean depth, each dip's length, how many readings a sample is the mean of, and each
    row's clock as the mean of its readings outside dips (rows all in a dip are left out)."""
    readings = [c for r in rows for c in r["sm_readings"]]
    if not readings:
        return None, []
    mid = st.median(readings)
    low = [c < mid * (1 - DIP) for c in readings]
    lens, run = [], 0
    for x in low + [False]:
        if x:
            run += 1
        elif run:
            lens.append(run)
            run = 0
    starts, dipped = len(lens), sum(low)
    stats = {
        "readings": round(st.median(len(r["sm_readings"]) for r in rows)),
        "dip_p": starts / max(1, len(readings) - dipped),
        "dip_depth": st.fmean(1 - c / mid for c, x in zip(readings, low) if x) if dipped else 0.0,
        "dip_lens": lens,
    }
    clocks = []
    for r in rows:
        kept = [c for c in r["sm_readings"] if c >= mid * (1 - DIP)]
        if kept:
            clocks.append(st.fmean(kept))
    return stats, clocks


# Samples per window of the drift.
DRIFT_WINDOW = 60


def read(path, means=False):
    """The recording's rows; with `means`, the SM clock and power of each row are the means over
    its period (what the agent's sampler reads), not the one reading at its instant."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: {e}")
            if "error" in r:
                continue
            if means:
                if r.get("sm_mean_mhz") is None or r.get("power_mean_w") is None:
                    continue
                r["sm_mhz"], r["power_w"] = r["sm_mean_mhz"], r["power_mean_w"]
                if not isinstance(r.get("sm_readings"), list) or not r["sm_readings"]:
                    r.pop("sm_readings", None)
            if r.get("sm_mhz") is None:
                continue
            rows.append(r)
    rows.sort(key=lambda r: r["t"])
    return rows


def cv(values):
    if len(values) < 2:
        return 0.0
    m = st.fmean(values)
    return st.pstdev(values) / m if m else 0.0


def segments(rows):
    """Runs of consecutive samples of one phase: (phase, first index, last index)."""
    out, start = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i]["phase"] != rows[start]["phase"]:
            out.append((rows[start]["phase"], start, i - 1))
            start = i
    return out


def inner(rows, segs, phase):
    """A phase's samples, the first and last of each run left out where the run has more than
    two (a sample at a change of phase is part of both)."""
    out = []
    for p, a, b in segs:
        if p != phase:
            continue
        if b - a >= 2:
            a, b = a + 1, b - 1
        out.extend(rows[a : b + 1])
    return out


def round_all(d, digits=4):
    return {k: (round(v, digits) if isinstance(v, float) else v) for k, v in d.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="+", help="telemetry JSON lines, one file per GPU")
    p.add_argument(
        "--means",
        action="store_true",
        help="the SM clock and power as means over each period (sm_mean_mhz, power_mean_w), as the agent reads them",
    )
    a = p.parse_args()
    recordings = [read(f, a.means) for f in a.files]
    recordings = [r for r in recordings if r]
    if not recordings:
        sys.exit("no readings in the files given")
    note = lambda s: print(f"watch_spreads: {s}", file=sys.stderr)  # noqa: E731
    dt = st.median(b["t"] - a["t"] for r in recordings for a, b in zip(r, r[1:]))
    note(f"{len(recordings)} recording(s), {sum(map(len, recordings))} samples, one every {dt:.2f} s")
    out = {}
    per_gpu_train = []
    for phase in PHASES:
        samples, lens, periods = [], [], []
        # Per recording: its clocks (dips left out), powers; the spreads are within one GPU.
        clock_cvs, power_cvs, kept, dips, depths = [], [], [], 0, []
        per_reading = []
        for rows in recordings:
            segs = segments(rows)
            mine = inner(rows, segs, phase)
            samples.extend(mine)
            starts = [rows[s]["t"] for ph, s, _ in segs if ph == phase]
            lens.extend(rows[e]["t"] - rows[s]["t"] + dt for ph, s, e in segs if ph == phase)
            periods.extend(b - a for a, b in zip(starts, starts[1:]))
            if not mine:
                continue
            clocks = [r["sm_mhz"] for r in mine]
            if phase == "train" and all("sm_readings" in r for r in mine):
                stats, clocks = reading_dips(mine)
                if stats:
                    per_reading.append(stats)
            elif phase == "train":
                mid = st.median(clocks)
                low = [c for c in clocks if c < mid * (1 - DIP)]
                dips += len(low)
                depths.extend(1 - c / mid for c in low)
                clocks = [c for c in clocks if c >= mid * (1 - DIP)]
            kept.extend(clocks)
            clock_cvs.append(cv(clocks))
            power_cvs.append(cv([r["power_w"] for r in mine]))
        if not samples:
            note(f"no {phase} samples: its defaults stay")
            continue
        if phase == "train" and per_reading:
            out["readings"] = round(st.fmean(x["readings"] for x in per_reading))
            seen = [x for x in per_reading if x["dip_p"] > 0]
            if seen:
                out["dip_p"] = st.fmean(x["dip_p"] for x in per_reading)
                out["dip_depth"] = st.fmean(x["dip_depth"] for x in seen)
                out["dip_lens"] = sorted(n for x in seen for n in x["dip_lens"])
            else:
                note("no reading 8 % below the median: the dips' defaults stay (one in 500 readings, 15 % deep)")
            note(
                f"train dips per reading: {out.get('dip_p', 0):.5f} start, {out.get('dip_depth', 0):.3f} deep, "
                f"lengths {out.get('dip_lens', [])} readings, {out['readings']} readings a sample"
            )
        elif phase == "train":
            out["readings"] = 1
            out["dip_p"] = dips / len(samples)
            if depths:
                out["dip_depth"] = st.fmean(depths)
        entry = {
            "sm_mhz": st.fmean(kept),
            "power_w": st.fmean(r["power_w"] for r in samples),
            "util": st.fmean(r["util"] for r in samples),
            "clock_cv": st.fmean(clock_cvs),
            "power_cv": st.fmean(power_cvs),
        }
        if phase != "train":
            entry["len_s"] = st.median(lens)
            if periods:
                entry["every_s"] = st.median(periods)
            else:
                note(f"{phase} seen once: its period is unknown, the length of the recording stands for it")
                entry["every_s"] = max(r[-1]["t"] - r[0]["t"] for r in recordings)
        out[phase] = round_all(entry)
        note(
            f"{phase}: {len(samples)} samples in {len(lens)} runs, clock {entry['sm_mhz']:.0f} MHz "
            f"cv {entry['clock_cv']:.4f}, power {entry['power_w']:.0f} W cv {entry['power_cv']:.4f}"
        )
    for rows in recordings:
        train = inner(rows, segments(rows), "train")
        if train:
            per_gpu_train.append(
                (st.fmean(r["sm_mhz"] for r in train), st.fmean(r["power_w"] for r in train), train)
            )
    if len(per_gpu_train) >= 2:
        out["gpu_offset_cv"] = cv([c for c, _, _ in per_gpu_train])
        out["power_offset_cv"] = cv([w for _, w, _ in per_gpu_train])
    else:
        note("one GPU: gpu_offset_cv and power_offset_cv need several recordings; their defaults stay")
    # The drift: the spread of minute means of the training clock, past what the per-sample
    # noise alone gives a mean of that many samples; a sine of amplitude A has sd A / sqrt 2.
    drifts = []
    for mean, _, train in per_gpu_train:
        w = max(1, round(DRIFT_WINDOW / dt))
        means = [st.fmean(r["sm_mhz"] for r in train[i : i + w]) / mean for i in range(0, len(train) - w + 1, w)]
        if len(means) >= 3:
            noise = cv([r["sm_mhz"] for r in train]) ** 2 / w
            drifts.append(2**0.5 * max(0.0, st.pvariance(means) - noise) ** 0.5)
    if drifts:
        out["drift_cv"] = st.fmean(drifts)
        note("drift_period_s is not estimated (a recording is shorter than the drift): its default stays")
    else:
        note("under three minutes of training: drift_cv's default stays")
    train_all = [r for _, _, t in per_gpu_train for r in t]
    if train_all:
        out["power_cap_fraction"] = sum(1 for r in train_all if int(r.get("reasons") or 0) & SW_POWER_CAP) / len(
            train_all
        )
        utils = [r["util"] for r in train_all]
        out["util_jitter"] = min(100.0, 3**0.5 * st.pstdev(utils)) if len(utils) > 1 else 0.0
    limits = [r["limit_w"] for rows in recordings for r in rows if r.get("limit_w")]
    if limits:
        out["power_limit_w"] = st.median(limits)
    note("phase_skew_s needs several nodes: its default stays")
    print(json.dumps(round_all(out), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
