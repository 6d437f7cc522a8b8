//! Re-measure before a verdict, on the workers' side. After a check with a headline figure,
//! every rank publishes its figure in the store; rank 0 reads them all, judges them with
//! [`peers::critical_ranks`] (the diagnosis's own judging) and publishes which ranks were slow,
//! which every rank reads: all agree whether to run the check again, in O(n) store operations
//! (every rank reading every figure would make n², 268 million at 16,384 ranks). A check is re-run on every rank (collectives need everyone), and
//! only the later measurement counts: a transient blip does not fail a job, a slow device is
//! slow twice. While a rank stays slow, it is measured again after pauses, up to
//! [`MAX_MEASUREMENTS`] in all: a rank descheduled for two windows back to back on a busy host
//! is not slow a few seconds later, a slow device is slow in all of them. The measurements run
//! inside the same test, under the same per-test deadline.
//!
//! With a fleet baseline (`check --baseline FILE`: node 0's launcher hands rank 0 the entries
//! of the run's checks in a private file, [`super::Baseline::fleet`]), rank 0 also re-measures
//! for a rank whose figure is below its fleet floor, judged as node 0's diagnosis judges it
//! (`diagnosis/fleet.rs`: the same key, `fleet::judge` with the entry's baseline and the file's
//! judging; on CPU workers the rate per CPU-second). Each rank's [`Figure`] carries what that
//! key needs beside the wall-clock figure: its driver's major version and its rate per
//! CPU-second.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpusanity_common::checks::Metric;
use gpusanity_common::expected::Conditions;
use gpusanity_common::fleet::file::BaselineFile;
use gpusanity_common::fleet::{self, Key, Learned};
use gpusanity_common::peers::{self, Critical, PeerBands};
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{CheckStatus, DeviceKind, RankResult};
use gpusanity_common::stats::figure;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::{CheckCtx, BARRIER_WAIT};

/// One rank's first measurement, as rank 0 reads it.
#[derive(Debug, Serialize, Deserialize)]
struct Figure {
    device: String,
    /// The headline figure (per wall-clock second); None when the check did not pass.
    value: Option<f64>,
    /// The same measurement's rate per CPU-second (CPU workers: what a fleet baseline judges
    /// there, [`peers::judged_key`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cpu: Option<f64>,
    /// The GPU driver's major version (GPU workers whose health monitor is open): part of a
    /// fleet baseline's key, as the diagnosis reads it from `gpu-health`'s readings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    driver: Option<u32>,
    /// After a re-measure, the better of the first and the counted headline figure: what node
    /// 0's diagnosis judges against the peers' (`diagnosis::slow_ranks`), so the ranks named
    /// for a further measurement are the ones it would name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    best: Option<f64>,
}

impl Figure {
    fn of(first: &RankResult, m: &Metric, device: &str, ctx: &CheckCtx<'_>) -> Figure {
        let passed = first.status == CheckStatus::Passed;
        let metric = |key: &str| passed.then(|| first.metrics.get(key).copied()).flatten();
        Figure {
            device: device.to_string(),
            best: None,
            value: metric(m.key),
            cpu: metric(&peers::cpu_key(m.key)),
            driver: ctx
                .health
                .and_then(|h| h.as_ref().ok())
                .and_then(|monitor| fleet::driver_major(&monitor.driver_version()?)),
        }
    }
}

/// The most measurements of a check while a rank stays slow (against its peers or its expected
/// figure) or below its fleet floor: the first, the re-measure, and up to three further ones
/// over the next seconds. Two back to back (a third of a second on a CPU test rig) do not
/// outlast other processes' bursts on the host; a device that is slow stays slow in all five.
pub const MAX_MEASUREMENTS: usize = 5;

/// The pause before each further measurement (the third, fourth and fifth): the last comes
/// 3.5 s and more after the first. A rank below its floor in all five costs its run these
/// pauses and three more measurements of the check.
pub const PAUSES: [Duration; MAX_MEASUREMENTS - 2] =
    [Duration::from_millis(500), Duration::from_secs(1), Duration::from_secs(2)];

/// The metric of a re-measured rank's result: how many of its measurements it took (2 to
/// [`MAX_MEASUREMENTS`]), the one that counts last.
pub const MEASUREMENTS: &str = "measurements";

/// The most ranks a decision names (with their figures and reasons): the re-measure runs on
/// every rank whatever their number, and the decision stays far below the store's largest value
/// at any scale.
const MAX_NAMED: usize = 32;

