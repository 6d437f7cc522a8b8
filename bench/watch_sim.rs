//! The watch's judgement over simulated jobs (docs/benchmarks/watch.md): how often it suspects
//! a node of a healthy job (false positives, the goal is none), how often and how soon it names
//! the node of one GPU that turns slow or throttled (recall and latency).
//!
//! Each job is 64 nodes of 8 GPUs sampled every second and summarized every 5 s, as the agents
//! do, and every summary of a period goes through the real judgement
//! (`gpusanity_watch::JobJudge`: the default thresholds, or `--judge FILE`, a JSON object of
//! any of `[watch.judge]`'s fields) before the next period's. A healthy job trains at its GPUs'
//! power cap and goes through its own phases, all its nodes together (each node's instants
//! shifted by up to `phase_skew_s`): checkpoint pauses (GPUs idle, clocks and power down),
//! evaluations (lower clock and power), data-loader stalls. On top: each GPU's
//! static clock and power offset (silicon spread at the cap), per-sample noise, clock dips of
//! single readings (each 1 s sample is the mean of `readings` readings, as the agent's sampler
//! takes it, or their median with `statistic`; a dip lasts `dip_len` readings on average), a slow
//! thermal drift per GPU, and a fraction of GPUs showing the `SW power cap` reason while
//! training. The spreads are [`Spreads`], defaults below, or read from a JSON file
//! (`--spreads FILE`, any subset of the fields; bench/gpu/watch_spreads.py prints one from a
//! recording of bench/gpu/watch_train.py).
//!
//! - **False positives**: `--jobs` healthy jobs of `--hours` each; every suspicion counts.
//! - **Recall**: `--trials` jobs in which one random GPU becomes 10% slower in SM clock at a
//!   random instant (case `slow`), and as many in which one becomes throttled (`hw_slowdown` or
//!   `hw_thermal` set, its clock 10-30% down; case `throttled`). A trial is caught when the
//!   fault's node is suspected with a fitting code (`WATCH_SLOW_CLOCK`, or for `throttled` also
//!   `WATCH_THROTTLED`); the latency runs from the onset to the end of the period whose summary
//!   raised it (also from the first busy second at or after the onset: the judgement only
//!   judges busy GPUs). The caught trials are counted by the rule that raised them (`rules`:
//!   `job_median`, `own_ratio`, or `one_gpu` for `WATCH_THROTTLED`), read from the evidence.
//! - `--profile` times generating summaries alone and judging stored summaries alone.
//!
//! Jobs and trials run on `--threads` threads (default: every core); each job's draws depend
//! only on the seed and its index, so the figures do not depend on the threads.
//!
//! Usage: watch_sim [--quick] [--jobs N] [--hours H] [--trials N] [--seed S] [--threads T]
//! [--spreads FILE] [--judge FILE] [--horizon SECONDS] [--profile] [--no-healthy] [--no-recall]

use std::f64::consts::TAU;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use chrono::{DateTime, TimeZone, Utc};
use gpusanity_common::wire::watch::{GpuTelemetry, SuspectCode, Telemetry, Throttle};
use gpusanity_common::wire::WIRE_VERSION;
use gpusanity_watch::{JobJudge, JudgeConfig, Suspicion};
use serde::{Deserialize, Serialize};
use serde_json::json;

const NODES: usize = 64;
const GPUS_PER_NODE: usize = 8;
const GPUS: usize = NODES * GPUS_PER_NODE;
/// Samples per summary (1 s samples, 5 s periods).
const PERIOD: u64 = 5;
/// The latency goal, seconds.
const GOAL_S: u64 = 10;
/// The seconds a recall trial runs before its onset is drawn from: the judgement's window fills.
const WARMUP_S: u64 = 60;

/// One phase of the job as every GPU shows it: means over its samples and their spread.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Phase {
    /// The phase starts every this many seconds (unused for `train`, the phase between others).
    #[serde(default)]
    every_s: f64,
    /// And lasts this long.
    #[serde(default)]
    len_s: f64,
    /// SM clock, MHz (a GPU of no offset).
    sm_mhz: f64,
    /// Power draw, W.
    power_w: f64,
    /// Utilization, percent.
    util: f64,
    /// Per-sample coefficient of variation of the SM clock, and of the power draw.
    clock_cv: f64,
    power_cv: f64,
}

