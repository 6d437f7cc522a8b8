//! Diagnosis: turns the ranks' results into findings that name a node, a rank or a link, and
//! into the run's verdict. One entry point, [`diagnose`]; one file per concern:
//!
//! - [`crash`]: a worker that died (exit status or signal, last output lines) or errored;
//! - [`hang`]: for an overrun test, the ranks that never arrived apart from those waiting;
//! - [`results`]: wrong results (the checks' own verifiers, GEMM hashes against the majority);
//! - the headline metric of each check (from its descriptor) against the peers and the expected
//!   figure of the device model ([`gpusanity_common::peers`], which the workers also use to
//!   decide a re-measure);
//! - [`fleet`]: the headline figure against its fleet baseline (`check --baseline FILE`);
//! - [`micro`] and [`models`]: what the micro-benchmarks and the model checks find beyond a
//!   rank's status and figure (failed probes, slow groups, losses, parameter checksums);
//! - [`health`]: the GPU health check's readings, judged by the decisions in
//!   [`gpusanity_common::health`], and the census of each node;
//! - [`hostlink`]: the RDMA ports' faults and a GPU's host link under load;
//! - [`links`]: the pairwise link test, slow node or slow link;
//! - [`verdict`]: healthy / suspect / faulty per node.
//!
//! Diagnosis reads results; nothing that runs checks depends on it.
//!
//! Every code is listed in docs/findings.md.

pub mod crash;
pub mod fleet;
pub mod hang;
pub mod health;
pub mod hostlink;
pub mod links;
pub mod micro;
pub mod models;
pub mod results;
#[cfg(test)]
mod tests;
pub mod verdict;

use std::collections::HashMap;

use gpusanity_common::checks::Metric;
use gpusanity_common::config::CheckConfigs;
use gpusanity_common::expected::{Conditions, Entry, Expected};
use gpusanity_common::fleet::file::BaselineFile;
use gpusanity_common::peers::{self, Figures, PeerBands};
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::common_link;
use gpusanity_common::report::{
    CheckDetail, CheckReport, CheckStatus, DeviceKind, Finding, PairBandwidth, RankInfo, RunStatus, Severity,
};
use gpusanity_common::stats::figure;

use crate::checks::remeasure::MEASUREMENTS;

/// Which deadline, if any, ended the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Overrun {
    None,
    /// A test overran its per-test limit: someone is stuck.
    Test,
    /// The whole run overran its max time: ranks may all have been progressing.
    Run,
}

pub struct Diagnosis {
    pub findings: Vec<Finding>,
    pub status: RunStatus,
    pub summary: String,
    /// Checks re-measured before the verdict, and why.
    pub remeasured: Vec<String>,
    /// The link test's figures, when it ran.
    pub pair_bandwidth: Vec<PairBandwidth>,
}

/// Places a finding on `rank` (its node and host).
pub(crate) fn place(mut f: Finding, ranks: &[RankInfo], rank: usize) -> Finding {
    f.rank = Some(rank);
    if let Some(r) = ranks.iter().find(|r| r.rank == rank) {
        f.node_rank = Some(r.node_rank);
        f.host = Some(r.host.clone());
    }
    f
}

/// Diagnoses `checks` in place (their statuses) and returns the findings and the verdict,
/// under the default configurations of `backend` with `slow_fraction`. `overrun` says which
/// deadline, if any, stopped the run.
pub fn diagnose(
    checks: &mut [CheckReport],
    ranks: &[RankInfo],
    slow_fraction: f64,
    overrun: Overrun,
    backend: DeviceKind,
) -> Diagnosis {
    let configs = CheckConfigs { slow_fraction, ..CheckConfigs::defaults(backend) };
    diagnose_with_baseline(checks, ranks, &configs, overrun, backend, None)
}