/// Rank 0's decision: the ranks that call for a re-measure (at most [`MAX_NAMED`] of them,
/// lowest first) and how many there were in all.
#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
struct Decision {
    named: Vec<Slow>,
    total: usize,
}

impl Decision {
    /// The named ranks and why, and how many more there were.
    fn describe(&self, m: &Metric) -> String {
        let mut all: Vec<String> = self.named.iter().map(|s| s.describe(m)).collect();
        if let Some(more) = self.total.checked_sub(self.named.len()).filter(|n| *n > 0) {
            all.push(format!("and {more} more"));
        }
        all.join("; ")
    }
}

/// A rank whose first measurement calls for a re-measure, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Slow {
    rank: usize,
    /// Its headline figure (per wall-clock second).
    value: f64,
    /// Critical against its peers.
    #[serde(default)]
    peers: bool,
    /// Critical against the figure a healthy device of its model reaches (`expected.toml`).
    #[serde(default)]
    expected: bool,
    /// Below its fleet baseline's floor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fleet: Option<Below>,
}

/// A figure below its fleet floor: the figure judged (per CPU-second where `per_cpu`) and the floor.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
struct Below {
    value: f64,
    floor: f64,
    #[serde(default)]
    per_cpu: bool,
}

impl Slow {
    /// `rank 3 at 1.20 TFLOP/s, slow against its peers` / `..., below the fleet floor ...`.
    fn describe(&self, m: &Metric) -> String {
        let mut why = Vec::new();
        if self.peers {
            why.push("slow against its peers".to_string());
        }
        if self.expected {
            why.push("below its model's expected figure".to_string());
        }
        if let Some(b) = &self.fleet {
            let per = if b.per_cpu { " per CPU-second" } else { "" };
            why.push(format!("below the fleet floor ({}{per}, floor {})", figure(b.value), figure(b.floor)));
        }
        format!("rank {} at {} {}, {}", self.rank, figure(self.value), m.unit, why.join(" and "))
    }
}

/// The decision over every rank's `figures`: those critical against their peers or their
/// expected figure (`slow`), and those below their fleet floor.
fn decide(figures: &[(usize, Figure)], slow: &[Critical], below: &HashMap<usize, Below>) -> Decision {
    let slow: HashMap<usize, Critical> = slow.iter().map(|c| (c.rank, *c)).collect();
    let mut all: Vec<Slow> = figures
        .iter()
        .filter_map(|(rank, f)| {
            let (peers, expected) = slow.get(rank).map_or((false, false), |c| (c.peers, c.expected));
            let fleet = below.get(rank).copied();
            (peers || expected || fleet.is_some()).then_some(Slow {
                rank: *rank,
                value: f.value?,
                peers,
                expected,
                fleet,
            })
        })
        .collect();
    all.sort_by_key(|s| s.rank);
    let total = all.len();
    all.truncate(MAX_NAMED);
    Decision { named: all, total }
}

/// The ranks of `figures` (with a headline figure) below their fleet floor in `file`, judged
/// as node 0's diagnosis judges them (`diagnosis/fleet.rs`, [`fleet::samples::rank_keys`]):
/// the same key (the figure per CPU-second on CPU workers where every rank measured it), the
/// entry's baseline and the file's judging.
fn below_fleet(
    file: &BaselineFile,
    id: CheckId,
    m: &Metric,
    cpu: bool,
    figures: &[(usize, Figure)],
    when: Conditions,
) -> HashMap<usize, Below> {
    let metric = peers::judged_key(m.key, cpu, figures.iter().map(|(_, f)| f.cpu.is_some()));
    let per_cpu = metric != m.key;
    let judging = file.judging();
    // One lookup per key (device model and driver), not per rank: a file may hold 50,000 entries.
    let mut entries: HashMap<Key, Option<(Learned, String)>> = HashMap::new();
    let mut out = HashMap::new();
    for (rank, f) in figures {
        let Some(value) = (if per_cpu { f.cpu } else { f.value }) else { continue };
        let key = Key::new(&f.device, f.driver, id, &metric, when);
        let entry = entries.entry(key).or_insert_with_key(|k| file.lookup(k).map(|e| (e.learned(), e.source.clone())));
        let Some((learned, source)) = entry else { continue };
        let j = fleet::judge(&metric, value, learned, judging, source);
        if j.below {
            out.insert(*rank, Below { value, floor: j.floor, per_cpu });
        }
    }
    out
}