/// The healthy job's spreads. The defaults describe an H100/H200 training job at its 700 W
/// cap as we expect it, not a measurement; they stay the defaults until a recording of
/// bench/gpu/watch_train.py on GPUs replaces them (bench/gpu/watch_spreads.py).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Spreads {
    /// Steady training: every second not in another phase.
    train: Phase,
    /// Checkpoint pauses: GPUs idle, clocks and power down.
    checkpoint: Phase,
    /// Evaluation: forward passes only, lower power and clock.
    eval: Phase,
    /// Data-loader stalls: GPUs waiting on the host.
    stall: Phase,
    /// Each GPU's static SM clock offset, coefficient of variation (silicon spread at the cap).
    gpu_offset_cv: f64,
    /// Each GPU's static power offset, coefficient of variation.
    power_offset_cv: f64,
    /// The readings each sample is taken from (the agent's sampler: one every 100 ms over a
    /// 1 s interval); 1 is one instantaneous reading per sample.
    readings: u32,
    /// How a sample is taken from its readings: their `mean` or their `median`.
    statistic: Statistic,
    /// Per reading outside a dip, the probability that a clock dip starts, and its depth
    /// (fraction of the clock). A dip of one reading moves a sample by `dip_depth / readings`.
    dip_p: f64,
    dip_depth: f64,
    /// The dips' lengths in readings, drawn from `dip_lens` (as a recording showed them, one
    /// entry per dip) when given, else geometric of mean `dip_len`.
    dip_len: f64,
    dip_lens: Vec<u32>,
    /// Slow thermal drift: each GPU's clock follows a sine of this amplitude (coefficient of
    /// variation across GPUs of the amplitude, drawn normal) and period.
    drift_cv: f64,
    drift_period_s: f64,
    /// The fraction of GPUs that show `SW power cap` while training.
    power_cap_fraction: f64,
    /// Utilization jitter per sample, percent points (uniform, either way).
    util_jitter: f64,
    /// Each node's phase changes come up to this many seconds after the job's (uniform).
    phase_skew_s: f64,
    /// The enforced power limit of every GPU, W.
    power_limit_w: f64,
}

impl Default for Spreads {
    fn default() -> Self {
        let phase = |every_s, len_s, sm_mhz, power_w, util, clock_cv, power_cv| Phase {
            every_s,
            len_s,
            sm_mhz,
            power_w,
            util,
            clock_cv,
            power_cv,
        };
        Spreads {
            train: phase(0.0, 0.0, 1830.0, 680.0, 99.0, 0.010, 0.03),
            checkpoint: phase(1800.0, 45.0, 1200.0, 150.0, 3.0, 0.05, 0.10),
            eval: phase(900.0, 60.0, 1700.0, 520.0, 90.0, 0.015, 0.05),
            stall: phase(300.0, 3.0, 1500.0, 300.0, 20.0, 0.03, 0.10),
            gpu_offset_cv: 0.01,
            power_offset_cv: 0.03,
            readings: 10,
            statistic: Statistic::Mean,
            dip_p: 0.002,
            dip_depth: 0.15,
            dip_len: 1.0,
            dip_lens: Vec::new(),
            drift_cv: 0.005,
            drift_period_s: 3600.0,
            power_cap_fraction: 0.3,
            util_jitter: 3.0,
            phase_skew_s: 0.5,
            power_limit_w: 700.0,
        }
    }
}

/// A small fast generator (wyrand); seeded per job, so that threads do not matter.
struct Rng {
    s: u64,
    spare: Option<f64>,
}

