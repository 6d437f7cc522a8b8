//! Each rank's headline figure against its fleet baseline (`gpusanity check --baseline FILE`,
//! [`gpusanity_common::fleet`]): every rank whose figure's key has an entry carries its
//! judgement (percentile, the baseline and its samples) on its report entry, and a figure below
//! the baseline's floor raises `BELOW_FLEET`. The static expected figure and the peers are
//! judged beside it, unchanged. On CPU workers the figure judged is the rate per CPU-second,
//! as the peers judge it ([`samples::rank_keys`]): a baseline learned from it says so in its
//! metric (`tflops_cpu`), and a wall-clock baseline never judges it.
//!
//! The figure judged is the one that counts: after a re-measure (rank 0 re-measures every rank
//! when one is below its fleet floor, `checks/remeasure.rs`), the second one; a rank below twice
//! carries both figures as evidence.

use std::collections::BTreeMap;

use gpusanity_common::checks::Metric;
use gpusanity_common::findings::Code;
use gpusanity_common::fleet::file::BaselineFile;
use gpusanity_common::fleet::{self, samples, FleetJudgement};
use gpusanity_common::report::{CheckReport, DeviceKind, Finding, RankInfo, Severity};

use super::{figure, place};
use crate::checks::remeasure::MEASUREMENTS;

/// Judges every passed rank of `c` with a figure of `m` against `baseline`, sets its `fleet`
/// entry and adds `BELOW_FLEET` findings: one per rank, or one for the job when a collective
/// (measured alike by every rank) is below on every rank.
pub fn judge(
    c: &mut CheckReport,
    m: &Metric,
    ranks: &[RankInfo],
    drivers: &BTreeMap<usize, u32>,
    baseline: &BaselineFile,
    backend: DeviceKind,
    findings: &mut Vec<Finding>,
) {
    let judging = baseline.judging();
    let keys = samples::rank_keys(c, ranks, drivers, backend);
    // (rank, judgement, its earlier measurements when it was re-measured)
    let mut below: Vec<(usize, FleetJudgement, Option<Earlier>)> = Vec::new();
    let mut judged = 0;
    for (rank, key, value) in keys {
        let Some(entry) = baseline.lookup(&key) else { continue };
        let Some(r) = c.ranks.iter_mut().find(|r| r.rank == rank) else { continue };
        let j = fleet::judge(&key.metric, value, &entry.learned(), judging, &entry.source);
        judged += 1;
        if j.below {
            let earlier = r.metrics.get(&format!("first_{}", key.metric)).map(|first| Earlier {
                first: *first,
                // A report of before the further measurements: two.
                measurements: r.metrics.get(MEASUREMENTS).map_or(2, |n| *n as usize),
            });
            below.push((rank, j.clone(), earlier));
        }
        r.fleet = Some(Box::new(j));
    }
    if m.collective && !below.is_empty() && below.len() == judged {
        let (_, j, earlier) = &below[0];
        findings.push(finding(Finding::new(Severity::Critical, Code::BelowFleet, c.name, message(j, m)), j, *earlier));
        return;
    }
    for (rank, j, earlier) in &below {
        let f = place(Finding::new(Severity::Critical, Code::BelowFleet, c.name, message(j, m)), ranks, *rank);
        findings.push(finding(f, j, *earlier));
    }
}

fn message(j: &FleetJudgement, m: &Metric) -> String {
    format!(
        "{} {}{}, below the fleet's floor {} (centre {} - {} x spread {}): percentile {:.2} of its fleet",
        figure(j.value),
        m.unit,
        if j.metric == m.key { "" } else { " per CPU-second" },
        figure(j.floor),
        figure(j.centre),
        j.k,
        figure(j.spread),
        j.percentile
    )
}

/// A re-measured rank's first figure and how many measurements it took.
#[derive(Debug, Clone, Copy)]
struct Earlier {
    first: f64,
    measurements: usize,
}

impl Earlier {
    /// The evidence of a rank below after its re-measures (`last`, the figure judged): each
    /// measurement after the first was below (a rank that cleared its floor keeps the
    /// measurement that cleared it, `checks/remeasure.rs`); the first was too unless another
    /// rank called for the re-measure.
    fn evidence(&self, floor: f64, last: f64) -> String {
        let (first, last, n) = (figure(self.first), figure(last), self.measurements);
        match (self.first < floor, n) {
            (true, 0..=2) => format!("below the fleet floor in both measurements: first {first}, re-measured {last}"),
            (true, n) => format!("below the fleet floor in all {n} measurements: first {first}, last {last}"),
            (false, 0..=2) => {
                format!("below the fleet floor when re-measured: first {first} (above it), re-measured {last}")
            }
            (false, n) => format!(
                "below the fleet floor in the last {} of {n} measurements: first {first} (above it), last {last}",
                n - 1
            ),
        }
    }
}

fn finding(mut f: Finding, j: &FleetJudgement, earlier: Option<Earlier>) -> Finding {
    f.measured = Some(j.value);
    f.score = Some((j.value - j.centre) / j.spread).filter(|s| s.is_finite());
    f.evidence.push(format!(
        "fleet baseline: centre {} spread {} over {} samples of {} nodes (window {}){}",
        figure(j.centre),
        figure(j.spread),
        j.samples,
        j.nodes,
        j.window,
        if j.source.is_empty() { String::new() } else { format!("; {}", j.source) }
    ));
    if let Some(earlier) = earlier {
        f.evidence.push(earlier.evidence(j.floor, j.value));
    }
    f.action = Some("exclude the node; check the device's clocks, temperature, power and other processes on it".into());
    f
}
