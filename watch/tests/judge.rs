//! The judgement over a synthetic job: 8 nodes of 8 GPUs publishing 5-sample summaries, with
//! small per-GPU and per-sample spreads and the job's own phases (a checkpoint pause, an
//! evaluation at lower clocks, a data-loader stall), in which all GPUs move together.

use chrono::{DateTime, TimeZone, Utc};
use gpusanity_common::wire::watch::{ForeignProcess, GpuTelemetry, SuspectCode, Telemetry, Throttle};
use gpusanity_common::wire::WIRE_VERSION;
use gpusanity_watch::{JobJudge, JudgeConfig, Suspicion};

const NODES: usize = 8;
const GPUS: usize = 8;
const PERIOD: usize = 5;

/// A small deterministic generator (the test needs no statistical quality, only spread).
struct Lcg(u64);
impl Lcg {
    fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64) / ((1u64 << 53) as f64) - 0.5
    }
}

fn t0() -> DateTime<Utc> {
    Utc.timestamp_opt(1_800_000_000, 0).single().expect("time")
}

/// The job's phase at second `s`: (clock scale, utilization).
fn phase(s: usize) -> (f64, u8) {
    match s % 120 {
        60..=67 => (0.55, 5),   // checkpoint: GPUs idle, clocks drop
        90..=95 => (0.92, 85),  // evaluation
        110..=111 => (0.7, 20), // data loader stall
        _ => (1.0, 100),
    }
}

/// The summaries of every node for the period starting at second `s`; `slow(node, gpu, second)`
/// scales a GPU's clock.
fn period(rng: &mut Lcg, s: usize, slow: &dyn Fn(usize, usize, usize) -> f64) -> Vec<Telemetry> {
    (0..NODES)
        .map(|n| {
            let gpus = (0..GPUS)
                .map(|g| {
                    let offset = 1.0 + 0.01 * (((n * GPUS + g) * 7919 % 17) as f64 / 17.0 - 0.5);
                    let mut t =
                        GpuTelemetry { gpu: format!("GPU-{n}-{g}"), power_limit_w: Some(700.0), ..Default::default() };
                    for i in 0..PERIOD {
                        let (scale, util) = phase(s + i);
                        let mhz = 1980.0 * scale * offset * slow(n, g, s + i) * (1.0 + 0.008 * rng.unit());
                        t.sm_mhz.push(Some(mhz.round() as u32));
                        t.power_w.push(Some((650.0 * scale * (1.0 + 0.03 * rng.unit())) as f32));
                        t.util_pct.push(Some(util));
                    }
                    if scale_busy(s) {
                        t.throttle = Throttle { sw_power_cap: 3, ..Default::default() };
                    }
                    t
                })
                .collect();
            Telemetry {
                version: WIRE_VERSION,
                node: format!("node-{n}"),
                agent_id: format!("agent-{n}"),
                job_id: "job".into(),
                run_id: "run".into(),
                from: t0() + chrono::Duration::seconds(s as i64),
                interval_ms: 1000,
                gpus,
            }
        })
        .collect()
}

fn scale_busy(s: usize) -> bool {
    phase(s).1 == 100
}

/// Runs `seconds` of the job through one judge; each suspicion with the second it was raised at
/// (the end of the period whose summary raised it).
fn run(
    seconds: usize,
    slow: &dyn Fn(usize, usize, usize) -> f64,
    edit: &dyn Fn(usize, &mut Telemetry),
) -> Vec<(usize, Suspicion)> {
    let mut judge = JobJudge::new(JudgeConfig::default());
    let mut rng = Lcg(42);
    let mut out = Vec::new();
    for s in (0..seconds).step_by(PERIOD) {
        for mut t in period(&mut rng, s, slow) {
            edit(s, &mut t);
            out.extend(judge.observe(&t).into_iter().map(|x| (s + PERIOD, x)));
        }
    }
    out
}

#[test]
fn a_healthy_job_through_its_phases_raises_nothing() {
    let found = run(1200, &|_, _, _| 1.0, &|_, _| {});
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn one_gpu_ten_percent_slower_from_second_30_is_suspected_within_10_s() {
    let slow = |n: usize, g: usize, s: usize| if n == 5 && g == 3 && s >= 32 { 0.9 } else { 1.0 };
    let found = run(300, &slow, &|_, _| {});
    assert_eq!(found.len(), 1, "{found:?}");
    let (at, s) = &found[0];
    assert_eq!((s.node.as_str(), s.gpu.as_str(), s.code), ("node-5", "GPU-5-3", SuspectCode::WatchSlowClock));
    assert!(*at <= 32 + 10, "raised at second {at}, onset at 32");
    assert_eq!(s.since, t0() + chrono::Duration::seconds(32), "{s:?}");
    assert!(s.evidence.contains("SM clock"), "{}", s.evidence);
}

#[test]
fn a_slow_gpu_only_through_a_checkpoint_is_not_suspected() {
    // Slow only while the job's GPUs are idle: nothing is judged then.
    let slow =
        |n: usize, g: usize, s: usize| if n == 2 && g == 0 && (60..=67).contains(&(s % 120)) { 0.5 } else { 1.0 };
    assert!(run(600, &slow, &|_, _| {}).is_empty());
}

#[test]
fn a_foreign_process_and_a_lowered_power_limit_are_named_once_each() {
    let found = run(60, &|_, _, _| 1.0, &|s, t| {
        if t.node == "node-1" && s >= 20 {
            t.gpus[2].foreign = vec![ForeignProcess { pid: 99, name: "python3".into(), used_mib: Some(1024) }];
        }
        if t.node == "node-6" && s >= 40 {
            t.gpus[7].power_limit_w = Some(500.0);
        }
    });
    let codes: Vec<(&str, SuspectCode, usize)> = found.iter().map(|(at, s)| (s.node.as_str(), s.code, *at)).collect();
    assert_eq!(
        codes,
        vec![("node-1", SuspectCode::WatchForeignProcess, 25), ("node-6", SuspectCode::WatchPowerLimitLow, 45)]
    );
}

#[test]
fn a_late_or_replayed_summary_judges_nothing_twice() {
    let mut judge = JobJudge::new(JudgeConfig::default());
    let mut rng = Lcg(7);
    let slow = |n: usize, g: usize, _s: usize| if n == 0 && g == 0 { 0.8 } else { 1.0 };
    let mut all = Vec::new();
    for s in (0..40).step_by(PERIOD) {
        let ts = period(&mut rng, s, &slow);
        for t in ts.iter().chain(ts.iter()) {
            all.extend(judge.observe(t));
        }
    }
    assert_eq!(all.len(), 1, "{all:?}");
}

#[test]
fn one_gpu_alone_is_never_judged_against_peers() {
    let mut judge = JobJudge::new(JudgeConfig::default());
    let mut rng = Lcg(3);
    for s in (0..100).step_by(PERIOD) {
        let mut t = period(&mut rng, s, &|_, _, _| 0.5).remove(0);
        t.gpus.truncate(1);
        assert!(judge.observe(&t).is_empty());
    }
}