impl Rng {
    fn new(seed: u64, stream: u64, index: u64) -> Rng {
        let mut r = Rng { s: seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15), spare: None };
        r.s ^= index.wrapping_mul(0xbf58_476d_1ce4_e5b9);
        for _ in 0..4 {
            r.next();
        }
        r
    }

    fn next(&mut self) -> u64 {
        self.s = self.s.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.s).wrapping_mul(u128::from(self.s ^ 0xe703_7ed1_a0b4_28db));
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }

    /// Standard normal (Marsaglia's polar method, both values used).
    fn normal(&mut self) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        loop {
            let u = 2.0 * self.unit() - 1.0;
            let v = 2.0 * self.unit() - 1.0;
            let s = u * u + v * v;
            if s > 0.0 && s < 1.0 {
                let f = (-2.0 * s.ln() / s).sqrt();
                self.spare = Some(v * f);
                return u * f;
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PhaseId {
    Train,
    Checkpoint,
    Eval,
    Stall,
}

/// What goes wrong in a recall trial.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Fault {
    /// The GPU's SM clock is this fraction of its healthy clock from the onset.
    Slow(f64),
    /// Hardware slowdown (`thermal`: HW thermal slowdown instead), clock times the fraction.
    Throttled { thermal: bool, clock: f64 },
}

#[derive(Debug, Clone, Copy)]
struct Gpu {
    clock: f64,
    power: f64,
    drift_amp: f64,
    drift_phase: f64,
    capped: bool,
    /// The readings of a dip still to come (a dip may run on into the next sample).
    dip_left: u32,
}

/// How the sampler takes a sample from its readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Statistic {
    Mean,
    Median,
}

impl Statistic {
    /// The share of a dip's depth a sample of `n` readings shows when `dipped` of them are in
    /// one (all dips equally deep).
    fn dip_weight(self, dipped: u32, n: u32) -> f64 {
        match self {
            Statistic::Mean => f64::from(dipped) / f64::from(n),
            // The dipped readings are the lowest; the median is the mean of the readings at
            // 0-based ranks (n - 1) / 2 and n / 2 (one reading when n is odd).
            Statistic::Median => {
                (f64::from(u8::from(dipped > (n - 1) / 2)) + f64::from(u8::from(dipped > n / 2))) / 2.0
            }
        }
    }
}

/// The readings of one sample and their dips. A dip starts at a reading outside one with
/// probability `p`; its length in readings is drawn from `lens` (the lengths a recording showed)
/// or, without them, geometric of mean `dip_len`; it may run on into the next sample.
#[derive(Debug, Clone)]
struct Dips {
    readings: u32,
    /// `ln(1 - p)`, negative; none when no dip ever starts.
    ln_q: Option<f64>,
    lens: Vec<u32>,
    /// `ln` of the chance a dip goes on one more reading (geometric lengths), negative; none:
    /// one reading.
    ln_go_on: Option<f64>,
}

impl Dips {
    fn new(sp: &Spreads) -> Dips {
        let p = sp.dip_p.clamp(0.0, 1.0);
        // ln_1p: `(1.0 - x).ln()` is 0 for an x below the f64 epsilon (a dip at every reading,
        // a dip of one reading); `ln_1p(-x)` stays negative.
        Dips {
            readings: sp.readings.max(1),
            ln_q: (p > 0.0).then(|| (-p).ln_1p()),
            lens: sp.dip_lens.iter().copied().filter(|l| *l > 0).collect(),
            ln_go_on: (sp.dip_len > 1.0).then(|| (-1.0 / sp.dip_len).ln_1p()),
        }
    }

    /// Readings before the next dip starts (geometric, from one draw).
    fn gap(&self, rng: &mut Rng) -> u64 {
        match self.ln_q {
            Some(ln_q) => ((1.0 - rng.unit()).ln() / ln_q).floor().min(u64::MAX as f64) as u64,
            None => u64::MAX,
        }
    }

    /// A dip's length in readings.
    fn len(&self, rng: &mut Rng) -> u32 {
        if !self.lens.is_empty() {
            return self.lens[rng.below(self.lens.len() as u64) as usize];
        }
        match self.ln_go_on {
            Some(ln) => 1 + ((1.0 - rng.unit()).ln() / ln).floor().min(f64::from(u32::MAX - 1)) as u32,
            None => 1,
        }
    }

    /// How many of the sample's readings are in a dip; `left` carries the readings of a dip
    /// still to come into the next sample. One draw decides the common case (no dip starts).
    fn dipped(&self, rng: &mut Rng, left: &mut u32) -> u32 {
        let n = self.readings;
        let mut dipped = (*left).min(n);
        *left -= dipped;
        let mut at = dipped;
        while at < n {
            let gap = self.gap(rng);
            if gap >= u64::from(n - at) {
                break;
            }
            let start = at + gap as u32;
            let len = self.len(rng);
            let here = len.min(n - start);
            dipped += here;
            *left = len - here;
            at = start + here;
        }
        dipped
    }
}