/// Runs check `id` on this rank, and once more on every rank if any rank's figure is
/// critical against its peers or its expected value, or below its fleet floor; again (at most
/// [`MAX_MEASUREMENTS`] in all, after [`PAUSES`]) while a rank's newest figure stays so.
pub fn run(id: CheckId, ctx: &mut CheckCtx<'_>, device: &str) -> RankResult {
    let first = {
        let faults = ctx.faults.attempt(0);
        let mut c = CheckCtx { faults: &faults, ..reborrow(ctx) };
        super::run(id, &mut c)
    };
    let Some(m) = id.metric() else {
        return first;
    };
    let fig = Figure::of(&first, m, device, ctx);
    let (value, cpu_value) = (fig.value, fig.cpu);
    let first_judge = |ctx: &CheckCtx<'_>, figures: &[(usize, Figure)]| judge(id, m, ctx, figures);
    let decision: Decision = match exchange(ctx, id, &fig, first_judge) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("could not share figures for a re-measure: {e}");
            return first;
        }
    };
    if decision.total == 0 {
        return first;
    }
    let firsts = decision.describe(m);
    tracing::info!(check = id.as_str(), "re-measuring: {firsts}");
    ctx.progress.phase(id, "re-measure", 0);
    let (mut counted, mut took) = measure(id, ctx, 1);
    let mut measurements = 2;
    let mut again = Vec::new();
    // Every rank shares its newest counted figure once more and rank 0 names those still slow
    // or below their floor: every rank measures again after a pause (collectives need
    // everyone), and only the named ranks take the new measurement. A rank that cleared keeps
    // the measurement that cleared it, so a later blip does not undo it.
    for k in 2..MAX_MEASUREMENTS {
        let pause = pause(k, ctx.configs.stall_s);
        let counted_fig = Figure::of(&counted, m, device, ctx);
        let best = counted_fig.value.map(|v| value.map_or(v, |first| first.max(v)));
        let fig = Figure { best, ..counted_fig };
        let still = |ctx: &CheckCtx<'_>, figures: &[(usize, Figure)]| still_slow(id, m, ctx, figures, pause, took);
        let d: Decision = match exchange(ctx, id, &fig, still) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!("could not share figures for a further re-measure: {e}");
                break;
            }
        };
        if d.total == 0 {
            break;
        }
        let named = d.describe(m);
        tracing::info!(check = id.as_str(), "still slow, measuring again in {pause:?}: {named}");
        again.push(format!("measured again after {} s ({named})", pause.as_secs_f64()));
        // A phase first: the launcher sees this rank move before the pause.
        ctx.progress.phase(id, "re-measure pause", (k - 1) as u64);
        std::thread::sleep(pause);
        ctx.progress.phase(id, "re-measure", (k - 1) as u64);
        let (next, t) = measure(id, ctx, k);
        took = t;
        if d.named.iter().any(|s| s.rank == ctx.place.rank) {
            counted = next;
            measurements += 1;
        }
    }
    ctx.store.set_namespace("");
    let mut note = format!("re-measured on every rank after a slow first measurement ({firsts})");
    for a in &again {
        note.push_str("; ");
        note.push_str(a);
    }
    counted.notes.insert("remeasured".into(), note);
    if let Some(v) = value {
        counted.metrics.insert(format!("first_{}", m.key), v);
    }
    if let Some(v) = cpu_value {
        counted.metrics.insert(format!("first_{}", peers::cpu_key(m.key)), v);
    }
    counted.metrics.insert(MEASUREMENTS.into(), measurements as f64);
    counted
}

/// Measures check `id` once more, its `k`th measurement (1: the re-measure), on fresh store
/// keys so that the check's own barriers synchronize the ranks again (the store keeps them in
/// that namespace until it is set back); the result and how long it took.
fn measure(id: CheckId, ctx: &mut CheckCtx<'_>, k: usize) -> (RankResult, Duration) {
    let faults = ctx.faults.attempt(k);
    ctx.store.set_namespace(&namespace(id, k));
    let started = Instant::now();
    let mut c = CheckCtx { faults: &faults, ..reborrow(ctx) };
    (super::run(id, &mut c), started.elapsed())
}

/// The store namespace of the `k`th measurement (1: the re-measure).
fn namespace(id: CheckId, k: usize) -> String {
    match k {
        1 => format!("remeasure/{id}/"),
        _ => format!("remeasure/{id}/{k}/"),
    }
}

