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

/// A job's shape: its phases, each GPU's clock apart from the phase (its static offset, a fault)
/// by (node, GPU, second), and the width of the per-sample noise (uniform, either way).
struct Shape<'a> {
    phase: fn(usize) -> (f64, u8),
    clock: Box<dyn Fn(usize, usize, usize) -> f64 + 'a>,
    noise: f64,
}

/// The job above: GPUs within 1 % of each other, noise of 0.8 %; `slow(node, gpu, second)`
/// scales a GPU's clock.
fn narrow(slow: &dyn Fn(usize, usize, usize) -> f64) -> Shape<'_> {
    Shape { phase, clock: Box::new(move |n, g, s| offset_narrow(n, g) * slow(n, g, s)), noise: 0.008 }
}

/// Each GPU's static clock offset in the job above, within 1 %.
fn offset_narrow(n: usize, g: usize) -> f64 {
    1.0 + 0.01 * (((n * GPUS + g) * 7919 % 17) as f64 / 17.0 - 0.5)
}

/// The summaries of every node for the period starting at second `s`.
fn period(rng: &mut Lcg, s: usize, shape: &Shape) -> Vec<Telemetry> {
    (0..NODES)
        .map(|n| {
            let gpus = (0..GPUS)
                .map(|g| {
                    let mut t =
                        GpuTelemetry { gpu: format!("GPU-{n}-{g}"), power_limit_w: Some(700.0), ..Default::default() };
                    for i in 0..PERIOD {
                        let (scale, util) = (shape.phase)(s + i);
                        let mhz = 1980.0 * scale * (shape.clock)(n, g, s + i) * (1.0 + shape.noise * rng.unit());
                        t.sm_mhz.push(Some(mhz.round() as u32));
                        t.power_w.push(Some((650.0 * scale * (1.0 + 0.03 * rng.unit())) as f32));
                        t.util_pct.push(Some(util));
                    }
                    if (shape.phase)(s).1 == 100 {
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

/// Runs `seconds` of the job above through one judge; each suspicion with the second it was
/// raised at (the end of the period whose summary raised it).
fn run(
    seconds: usize,
    slow: &dyn Fn(usize, usize, usize) -> f64,
    edit: &dyn Fn(usize, &mut Telemetry),
) -> Vec<(usize, Suspicion)> {
    run_shape(JudgeConfig::default(), seconds, &narrow(slow), edit)
}

/// Runs `seconds` of a job of `shape` through one judge of `cfg`.
fn run_shape(
    cfg: JudgeConfig,
    seconds: usize,
    shape: &Shape,
    edit: &dyn Fn(usize, &mut Telemetry),
) -> Vec<(usize, Suspicion)> {
    let mut judge = JobJudge::new(cfg);
    let mut rng = Lcg(42);
    let mut out = Vec::new();
    for s in (0..seconds).step_by(PERIOD) {
        for mut t in period(&mut rng, s, shape) {
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
        let ts = period(&mut rng, s, &narrow(&slow));
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
        let mut t = period(&mut rng, s, &narrow(&|_, _, _| 0.5)).remove(0);
        t.gpus.truncate(1);
        assert!(judge.observe(&t).is_empty());
    }
}

/// The phases of the jobs below, every 300 s: an evaluation (every clock 7 % lower), a
/// checkpoint pause, a data-loader stall.
fn phase_wide(s: usize) -> (f64, u8) {
    match s % 300 {
        120..=179 => (0.93, 90),
        200..=229 => (0.6, 3),
        260..=262 => (0.75, 20),
        _ => (1.0, 100),
    }
}

/// Each GPU's static clock offset at the power cap, spread evenly over -3 % to +3 % across the
/// job (mixed across nodes): wide enough that the spread across GPUs at one instant hides a GPU
/// turning 10 % slow from above the median.
fn offset_wide(n: usize, g: usize) -> f64 {
    let rank = (n * GPUS + g) * 37 % (NODES * GPUS);
    1.0 + 0.03 * (2.0 * rank as f64 / (NODES * GPUS - 1) as f64 - 1.0)
}

/// The (node, GPU) of the fastest GPU of [`offset_wide`], and of one at the median.
fn fastest_and_median() -> ((usize, usize), (usize, usize)) {
    let mut all: Vec<(f64, (usize, usize))> =
        (0..NODES).flat_map(|n| (0..GPUS).map(move |g| (offset_wide(n, g), (n, g)))).collect();
    all.sort_by(|a, b| a.0.total_cmp(&b.0));
    (all[all.len() - 1].1, all[all.len() / 2].1)
}

/// A job of [`offset_wide`] GPUs with 1 % per-sample noise (uniform, 3.5 % wide); `clock`
/// scales a GPU's clock on top of its offset.
fn wide<'a>(phase: fn(usize) -> (f64, u8), clock: &'a dyn Fn(usize, usize, usize) -> f64) -> Shape<'a> {
    Shape { phase, clock: Box::new(move |n, g, s| offset_wide(n, g) * clock(n, g, s)), noise: 0.035 }
}

fn without_baseline() -> JudgeConfig {
    JudgeConfig { baseline_ticks: 0, ..Default::default() }
}

#[test]
fn among_gpus_3_percent_apart_one_turning_10_percent_slow_is_caught_against_its_own_ratio() {
    let ((sn, sg), _) = fastest_and_median();
    let slow = move |n: usize, g: usize, s: usize| if (n, g) == (sn, sg) && s >= 60 { 0.9 } else { 1.0 };
    let shape = wide(phase_wide, &slow);
    // The rule against the job's median alone never sees it: 0.93 of the median is within the
    // spread of the GPUs' offsets.
    assert!(run_shape(without_baseline(), 300, &shape, &|_, _| {}).is_empty());
    let found = run_shape(JudgeConfig::default(), 300, &shape, &|_, _| {});
    assert_eq!(found.len(), 1, "{found:?}");
    let (at, s) = &found[0];
    assert_eq!(
        (s.node.clone(), s.gpu.clone(), s.code),
        (format!("node-{sn}"), format!("GPU-{sn}-{sg}"), SuspectCode::WatchSlowClock)
    );
    assert!(*at <= 60 + 10, "raised at second {at}, onset at 60");
    let since = (s.since - t0()).num_seconds();
    assert!((60..*at as i64).contains(&since), "since second {since}");
    assert!(s.evidence.contains("below its own usual ratio to the job's median"), "{}", s.evidence);
}

#[test]
fn a_healthy_job_of_gpus_3_percent_apart_through_its_phases_raises_nothing() {
    let found = run_shape(JudgeConfig::default(), 1200, &wide(phase_wide, &|_, _, _| 1.0), &|_, _| {});
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_gpu_slow_from_the_start_is_caught_against_the_job_s_median() {
    let (_, (sn, sg)) = fastest_and_median();
    let slow = move |n: usize, g: usize, _s: usize| if (n, g) == (sn, sg) { 0.8 } else { 1.0 };
    let found = run_shape(JudgeConfig::default(), 120, &wide(phase_wide, &slow), &|_, _| {});
    assert_eq!(found.len(), 1, "{found:?}");
    let (at, s) = &found[0];
    assert_eq!((s.gpu.clone(), s.code), (format!("GPU-{sn}-{sg}"), SuspectCode::WatchSlowClock));
    // The first period is judged among the first node's GPUs alone (the others are not known
    // yet): the GPU is low from its first instant judged, the job's sixth second.
    assert_eq!((*at, s.since), (10, t0() + chrono::Duration::seconds(5)), "{s:?}");
    assert!(s.evidence.contains("against the job's median"), "{}", s.evidence);
}

#[test]
fn a_gpu_drifting_2_percent_slower_over_an_hour_raises_nothing() {
    let ((fn_, fg), (mn, mg)) = fastest_and_median();
    // The fastest GPU and one at the median drift down by 2 % over the hour, at every phase.
    let drift = move |n: usize, g: usize, s: usize| {
        if (n, g) == (fn_, fg) || (n, g) == (mn, mg) {
            1.0 - 0.02 * s as f64 / 3600.0
        } else {
            1.0
        }
    };
    let found = run_shape(JudgeConfig::default(), 3600, &wide(phase_wide, &drift), &|_, _| {});
    assert!(found.is_empty(), "{found:?}");
}

/// Training, then every 900 s an evaluation of 300 s at 15 % lower clocks.
fn phase_long_eval(s: usize) -> (f64, u8) {
    if (300..600).contains(&(s % 900)) {
        (0.85, 90)
    } else {
        (1.0, 100)
    }
}

#[test]
fn a_phase_moving_every_clock_raises_nothing_even_where_it_narrows_the_offsets() {
    // Every GPU's clock moves by the same factor: its ratio to the median stays.
    let found = run_shape(JudgeConfig::default(), 1800, &wide(phase_long_eval, &|_, _, _| 1.0), &|_, _| {});
    assert!(found.is_empty(), "{found:?}");
    // Off the power cap the GPUs' offsets shrink to a third: every ratio moves towards 1, by
    // up to 2 %, and back at the end of the evaluation.
    let narrowing = |n: usize, g: usize, s: usize| {
        if phase_long_eval(s).1 == 90 {
            (1.0 + (offset_wide(n, g) - 1.0) / 3.0) / offset_wide(n, g)
        } else {
            1.0
        }
    };
    let found = run_shape(JudgeConfig::default(), 1800, &wide(phase_long_eval, &narrowing), &|_, _| {});
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_gpu_whose_own_offset_moves_with_a_phase_by_more_than_the_gap_is_suspected() {
    // A limit of the rule against the GPU's own ratio: the fastest GPU, a further `extra` faster
    // than the others while training at the cap, runs at its plain offset in the evaluation.
    // Its ratio falls by `extra` while the others' stay: up to the gap nothing is raised, beyond
    // it the GPU is suspected at the evaluation's start, though still above the median.
    let ((fn_, fg), _) = fastest_and_median();
    let run_extra = |extra: f64| {
        let clock = move |n: usize, g: usize, s: usize| {
            if (n, g) == (fn_, fg) && phase_long_eval(s).1 == 100 {
                extra
            } else {
                1.0
            }
        };
        let shape = wide(phase_long_eval, &clock);
        run_shape(JudgeConfig::default(), 900, &shape, &|_, _| {})
    };
    assert!(run_extra(1.04).is_empty());
    let found = run_extra(1.08);
    assert_eq!(found.len(), 1, "{found:?}");
    let (at, s) = &found[0];
    assert_eq!(s.gpu, format!("GPU-{fn_}-{fg}"));
    assert!((300..=310).contains(at), "raised at second {at}, the evaluation begins at 300");
    assert!(s.evidence.contains("below its own usual ratio to the job's median"), "{}", s.evidence);
}

#[test]
fn the_first_node_to_report_is_not_judged_among_its_own_gpus_alone() {
    // Node 0 holds six of the job's few fast GPUs: among its own eight, its two GPUs at the job's
    // usual clock look 12 % slow; among the job's 64 they are at the median.
    let shape = |n: usize, g: usize, _s: usize| if n == 0 && g < 6 { 1.0 } else { 0.88 };
    let run = |judge: &mut JobJudge| {
        let mut rng = Lcg(11);
        let mut found = Vec::new();
        for s in (0..60).step_by(PERIOD) {
            for t in period(&mut rng, s, &narrow(&shape)) {
                found.extend(judge.observe(&t));
            }
        }
        found
    };
    let alone = run(&mut JobJudge::new(JudgeConfig::default()));
    assert!(alone.iter().any(|s| s.node == "node-0"), "the hazard this guards against: {alone:?}");
    let found = run(&mut JobJudge::new(JudgeConfig::default()).expecting(NODES));
    assert!(found.is_empty(), "{found:?}");
}