/// One job: its GPUs' static draws, its phase schedule, its nodes' summaries (reused).
struct Job<'a> {
    sp: &'a Spreads,
    dips: Dips,
    rng: Rng,
    gpus: Vec<Gpu>,
    skew: Vec<f64>,
    /// Each periodic phase's offset into its cycle.
    offsets: [f64; 3],
    summaries: Vec<Telemetry>,
    fault: Option<(usize, u64, Fault)>,
}

fn t0() -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000, 0).single().expect("time")
}

impl<'a> Job<'a> {
    fn new(sp: &'a Spreads, mut rng: Rng) -> Job<'a> {
        let gpus = (0..GPUS)
            .map(|_| Gpu {
                clock: 1.0 + sp.gpu_offset_cv * rng.normal(),
                power: 1.0 + sp.power_offset_cv * rng.normal(),
                drift_amp: sp.drift_cv * rng.normal(),
                drift_phase: TAU * rng.unit(),
                capped: rng.unit() < sp.power_cap_fraction,
                dip_left: 0,
            })
            .collect();
        let skew = (0..NODES).map(|_| sp.phase_skew_s * rng.unit()).collect();
        let offsets = [sp.checkpoint.every_s, sp.eval.every_s, sp.stall.every_s].map(|e| e * rng.unit());
        let summaries = (0..NODES)
            .map(|n| Telemetry {
                version: WIRE_VERSION,
                node: format!("node-{n:02}"),
                agent_id: format!("agent-{n:02}"),
                job_id: "job".into(),
                run_id: "run".into(),
                from: t0(),
                interval_ms: 1000,
                gpus: (0..GPUS_PER_NODE)
                    .map(|g| GpuTelemetry {
                        gpu: format!("GPU-{n:02}-{g}"),
                        sm_mhz: Vec::with_capacity(PERIOD as usize),
                        power_w: Vec::with_capacity(PERIOD as usize),
                        util_pct: Vec::with_capacity(PERIOD as usize),
                        power_limit_w: Some(sp.power_limit_w as f32),
                        ..Default::default()
                    })
                    .collect(),
            })
            .collect();
        Job { sp, dips: Dips::new(sp), rng, gpus, skew, offsets, summaries, fault: None }
    }

    /// The job's phase at instant `t` (seconds): a checkpoint over an evaluation over a stall.
    fn phase(&self, t: f64) -> PhaseId {
        let sp = self.sp;
        let within = |p: &Phase, off: f64| p.every_s > 0.0 && (t - off).rem_euclid(p.every_s) < p.len_s;
        if within(&sp.checkpoint, self.offsets[0]) {
            PhaseId::Checkpoint
        } else if within(&sp.eval, self.offsets[1]) {
            PhaseId::Eval
        } else if within(&sp.stall, self.offsets[2]) {
            PhaseId::Stall
        } else {
            PhaseId::Train
        }
    }

    /// Fills every node's summary of the period starting at second `s`.
    fn period(&mut self, s: u64) {
        let from = t0() + chrono::Duration::seconds(s as i64);
        let drift_w = TAU / self.sp.drift_period_s.max(1.0);
        for n in 0..NODES {
            let phases: [PhaseId; PERIOD as usize] =
                std::array::from_fn(|i| self.phase((s + i as u64) as f64 + self.skew[n]));
            let Job { sp, dips, rng, gpus, summaries, fault, .. } = self;
            let summary = &mut summaries[n];
            summary.from = from;
            for (g, t) in summary.gpus.iter_mut().enumerate() {
                let k = n * GPUS_PER_NODE + g;
                let gpu = &mut gpus[k];
                let drift = 1.0 + gpu.drift_amp * (drift_w * s as f64 + gpu.drift_phase).sin();
                let fault = fault.filter(|(f, _, _)| *f == k);
                t.sm_mhz.clear();
                t.power_w.clear();
                t.util_pct.clear();
                t.throttle = Throttle::default();
                for (i, p) in phases.iter().enumerate() {
                    let ph = match p {
                        PhaseId::Train => &sp.train,
                        PhaseId::Checkpoint => &sp.checkpoint,
                        PhaseId::Eval => &sp.eval,
                        PhaseId::Stall => &sp.stall,
                    };
                    let mut clock = ph.sm_mhz * gpu.clock * drift * (1.0 + ph.clock_cv * rng.normal());
                    let dipped = dips.dipped(rng, &mut gpu.dip_left);
                    if dipped > 0 {
                        clock *= 1.0 - sp.dip_depth * sp.statistic.dip_weight(dipped, dips.readings);
                    }
                    if let Some((_, _, f)) = fault.filter(|(_, onset, _)| s + i as u64 >= *onset) {
                        match f {
                            Fault::Slow(x) => clock *= x,
                            Fault::Throttled { thermal, clock: x } => {
                                clock *= x;
                                if thermal {
                                    t.throttle.hw_thermal += 1;
                                } else {
                                    t.throttle.hw_slowdown += 1;
                                }
                            }
                        }
                    }
                    let power = ph.power_w * gpu.power * (1.0 + ph.power_cv * rng.normal());
                    let util = ph.util + sp.util_jitter * (2.0 * rng.unit() - 1.0);
                    t.sm_mhz.push(Some(clock.max(0.0).round() as u32));
                    t.power_w.push(Some(power.clamp(0.0, sp.power_limit_w * 1.05) as f32));
                    t.util_pct.push(Some(util.clamp(0.0, 100.0).round() as u8));
                    if gpu.capped && *p == PhaseId::Train {
                        t.throttle.sw_power_cap += 1;
                    }
                }
            }
        }
    }
}

/// What one job gave the judgement: each suspicion with the second it was raised at.
fn run_job(
    job: &mut Job,
    judge: &mut JobJudge,
    from_s: u64,
    to_s: u64,
    stop: impl Fn(u64, &Suspicion) -> bool,
) -> Vec<(u64, Suspicion)> {
    let mut out = Vec::new();
    let mut s = from_s;
    while s < to_s {
        job.period(s);
        let mut done = false;
        for t in &job.summaries {
            for x in judge.observe(t) {
                done |= stop(s + PERIOD, &x);
                out.push((s + PERIOD, x));
            }
        }
        if done {
            break;
        }
        s += PERIOD;
    }
    out
}

/// Runs `count` items on `threads` threads; `f(index)` gives one item's result.
fn parallel<T: Send>(count: usize, threads: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let next = AtomicUsize::new(0);
    let out = Mutex::new(Vec::with_capacity(count));
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= count {
                    break;
                }
                let r = f(i);
                out.lock().expect("lock").push((i, r));
            });
        }
    });
    let mut v = out.into_inner().expect("lock");
    v.sort_by_key(|(i, _)| *i);
    v.into_iter().map(|(_, r)| r).collect()
}