/// The check's conditions as the report will show them to node 0's diagnosis (its own
/// configuration; the link as rank 0 reads it, the diagnosis takes the one every rank
/// reported), and whether the workers are CPUs.
fn conditions(id: CheckId, ctx: &CheckCtx<'_>) -> (Conditions, bool) {
    let local_gpus = ctx.place.node_sizes.get(ctx.place.node_rank).copied().unwrap_or(1);
    let link = super::gpu_health::link(&*ctx.backend, local_gpus);
    let when = Conditions::from_config(&id.config_value(ctx.configs), &ctx.place.node_sizes).with_link(link);
    (when, ctx.backend.kind() == DeviceKind::Cpu)
}

/// Rank 0's decision over every rank's figure (with a headline figure): those critical against
/// their peers or their expected figure, and those below their fleet floor.
fn judge(id: CheckId, m: &Metric, ctx: &CheckCtx<'_>, figures: &[(usize, Figure)]) -> Decision {
    let (when, cpu) = conditions(id, ctx);
    let bands = PeerBands::new(ctx.configs.slow_fraction, cpu);
    let wall: peers::Figures =
        figures.iter().filter_map(|(r, f)| Some((*r, f.device.clone(), f.best.or(f.value)?))).collect();
    let slow = peers::critical_ranks(id, m.key, &wall, bands, when);
    let below = match &ctx.baseline.fleet {
        Some(file) => below_fleet(file, id, m, cpu, figures, when),
        None => HashMap::new(),
    };
    decide(figures, &slow, &below)
}

/// Rank 0's decision after a re-measure: the ranks whose newest counted figure is still slow
/// or below their fleet floor ([`judge`]), to be measured again after `pause`; none (so no
/// further measurement) when no rank is, when more than [`MAX_NAMED`] are (not a transient on
/// a few ranks: each is judged on what it measured), or when a further measurement, taking
/// twice as long as the last one (`took`), would not end before the check's per-test limit.
fn still_slow(
    id: CheckId,
    m: &Metric,
    ctx: &CheckCtx<'_>,
    figures: &[(usize, Figure)],
    pause: Duration,
    took: Duration,
) -> Decision {
    let d = judge(id, m, ctx, figures);
    if d.total > MAX_NAMED {
        tracing::info!(check = id.as_str(), "{} ranks still slow: no further measurement", d.total);
        return Decision::default();
    }
    if d.total > 0 && !in_time(ctx.limit, pause, took) {
        tracing::info!(check = id.as_str(), "no time left in the per-test limit for a further measurement");
        return Decision::default();
    }
    d
}

/// The pause before the `k`th measurement (2: the third), at most half the launcher's stall
/// time (`stall_s`, which it may be set down to a second): no progress in a pause is no stall.
fn pause(k: usize, stall_s: u64) -> Duration {
    let most = Duration::from_secs(stall_s) / 2;
    PAUSES.get(k.saturating_sub(2)).copied().unwrap_or(Duration::ZERO).min(most)
}

/// Whether a measurement taking twice `took`, after `pause`, ends before `limit`.
fn in_time(limit: Option<Instant>, pause: Duration, took: Duration) -> bool {
    let Some(limit) = limit else { return false };
    Instant::now().checked_add(pause.saturating_add(took.saturating_mul(2))).is_some_and(|end| end <= limit)
}

fn reborrow<'b>(ctx: &'b mut CheckCtx<'_>) -> CheckCtx<'b> {
    CheckCtx {
        backend: &mut *ctx.backend,
        store: &mut *ctx.store,
        place: ctx.place,
        configs: ctx.configs,
        progress: ctx.progress,
        baseline: ctx.baseline,
        faults: ctx.faults,
        health: ctx.health,
        load: &mut *ctx.load,
        limit: ctx.limit,
    }
}