/// [`diagnose`] under the run's `configs`, with every headline figure also judged against the
/// fleet `baseline`.
pub fn diagnose_with_baseline(
    checks: &mut [CheckReport],
    ranks: &[RankInfo],
    configs: &CheckConfigs,
    overrun: Overrun,
    backend: DeviceKind,
    baseline: Option<&BaselineFile>,
) -> Diagnosis {
    let slow_fraction = configs.slow_fraction;
    let drivers = baseline.map(|_| gpusanity_common::fleet::samples::drivers(checks)).unwrap_or_default();
    let timed_out = overrun != Overrun::None;
    let bands = PeerBands::new(slow_fraction, backend == DeviceKind::Cpu);
    let mut findings = Vec::new();
    let mut remeasured = Vec::new();
    let mut pair_bandwidth = Vec::new();
    hang::attribute(checks, ranks, overrun, &mut findings);
    for c in checks.iter_mut() {
        let before = findings.len();
        crash::attribute(c, ranks, &mut findings);
        results::wrong_results(c, ranks, &mut findings);
        let id = c.name;
        if let Some(m) = id.metric() {
            note_comparison(c, m, ranks);
            slow_ranks(c, m, ranks, bands, &mut findings);
            if let Some(b) = baseline {
                fleet::judge(c, m, ranks, &drivers, b, backend, &mut findings);
            }
        }
        if id == CheckId::PairBandwidth {
            pair_bandwidth = link_findings(c, ranks, &mut findings);
        }
        // Hooks of other check families: one line each.
        micro::diagnose(c, ranks, configs, &mut findings);
        models::findings(c, ranks, slow_fraction, &mut findings);
        health::findings(c, ranks, &configs.gpu_health, &mut findings);
        if let Some(note) = c.ranks.iter().find_map(|r| r.notes.get("remeasured")) {
            remeasured.push(format!("{}: {note}", c.name));
        }
        let critical = findings[before..].iter().any(|f| f.severity == Severity::Critical);
        c.status = if c.ranks.iter().any(|r| r.status == CheckStatus::TimedOut) {
            CheckStatus::TimedOut
        } else if c.ranks.iter().all(|r| r.status == CheckStatus::NotRun) {
            CheckStatus::NotRun
        } else if !critical && !c.ranks.is_empty() && c.ranks.iter().all(|r| r.status == CheckStatus::NotApplicable) {
            CheckStatus::NotApplicable
        } else if critical
            || c.ranks.iter().any(|r| !matches!(r.status, CheckStatus::Passed | CheckStatus::NotApplicable))
        {
            if c.ranks.iter().any(|r| r.status == CheckStatus::Error) {
                CheckStatus::Error
            } else {
                CheckStatus::Failed
            }
        } else {
            CheckStatus::Passed
        };
    }
    let failed = findings.iter().any(|f| f.severity == Severity::Critical)
        || checks.iter().any(|c| !matches!(c.status, CheckStatus::Passed | CheckStatus::NotApplicable));
    let status = match (failed, timed_out) {
        (_, true) => RunStatus::TimedOut,
        (true, false) => RunStatus::Failed,
        (false, false) => RunStatus::Passed,
    };
    let summary = summarize(status, &findings, checks);
    Diagnosis { findings, status, summary, remeasured, pair_bandwidth }
}

/// Ranks per node, by node rank, as the rank list has them.
fn node_sizes(ranks: &[RankInfo]) -> Vec<usize> {
    let nodes = ranks.iter().map(|r| r.node_rank + 1).max().unwrap_or(0);
    let mut sizes = vec![0; nodes];
    for r in ranks {
        sizes[r.node_rank] += 1;
    }
    sizes
}