struct Args {
    jobs: usize,
    hours: f64,
    trials: usize,
    seed: u64,
    threads: usize,
    spreads: Spreads,
    spreads_from: String,
    /// The judgement's thresholds (`[watch.judge]` of the service's configuration).
    judge: JudgeConfig,
    judge_from: String,
    horizon: u64,
    profile: bool,
    healthy: bool,
    recall: bool,
}

fn args() -> Result<Args, Box<dyn std::error::Error>> {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let mut a = Args {
        jobs: 5000,
        hours: 2.0,
        trials: 2000,
        seed: 48,
        threads: cores,
        spreads: Spreads::default(),
        spreads_from: "defaults".into(),
        judge: JudgeConfig::default(),
        judge_from: "default".into(),
        horizon: 180,
        profile: false,
        healthy: true,
        recall: true,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--quick" => {
                a.jobs = 8;
                a.hours = 1.0;
                a.trials = 200;
            }
            "--jobs" => a.jobs = value()?.parse()?,
            "--hours" => a.hours = value()?.parse()?,
            "--trials" => a.trials = value()?.parse()?,
            "--seed" => a.seed = value()?.parse()?,
            "--threads" => a.threads = value()?.parse()?,
            "--horizon" => a.horizon = value()?.parse()?,
            "--spreads" => {
                let path = value()?;
                a.spreads = read_json(&path)?;
                a.spreads_from = path;
            }
            "--judge" => {
                let path = value()?;
                a.judge = read_json(&path)?;
                a.judge.validate().map_err(|e| format!("{path}: {e}"))?;
                a.judge_from = path;
            }
            "--profile" => a.profile = true,
            "--no-healthy" => a.healthy = false,
            "--no-recall" => a.recall = false,
            _ => return Err(format!("unknown argument {arg}; usage: watch_sim [--quick] [--jobs N] [--hours H] [--trials N] [--seed S] [--threads T] [--spreads FILE] [--judge FILE] [--horizon SECONDS] [--profile] [--no-healthy] [--no-recall]").into()),
        }
    }
    Ok(a)
}

