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
    // (rank, judgement, the first measurement's figure when the rank was re-measured)
    let mut below: Vec<(usize, FleetJudgement, Option<f64>)> = Vec::new();
    let mut judged = 0;
    for (rank, key, value) in keys {
        let Some(entry) = baseline.lookup(&key) else { continue };
        let Some(r) = c.ranks.iter_mut().find(|r| r.rank == rank) else { continue };
        let j = fleet::judge(&key.metric, value, &entry.learned(), judging, &entry.source);
        judged += 1;
        if j.below {
            below.push((rank, j.clone(), r.metrics.get(&format!("first_{}", key.metric)).copied()));
        }
        r.fleet = Some(Box::new(j));
    }
    if m.collective && !below.is_empty() && below.len() == judged {
        let (_, j, first) = &below[0];
        findings.push(finding(Finding::new(Severity::Critical, Code::BelowFleet, c.name, message(j, m)), j, *first));
        return;
    }
    for (rank, j, first) in &below {
        let f = place(Finding::new(Severity::Critical, Code::BelowFleet, c.name, message(j, m)), ranks, *rank);
        findings.push(finding(f, j, *first));
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

fn finding(mut f: Finding, j: &FleetJudgement, first: Option<f64>) -> Finding {
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
    if let Some(first) = first {
        f.evidence.push(format!(
            "below the fleet floor in both measurements: first {}, re-measured {}",
            figure(first),
            figure(j.value)
        ));
    }
    f.action = Some("exclude the node; check the device's clocks, temperature, power and other processes on it".into());
    f
}