/// Says on every rank with a headline figure what it was compared with: its peers of the same
/// device model, the expected figure of that model on this topology, both, or neither. An
/// expected figure holds only for the topology it was measured on (common/data/expected.toml).
fn note_comparison(c: &mut CheckReport, m: &Metric, ranks: &[RankInfo]) {
    let when = Conditions::from_config(&c.config, &node_sizes(ranks)).with_link(common_link(ranks));
    let devices: HashMap<usize, &str> = ranks.iter().map(|r| (r.rank, r.device.as_str())).collect();
    let device = |rank: usize| devices.get(&rank).copied().unwrap_or_default();
    // Ranks measured, and how many of them per device model: linear in ranks.
    let measured: HashMap<usize, &str> = c
        .ranks
        .iter()
        .filter(|r| r.status == CheckStatus::Passed && r.metrics.contains_key(m.key))
        .map(|r| (r.rank, device(r.rank)))
        .collect();
    let mut of_model: HashMap<&str, usize> = HashMap::new();
    for model in measured.values() {
        *of_model.entry(model).or_default() += 1;
    }
    let mut expected_of: HashMap<&str, Option<&Entry>> = HashMap::new();
    for r in c.ranks.iter_mut() {
        let Some(&model) = measured.get(&r.rank) else { continue };
        let peers = of_model.get(model).copied().unwrap_or(1).saturating_sub(1);
        let expected =
            *expected_of.entry(model).or_insert_with(|| Expected::builtin().lookup(model, c.name, m.key, when));
        let peers_text = format!("{peers} peer{} of its model", if peers == 1 { "" } else { "s" });
        let text = match (peers > 0, expected) {
            (true, Some(e)) => {
                format!("{peers_text} and the expected {} {} on {}", figure(e.value), m.unit, when.topology())
            }
            (true, None) => format!("{peers_text} only: no expected figure for this device on {}", when.topology()),
            (false, Some(e)) => {
                format!("the expected {} {} on {} only: no peer of its model", figure(e.value), m.unit, when.topology())
            }
            (false, None) => {
                format!("nothing: no peer of its model and no expected figure for this device on {}", when.topology())
            }
        };
        r.notes.insert("compared_with".into(), text);
    }
}

/// Ranks below their peers or their expected figure. A rank re-measured by the workers is
/// judged on the better of its first and its last counted measurement (`checks/remeasure.rs`:
/// up to five while it stays slow), and carries both as evidence: a slow device is slow in all
/// of them, while a rank descheduled once or twice (cores shared with other work) is not named
/// for the measurements it lost.
fn slow_ranks(c: &CheckReport, m: &Metric, ranks: &[RankInfo], bands: PeerBands, findings: &mut Vec<Finding>) {
    let devices: HashMap<usize, &str> = ranks.iter().map(|r| (r.rank, r.device.as_str())).collect();
    let first_key = format!("first_{}", m.key);
    let figures: Figures = c
        .ranks
        .iter()
        .filter(|r| r.status == CheckStatus::Passed)
        .filter_map(|r| {
            let last = *r.metrics.get(m.key)?;
            let best = r.metrics.get(&first_key).map_or(last, |first| last.max(*first));
            Some((r.rank, devices.get(&r.rank)?.to_string(), best))
        })
        .collect();
    let judged = peers::judge(
        c.name,
        m.key,
        &figures,
        bands,
        Conditions::from_config(&c.config, &node_sizes(ranks)).with_link(common_link(ranks)),
    );
    let below: Vec<_> = judged.iter().filter(|j| j.severity().is_some()).collect();
    // A collective measured alike by every rank: one finding for the job.
    if m.collective && !below.is_empty() && below.len() == judged.len() {
        let j = below[0];
        let sev = below.iter().filter_map(|j| j.severity()).max().unwrap_or(Severity::Warning);
        let mut f = Finding::new(
            sev,
            m.below,
            c.name,
            format!("{:.1} {}, below the {:.1} a healthy device reaches", j.value, m.unit, j.expected.unwrap_or(0.0)),
        );
        f.measured = Some(j.value);
        f.expected = j.expected;
        f.action = Some("inspect the interconnect (NVLink/NIC state, topology, NCCL settings)".into());
        findings.push(f);
        return;
    }
    for j in below {
        let sev = j.severity().unwrap_or(Severity::Warning);
        let (code, msg) = if j.vs_peers.is_some() {
            (
                m.slow,
                format!(
                    "{} {}, {:.0}% of the peers' median {}",
                    figure(j.value),
                    m.unit,
                    100.0 * j.stats.relative(j.value),
                    figure(j.stats.median)
                ),
            )
        } else {
            (
                m.below,
                format!(
                    "{} {}, below the {} a healthy device of this model reaches",
                    figure(j.value),
                    m.unit,
                    figure(j.expected.unwrap_or(0.0))
                ),
            )
        };
        let mut f = place(Finding::new(sev, code, c.name, msg), ranks, j.rank);
        f.measured = Some(j.value);
        f.peers_median = Some(j.stats.median).filter(|_| figures.len() >= 2);
        f.peers_mad = Some(j.stats.mad).filter(|_| figures.len() >= 2);
        f.score = Some(j.stats.score(j.value)).filter(|s| s.is_finite());
        f.expected = j.expected;
        let result = c.ranks.iter().find(|r| r.rank == j.rank);
        if let Some((first, last)) = result.and_then(|r| Some((r.metrics.get(&first_key)?, r.metrics.get(m.key)?))) {
            // A report of before the further measurements: two.
            let n = result.and_then(|r| r.metrics.get(MEASUREMENTS)).map_or(2, |n| *n as usize);
            f.evidence.push(if n > 2 {
                format!("slow in all {n} measurements: first {first:.2}, last {last:.2} {}", m.unit)
            } else {
                format!("slow in both measurements: first {first:.2}, re-measured {last:.2} {}", m.unit)
            });
        }
        f.action = Some(match sev {
            Severity::Critical => {
                "exclude the node; check the device's clocks, temperature, power and other processes on it".into()
            }
            Severity::Warning => "watch the node: below its band but not far enough to exclude it".into(),
        });
        findings.push(f);
    }
}