/// The JSON object in the file at `path`; an error names the file.
fn read_json<T: serde::de::DeserializeOwned>(path: &str) -> Result<T, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{path}: {e}"))
}

/// Min, median, p99 and max of `v` (sorted in place); zeros when empty.
fn quantiles(v: &mut [u64]) -> [u64; 4] {
    if v.is_empty() {
        return [0; 4];
    }
    v.sort_unstable();
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    [v[0], at(0.5), at(0.99), v[v.len() - 1]]
}

#[derive(Default)]
struct Healthy {
    seconds: u64,
    suspicions: Vec<(usize, u64, Suspicion)>,
}

fn healthy(a: &Args) -> (Healthy, f64) {
    let seconds = ((a.hours * 3600.0) as u64).div_ceil(PERIOD) * PERIOD;
    let start = Instant::now();
    let per_job = parallel(a.jobs, a.threads, |i| {
        let mut job = Job::new(&a.spreads, Rng::new(a.seed, 1, i as u64));
        let mut judge = JobJudge::new(a.judge.clone()).expecting(NODES);
        run_job(&mut job, &mut judge, 0, seconds, |_, _| false)
    });
    let wall = start.elapsed().as_secs_f64();
    let mut h = Healthy { seconds: seconds * a.jobs as u64, ..Default::default() };
    for (i, found) in per_job.into_iter().enumerate() {
        h.suspicions.extend(found.into_iter().map(|(at, s)| (i, at, s)));
    }
    (h, wall)
}

/// Which rule raised a suspicion, from its evidence.
fn rule(s: &Suspicion) -> &'static str {
    if s.evidence.contains("own usual ratio") {
        "own_ratio"
    } else if s.evidence.contains("against the job's median") {
        "job_median"
    } else {
        "one_gpu"
    }
}