/// Publishes this rank's figure; rank 0 reads every rank's (those with a headline figure),
/// `judge`s them and publishes its decision, which every rank returns.
fn exchange<D: Serialize + DeserializeOwned>(
    ctx: &mut CheckCtx<'_>,
    id: CheckId,
    fig: &Figure,
    judge: impl FnOnce(&CheckCtx<'_>, &[(usize, Figure)]) -> D,
) -> anyhow::Result<D> {
    // Two-level rounds (store::Rounds): node 0's store sees one value per node each way.
    let gathered = ctx.store.gather(&format!("diag/{id}"), &serde_json::to_string(fig)?, BARRIER_WAIT)?;
    let decision = match gathered {
        Some(all) => {
            let mut figures = Vec::new();
            for (r, v) in all.into_iter().enumerate() {
                let f: Figure = serde_json::from_str(&v)?;
                if f.value.is_some() {
                    figures.push((r, f));
                }
            }
            let slow = judge(ctx, &figures);
            Some(serde_json::to_string(&slow)?)
        }
        None => None,
    };
    let slow = ctx.store.broadcast(&format!("diag/{id}/slow"), decision.as_deref(), BARRIER_WAIT)?;
    Ok(serde_json::from_str(&slow)?)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashSet;

    use gpusanity_common::fleet::file::BaselineEntry;
    use gpusanity_common::fleet::Judging;

    use super::*;

    fn fig(device: &str, value: f64, cpu: Option<f64>, driver: Option<u32>) -> Figure {
        Figure { device: device.into(), value: Some(value), cpu, driver, best: None }
    }

    /// A baseline entry of one node of `ranks` ranks: centre 10, spread 0.5, 40 samples of 5
    /// nodes (the unit tests of the executor share it).
    pub(crate) fn entry(device: &str, check: CheckId, metric: &str, ranks: usize, size: Option<u64>) -> BaselineEntry {
        BaselineEntry {
            device: device.into(),
            driver: None,
            check,
            metric: metric.into(),
            value: 10.0,
            spread: 0.5,
            samples: 40,
            nodes: 5,
            window: 200,
            size,
            max_bytes: None,
            single_node: true,
            ranks_per_node: Some(ranks),
            link: None,
            source: "test".into(),
        }
    }

    /// One GEMM entry of `metric` for `device` on one node of 4 ranks.
    fn file(device: &str, driver: Option<u32>, metric: &str) -> BaselineFile {
        let entry = BaselineEntry { driver, ..entry(device, CheckId::Gemm, metric, 4, Some(256)) };
        BaselineFile { judging: Some(Judging { k: 4.0, min_gap: 0.03 }), entries: vec![entry] }
    }

    fn when() -> Conditions {
        Conditions::from_config(&serde_json::json!({"size": 256}), &[4])
    }

    fn gemm() -> &'static Metric {
        CheckId::Gemm.metric().expect("gemm has a headline")
    }

    #[test]
    fn a_cpu_rank_below_its_fleet_floor_per_cpu_second_is_named_with_the_floor() {
        // Floor 10 - max(4 x 0.5, 0.03 x 10) = 8. Rank 2 is slow per wall second only
        // (descheduled); rank 3 is below per CPU-second.
        let figures = vec![
            (0, fig("cpu", 9.0, Some(10.0), None)),
            (1, fig("cpu", 9.5, Some(9.9), None)),
            (2, fig("cpu", 4.0, Some(9.8), None)),
            (3, fig("cpu", 7.0, Some(7.5), None)),
        ];
        let below = below_fleet(&file("cpu", None, "tflops_cpu"), CheckId::Gemm, gemm(), true, &figures, when());
        assert_eq!(below.keys().copied().collect::<Vec<_>>(), [3]);
        assert_eq!(below[&3], Below { value: 7.5, floor: 8.0, per_cpu: true });
        // A wall-clock entry does not judge CPU workers that measured the rate per CPU-second.
        assert!(below_fleet(&file("cpu", None, "tflops"), CheckId::Gemm, gemm(), true, &figures, when()).is_empty());
        // Another shape, another device: no entry holds.
        let other = Conditions::from_config(&serde_json::json!({"size": 512}), &[4]);
        assert!(below_fleet(&file("cpu", None, "tflops_cpu"), CheckId::Gemm, gemm(), true, &figures, other).is_empty());
        assert!(below_fleet(&file("gpu", None, "tflops_cpu"), CheckId::Gemm, gemm(), true, &figures, when()).is_empty());
        // One rank without the rate per CPU-second: every rank is judged on the wall clock, as
        // the diagnosis judges them.
        let mut mixed = figures;
        mixed[0].1.cpu = None;
        let below = below_fleet(&file("cpu", None, "tflops"), CheckId::Gemm, gemm(), true, &mixed, when());
        let mut ranks: Vec<usize> = below.keys().copied().collect();
        ranks.sort_unstable();
        assert_eq!(ranks, [2, 3]);
        assert!(!below[&2].per_cpu);
    }

    #[test]
    fn a_gpu_rank_is_judged_against_the_entry_of_its_driver() {
        let figures =
            vec![(0, fig("NVIDIA H200", 9.9, None, Some(580))), (1, fig("NVIDIA H200", 7.0, None, Some(570)))];
        let f = file("NVIDIA H200", Some(570), "tflops");
        let below = below_fleet(&f, CheckId::Gemm, gemm(), false, &figures, when());
        assert_eq!(below.get(&1), Some(&Below { value: 7.0, floor: 8.0, per_cpu: false }));
        assert_eq!(below.len(), 1, "rank 0's driver has no entry");
    }

    #[test]
    fn the_decision_names_why_and_stays_bounded() {
        let figures: Vec<(usize, Figure)> = (0..100).map(|r| (r, fig("cpu", r as f64, None, None))).collect();
        let below: HashMap<usize, Below> = [(7, Below { value: 7.5, floor: 8.0, per_cpu: true })].into_iter().collect();
        let slow = |rank, peers, expected| Critical { rank, peers, expected };
        let d = decide(&figures, &[slow(3, true, false), slow(7, true, false)], &below);
        assert_eq!(d.total, 2);
        assert_eq!(d.named[0].describe(gemm()), "rank 3 at 3.00 TFLOP/s, slow against its peers");
        assert_eq!(
            d.named[1].describe(gemm()),
            "rank 7 at 7.00 TFLOP/s, slow against its peers and below the fleet floor (7.50 per CPU-second, floor 8.00)"
        );
        let alone = decide(&figures, &[slow(5, false, true)], &HashMap::new());
        assert_eq!(alone.named[0].describe(gemm()), "rank 5 at 5.00 TFLOP/s, below its model's expected figure");
        let only_fleet = decide(&figures, &[], &below);
        assert_eq!(
            only_fleet.named[0].describe(gemm()),
            "rank 7 at 7.00 TFLOP/s, below the fleet floor (7.50 per CPU-second, floor 8.00)"
        );
        // Every rank slow: the decision names the first MAX_NAMED and counts the rest.
        let all: Vec<Critical> = (0..100).map(|r| slow(r, true, false)).collect();
        let d = decide(&figures, &all, &below);
        assert_eq!((d.named.len(), d.total, d.named[0].rank), (MAX_NAMED, 100, 0));
        assert_eq!(decide(&figures, &[], &HashMap::new()), Decision::default());
        assert_eq!(d.describe(gemm()).matches("rank ").count(), MAX_NAMED);
        assert!(d.describe(gemm()).ends_with("; and 68 more"), "{}", d.describe(gemm()));
    }

    #[test]
    fn a_further_measurement_runs_only_when_twice_the_last_one_ends_before_the_limit() {
        let (pause, took) = (Duration::from_millis(500), Duration::from_secs(2));
        let now = Instant::now();
        assert!(in_time(now.checked_add(Duration::from_secs(60)), pause, took));
        assert!(!in_time(now.checked_add(Duration::from_secs(4)), pause, took), "0.5 s + 2 x 2 s is past it");
        assert!(!in_time(Some(now), Duration::ZERO, Duration::ZERO), "the limit has passed");
        assert!(!in_time(None, pause, took), "a launcher that gave no limit: no further measurement");
        assert!(!in_time(now.checked_add(Duration::from_secs(60)), pause, Duration::MAX), "no overflow");
    }

    #[test]
    fn every_measurement_has_its_own_store_namespace() {
        let all: HashSet<String> = (1..MAX_MEASUREMENTS).map(|k| namespace(CheckId::Gemm, k)).collect();
        assert_eq!(all.len(), MAX_MEASUREMENTS - 1);
        assert_eq!(namespace(CheckId::Gemm, 1), "remeasure/gemm/", "the re-measure's keys as before");
        assert!(all.iter().all(|n| n.starts_with("remeasure/gemm/") && n.ends_with('/')));
        assert_eq!(PAUSES.iter().sum::<Duration>(), Duration::from_millis(3500));
        let default = gpusanity_common::config::DEFAULT_STALL_S;
        assert_eq!((2..MAX_MEASUREMENTS).map(|k| pause(k, default)).collect::<Vec<_>>(), PAUSES);
        assert_eq!(pause(4, 1), Duration::from_millis(500), "half of a stall time of 1 s");
        assert_eq!(pause(9, default), Duration::ZERO, "past the list: none");
    }
}