/// The link test's findings and its figures (the same on every rank: the first rank's).
fn link_findings(c: &CheckReport, ranks: &[RankInfo], findings: &mut Vec<Finding>) -> Vec<PairBandwidth> {
    let Some(m) = c.ranks.iter().find_map(|r| match &r.detail {
        Some(CheckDetail::PairBandwidth { pairs }) => Some(pairs.clone()),
        _ => None,
    }) else {
        return Vec::new();
    };
    let nnodes = ranks.iter().map(|r| r.node_rank + 1).max().unwrap_or(0);
    let host = |n: usize| ranks.iter().find(|r| r.node_rank == n).map(|r| r.host.clone()).unwrap_or_default();
    let known_bad = findings.iter().filter(|f| f.severity == Severity::Critical).filter_map(|f| f.node_rank).collect();
    findings.extend(links::findings(nnodes, &m, host, &known_bad));
    m
}

fn summarize(status: RunStatus, findings: &[Finding], checks: &[CheckReport]) -> String {
    let mut bad: Vec<String> = Vec::new();
    for f in findings.iter().filter(|f| f.severity == Severity::Critical) {
        let place = match (f.rank, &f.host, f.node_rank, f.pair) {
            (Some(r), Some(h), _, _) => format!("rank {r} on {h}"),
            (None, Some(h), Some(n), _) => format!("node {n}, {h}"),
            (_, _, _, Some([a, b])) => format!("nodes {a}-{b}"),
            _ => "the job".into(),
        };
        let s = format!("{} in {} ({place})", f.code, f.check);
        if !bad.contains(&s) {
            bad.push(s);
        }
    }
    match status {
        RunStatus::Passed => {
            let names: Vec<String> = checks
                .iter()
                .map(|c| match c.status {
                    CheckStatus::NotApplicable => format!("{} (not applicable)", c.name),
                    _ => c.name.to_string(),
                })
                .collect();
            format!("all checks passed: {}", names.join(", "))
        }
        RunStatus::Skipped => "checks skipped".into(),
        _ if bad.is_empty() => "a check did not pass".into(),
        _ => bad.join("; "),
    }
}
