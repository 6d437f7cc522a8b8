//! Diagnosis of the model checks (`mini-gpt`, `megatron-gpt`, `resnet`), called from
//! [`super::diagnose`] for each of them:
//!
//! - a rank whose loss went NaN/inf first is named (ranks that got it later through the shared
//!   gradients are warnings), as is a rank whose loss did not fall;
//! - parameters must be identical on every rank of a data-parallel group: a rank whose
//!   parameters changed after their last update, or that disagrees with the group's majority,
//!   is silent data corruption;
//! - a rank whose own compute time per step (before the all-reduce equalizes everyone) is far
//!   above its peers' of the same device model is slow.

use std::collections::BTreeMap;

use gpusanity_common::findings::Code;
use gpusanity_common::registry::{CheckGroup, CheckId};
use gpusanity_common::report::{CheckDetail, CheckReport, CheckStatus, Finding, RankInfo, RankResult, Severity};

use gpusanity_common::stats::median;

use super::place;

/// What the diagnosis reads of a model check's detail.
struct Model<'a> {
    loss_finding: Option<Code>,
    dp_group: usize,
    param_checksum: &'a str,
    changed_at_rest: Option<&'a str>,
}

/// The model detail of rank result `r`, if it has one.
fn model(r: &RankResult) -> Option<Model<'_>> {
    match &r.detail {
        Some(CheckDetail::Model { loss_finding, dp_group, param_checksum, changed_at_rest, .. }) => Some(Model {
            loss_finding: *loss_finding,
            dp_group: *dp_group,
            param_checksum,
            changed_at_rest: changed_at_rest.as_deref(),
        }),
        _ => None,
    }
}

/// Whether `check` is a model check.
pub fn is_model(check: CheckId) -> bool {
    check.group() == CheckGroup::Model
}

/// Adds the findings of model check `c` (a no-op for other checks).
pub fn findings(c: &CheckReport, ranks: &[RankInfo], slow_fraction: f64, out: &mut Vec<Finding>) {
    if !is_model(c.name) {
        return;
    }
    let name = c.name;
    let failed: Vec<&RankResult> = c.ranks.iter().filter(|r| r.status == CheckStatus::Failed).collect();
    let bad_step = |r: &RankResult| r.metrics.get("first_bad_step").copied();
    let first_nan = failed.iter().filter_map(|r| bad_step(r)).fold(f64::INFINITY, f64::min);
    let firsts: Vec<String> =
        failed.iter().filter(|r| bad_step(r) == Some(first_nan)).map(|r| r.rank.to_string()).collect();
    for r in &failed {
        let why = r.error.clone().unwrap_or_else(|| "training failed".into());
        let noted = model(r).and_then(|m| m.loss_finding);
        let (sev, code, msg) = match (noted, bad_step(r)) {
            (Some(Code::ModelLossNotFinite), Some(s)) if s > first_nan => (
                Severity::Warning,
                Code::ModelLossNotFinite,
                format!("{why} (after rank {}'s at step {first_nan}, through the shared gradients)", firsts.join(", ")),
            ),
            (Some(code), _) => (Severity::Critical, code, why),
            // Only the parameter self-check failed: reported below with the checksums.
            (None, _) => continue,
        };
        out.push(place(Finding::new(sev, code, name, msg), ranks, r.rank));
    }
    checksums(c, ranks, out);
    slow(c, ranks, slow_fraction, out);
}

/// Parameters of one data-parallel group must be bit-identical after training.
fn checksums(c: &CheckReport, ranks: &[RankInfo], out: &mut Vec<Finding>) {
    let mut groups: BTreeMap<usize, Vec<(usize, Model<'_>)>> = BTreeMap::new();
    for r in &c.ranks {
        if let Some(m) = model(r) {
            groups.entry(m.dp_group).or_default().push((r.rank, m));
        }
    }
    const CODE: Code = Code::ModelSilentDataCorruption;
    for group in groups.values() {
        let sum = |m: &Model<'_>| m.param_checksum.to_string();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for (_, m) in group {
            *counts.entry(sum(m)).or_default() += 1;
        }
        let at_rest: Vec<&(usize, Model<'_>)> = group.iter().filter(|(_, m)| m.changed_at_rest.is_some()).collect();
        if counts.len() < 2 && at_rest.is_empty() {
            continue;
        }
        let (major, n) = counts.iter().max_by_key(|(_, n)| **n).map(|(h, n)| (h.clone(), *n)).unwrap_or_default();
        let has_majority = 2 * n > group.len();
        let mut named = Vec::new();
        for (rank, m) in group {
            let rest = m.changed_at_rest.is_some();
            let minority = has_majority && sum(m) != major;
            if !(rest || minority) {
                continue;
            }
            let mut parts = Vec::new();
            if minority {
                parts.push(format!(
                    "parameters after training differ from its data-parallel peers' (checksum {}, majority {major})",
                    sum(m)
                ));
            }
            if let Some(sums) = m.changed_at_rest {
                parts.push(format!("its parameters changed in memory after the last optimizer update ({sums})"));
            }
            let why = parts.join("; ");
            out.push(place(Finding::new(Severity::Critical, CODE, c.name, why), ranks, *rank));
            named.push(*rank);
        }
        if named.is_empty() {
            let list: Vec<String> = group.iter().map(|(rank, m)| format!("rank {rank}: {}", sum(m))).collect();
            let msg = format!("parameters differ between data-parallel ranks with no majority ({})", list.join(", "));
            out.push(Finding::new(Severity::Critical, CODE, c.name, msg));
        }
    }
}

/// A rank whose own compute per step takes far longer than its peers': its step rate (the
/// inverse of `compute_ms_median`) below `slow_fraction` of its device model's peers' median
/// rate (a rate, as for GEMM TFLOP/s, so that one slow rank of two can be named).
fn slow(c: &CheckReport, ranks: &[RankInfo], slow_fraction: f64, out: &mut Vec<Finding>) {
    let mut by_device: BTreeMap<&str, Vec<(usize, f64)>> = BTreeMap::new();
    for r in c.ranks.iter().filter(|r| r.status == CheckStatus::Passed) {
        if let (Some(v), Some(i)) = (r.metrics.get("compute_ms_median"), ranks.iter().find(|i| i.rank == r.rank)) {
            by_device.entry(i.device.as_str()).or_default().push((r.rank, *v));
        }
    }
    for group in by_device.values().filter(|g| g.len() >= 2) {
        let rates: Vec<f64> = group.iter().map(|(_, ms)| 1e3 / ms).collect();
        let med = median(&rates);
        for ((rank, ms), rate) in group.iter().zip(&rates).filter(|(_, rate)| **rate < slow_fraction * med) {
            let msg = format!(
                "{ms:.1} ms of compute per training step ({rate:.1} steps/s), below {:.0}% of the peers' median {med:.1} steps/s",
                slow_fraction * 100.0
            );
            let mut f = place(Finding::new(Severity::Critical, Code::ModelSlowStep, c.name, msg), ranks, *rank);
            f.measured = Some(*rate);
            f.peers_median = Some(med);
            out.push(f);
        }
    }
}

#[cfg(test)]
mod tests;
