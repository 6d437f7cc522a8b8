//! Wrong results: a rank whose check's own verifier failed, and GEMM products that differ
//! between ranks of the same device model.

use std::collections::{BTreeMap, HashMap};

use gpusanity_common::checks::WrongResult;
use gpusanity_common::detail::CheckDetail;
use gpusanity_common::findings::Code;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{CheckReport, CheckStatus, Finding, RankInfo, Severity};

use super::place;

/// Wrong results found by the checks' own verifiers, and GEMM products that differ.
pub fn wrong_results(c: &CheckReport, ranks: &[RankInfo], findings: &mut Vec<Finding>) {
    // Some checks name their own failures (a failed probe or a diverging loss is not a wrong
    // product).
    let code = match c.name.descriptor().wrong_result {
        WrongResult::Own => return,
        WrongResult::Code(code) => code,
    };
    for r in c.ranks.iter().filter(|r| r.status == CheckStatus::Failed) {
        let why = r.error.clone().unwrap_or_else(|| "verification failed".into());
        let mut f = place(Finding::new(Severity::Critical, code, c.name, why), ranks, r.rank);
        f.action =
            Some("exclude the node; the device computes or moves data wrongly (reset the GPU, then re-check)".into());
        findings.push(f);
    }
    if c.name == CheckId::Gemm {
        hash_disagreement(c, ranks, findings);
    }
}

/// Ranks of one device model must compute bit-identical products from identical inputs. A rank
/// that disagrees with a strict majority is named; without a majority, a warning.
fn hash_disagreement(c: &CheckReport, ranks: &[RankInfo], findings: &mut Vec<Finding>) {
    let devices: HashMap<usize, &str> = ranks.iter().map(|i| (i.rank, i.device.as_str())).collect();
    let mut by_device: BTreeMap<&str, Vec<(usize, &str)>> = BTreeMap::new();
    for r in &c.ranks {
        if let (Some(CheckDetail::Gemm { result_hash: h }), Some(&device)) = (&r.detail, devices.get(&r.rank)) {
            by_device.entry(device).or_default().push((r.rank, h.as_str()));
        }
    }
    for group in by_device.values() {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, h) in group {
            *counts.entry(h).or_default() += 1;
        }
        if counts.len() < 2 {
            continue;
        }
        let (major, n) = counts.iter().max_by_key(|(_, n)| **n).map(|(h, n)| (*h, *n)).unwrap_or(("", 0));
        if 2 * n > group.len() {
            for (rank, h) in group.iter().filter(|(_, h)| *h != major) {
                let msg = format!("GEMM result differs from the majority of its peers (hash {h}, majority {major})");
                let mut f =
                    place(Finding::new(Severity::Critical, Code::GemmResultMismatch, c.name, msg), ranks, *rank);
                f.action = Some("exclude the node; the device computes wrongly (reset the GPU, then re-check)".into());
                findings.push(f);
            }
        } else {
            let list: Vec<String> = group.iter().map(|(r, h)| format!("rank {r}: {h}")).collect();
            let msg = format!("GEMM results differ between ranks with no majority ({})", list.join(", "));
            findings.push(Finding::new(Severity::Warning, Code::GemmResultMismatch, c.name, msg));
        }
    }
}