struct Trial {
    /// Latency from the onset, from the first busy second, the code and the rule.
    caught: Option<(u64, u64, SuspectCode, &'static str)>,
    wrong: Vec<(u64, Suspicion)>,
    onset_phase: PhaseId,
    /// The faulty GPU's static clock offset (1 is the job's typical GPU).
    offset: f64,
    fault: Fault,
}

fn trial(a: &Args, case: u64, i: usize) -> Trial {
    let mut rng = Rng::new(a.seed, 2 + case, i as u64);
    let gpu = rng.below(GPUS as u64) as usize;
    let onset = WARMUP_S + rng.below(60);
    let fault = if case == 0 {
        Fault::Slow(0.9)
    } else {
        Fault::Throttled { thermal: rng.unit() < 0.5, clock: 0.7 + 0.2 * rng.unit() }
    };
    let mut job = Job::new(&a.spreads, rng);
    job.fault = Some((gpu, onset, fault));
    let node = job.summaries[gpu / GPUS_PER_NODE].node.clone();
    // A suspicion raised before the onset is not the fault's, whatever its node.
    let fits = |at: u64, s: &Suspicion| {
        at > onset
            && s.node == node
            && (s.code == SuspectCode::WatchSlowClock || (case == 1 && s.code == SuspectCode::WatchThrottled))
    };
    let onset_phase = job.phase(onset as f64);
    // The first second at or after the onset when the job is busy (training or evaluating).
    let busy_from =
        (onset..onset + 3600).find(|t| matches!(job.phase(*t as f64), PhaseId::Train | PhaseId::Eval)).unwrap_or(onset);
    let mut judge = JobJudge::new(a.judge.clone()).expecting(NODES);
    let found = run_job(&mut job, &mut judge, 0, onset + a.horizon, fits);
    let offset = job.gpus[gpu].clock;
    let mut t = Trial { caught: None, wrong: Vec::new(), onset_phase, offset, fault };
    for (at, s) in found {
        if fits(at, &s) && t.caught.is_none() {
            t.caught = Some((at - onset, at.saturating_sub(busy_from), s.code, rule(&s)));
        } else if !fits(at, &s) {
            t.wrong.push((at, s));
        }
    }
    t
}

fn profile(a: &Args) {
    let periods = 360u64;
    let mut job = Job::new(&a.spreads, Rng::new(a.seed, 9, 0));
    let start = Instant::now();
    let mut stored = Vec::with_capacity(periods as usize);
    for p in 0..periods {
        job.period(p * PERIOD);
        stored.push(job.summaries.clone());
    }
    let gen = start.elapsed().as_secs_f64();
    let samples = (periods * PERIOD) as f64 * GPUS as f64;
    let start = Instant::now();
    let mut judge = JobJudge::new(a.judge.clone()).expecting(NODES);
    let mut raised = 0;
    for period in &stored {
        for t in period {
            raised += judge.observe(std::hint::black_box(t)).len();
        }
    }
    let judged = start.elapsed().as_secs_f64();
    let line = json!({
        "kind": "profile", "periods": periods, "gpu_samples": samples,
        "generate_ns_per_gpu_sample": 1e9 * gen / samples,
        "judge_ns_per_gpu_sample": 1e9 * judged / samples,
        "judge_us_per_summary": 1e6 * judged / (periods as f64 * NODES as f64),
        "suspicions": raised,
    });
    println!("{line}");
}

/// Runs the healthy jobs, prints their JSON line and returns their table row.
fn report_healthy(a: &Args) -> String {
    let (h, wall) = healthy(a);
    let job_hours = h.seconds as f64 / 3600.0;
    let samples = h.seconds as f64 * GPUS as f64;
    let jobs_hit = {
        let mut j: Vec<usize> = h.suspicions.iter().map(|(i, _, _)| *i).collect();
        j.dedup();
        j.len()
    };
    let mut by_code = std::collections::BTreeMap::new();
    for (_, _, s) in &h.suspicions {
        *by_code.entry(s.code.as_str()).or_insert(0usize) += 1;
    }
    let examples: Vec<_> = h
        .suspicions
        .iter()
        .take(5)
        .map(|(i, at, s)| json!({"job": i, "at_s": at, "node": s.node, "gpu": s.gpu, "code": s.code.as_str(), "rule": rule(s), "evidence": s.evidence}))
        .collect();
    let core_s = wall * a.threads as f64;
    println!(
        "{}",
        json!({
            "kind": "healthy", "jobs": a.jobs, "hours_per_job": a.hours, "job_hours": job_hours,
            "gpu_samples": samples, "suspicions": h.suspicions.len(), "jobs_with_suspicions": jobs_hit,
            "by_code": by_code, "examples": examples, "wall_s": wall, "threads": a.threads,
            "core_s_per_1000_job_hours": core_s * 1000.0 / job_hours,
            "ns_per_gpu_sample_per_core": 1e9 * core_s / samples,
        })
    );
    format!(
        "| healthy | {job_hours:.1} job-hours ({} jobs), {samples:.3e} GPU-samples | {} suspicions in {jobs_hit} jobs | | {wall:.1} s |",
        a.jobs,
        h.suspicions.len()
    )
}

/// Runs the recall trials of one case, prints their JSON line and returns their table row.
fn report_recall(a: &Args, case: u64, name: &str) -> String {
    let start = Instant::now();
    let trials = parallel(a.trials, a.threads, |i| trial(a, case, i));
    let wall = start.elapsed().as_secs_f64();
    let caught: Vec<_> = trials.iter().filter_map(|t| t.caught).collect();
    let mut lat: Vec<u64> = caught.iter().map(|c| c.0).collect();
    let mut busy_lat: Vec<u64> = caught.iter().map(|c| c.1).collect();
    let within = lat.iter().filter(|l| **l <= GOAL_S).count();
    let busy_within = busy_lat.iter().filter(|l| **l <= GOAL_S).count();
    let wrong: usize = trials.iter().map(|t| t.wrong.len()).sum();
    let wrong_examples: Vec<_> = trials
        .iter()
        .flat_map(|t| t.wrong.iter())
        .take(5)
        .map(|(at, s)| json!({"at_s": at, "node": s.node, "code": s.code.as_str(), "rule": rule(s), "evidence": s.evidence}))
        .collect();
    let (mut codes, mut rules) = (std::collections::BTreeMap::new(), std::collections::BTreeMap::new());
    for c in &caught {
        *codes.entry(c.2.as_str()).or_insert(0usize) += 1;
        *rules.entry(c.3).or_insert(0usize) += 1;
    }
    // The trials caught late or not at all: by the job's phase at the onset, and the first
    // few with the GPU's static offset.
    let late: Vec<&Trial> = trials.iter().filter(|t| t.caught.is_none_or(|c| c.0 > GOAL_S)).collect();
    let mut late_by_phase = std::collections::BTreeMap::new();
    for t in &late {
        *late_by_phase.entry(format!("{:?}", t.onset_phase)).or_insert(0usize) += 1;
    }
    let late_examples: Vec<_> = late
        .iter()
        .take(8)
        .map(|t| {
            json!({"onset_phase": format!("{:?}", t.onset_phase), "offset": (t.offset * 1e4).round() / 1e4,
                "fault": format!("{:?}", t.fault), "latency_s": t.caught.map(|c| c.0),
                "from_busy_s": t.caught.map(|c| c.1)})
        })
        .collect();
    let q = quantiles(&mut lat);
    let qb = quantiles(&mut busy_lat);
    let n = a.trials as f64;
    println!(
        "{}",
        json!({
            "kind": "recall", "case": name, "trials": a.trials, "caught": caught.len(),
            "recall": caught.len() as f64 / n, "within_10s": within as f64 / n,
            "within_10s_of_busy": busy_within as f64 / n,
            "latency_s": {"min": q[0], "median": q[1], "p99": q[2], "max": q[3]},
            "latency_from_busy_s": {"min": qb[0], "median": qb[1], "p99": qb[2], "max": qb[3]},
            "codes": codes, "rules": rules, "wrong_suspicions": wrong, "wrong_examples": wrong_examples,
            "late_or_missed_by_onset_phase": late_by_phase, "late_or_missed_examples": late_examples, "horizon_s": a.horizon, "wall_s": wall,
        })
    );
    format!(
        "| {name} | {} trials | caught {:.2}%, within 10 s {:.2}% ({:.2}% from busy); {wrong} other suspicions | {} / {} / {} / {} s ({} / {} / {} / {} s from busy) | {wall:.1} s |",
        a.trials,
        100.0 * caught.len() as f64 / n,
        100.0 * within as f64 / n,
        100.0 * busy_within as f64 / n,
        q[0], q[1], q[2], q[3], qb[0], qb[1], qb[2], qb[3]
    )
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let a = args()?;
    println!(
        "watch_sim: {} nodes x {} GPUs, 1 s samples, {} s summaries; judgement: {}; spreads: {}; seed {}, {} threads",
        NODES, GPUS_PER_NODE, PERIOD, a.judge_from, a.spreads_from, a.seed, a.threads
    );
    println!("{}", json!({"kind": "spreads", "from": a.spreads_from, "spreads": a.spreads}));
    println!("{}", json!({"kind": "judge", "from": a.judge_from, "judge": a.judge}));
    if a.profile {
        profile(&a);
    }
    let mut table = Vec::new();
    if a.healthy && a.jobs > 0 {
        table.push(report_healthy(&a));
    }
    if a.recall && a.trials > 0 {
        for (case, name) in [(0u64, "slow"), (1, "throttled")] {
            table.push(report_recall(&a, case, name));
        }
    }
    println!("| case | size | result | latency min / median / p99 / max | wall |");
    println!("|---|---|---|---|---|");
    for row in table {
        println!("{row}");
    }
    Ok(())
}
