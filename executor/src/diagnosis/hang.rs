//! Hang attribution: when a test overran, the ranks that never reached the point the others
//! wait at (culprits) apart from the ranks waiting there.
//!
//! Culprits, in order of evidence: ranks whose heartbeats stopped (process stopped or dead);
//! else, when a node never reported, nobody among the live ranks (they waited for that node);
//! else the ranks that made the least progress (check, phase, step) — unless the whole run
//! merely ran out of time with every rank alive.

use gpusanity_common::findings::Code;
use gpusanity_common::report::{CheckReport, CheckStatus, Finding, RankInfo, RankResult, Severity};

use super::{place, Overrun};

/// A worker whose last heartbeat is older than this is not running.
pub const STALE_HEARTBEAT_S: f64 = 2.0;

fn age(r: &RankResult) -> f64 {
    r.end.as_ref().and_then(|e| e.heartbeat_age_s).unwrap_or(0.0)
}

fn seq(r: &RankResult) -> f64 {
    r.end.as_ref().and_then(|e| e.progress_seq).unwrap_or(0) as f64
}

fn last(r: &RankResult) -> String {
    r.end.as_ref().and_then(|e| e.last_progress.clone()).unwrap_or_else(|| "no progress reported".into())
}

/// Attributes an overrun over all checks at once: nodes move through the checks at their own
/// pace, so a rank stuck in one check leaves its peers waiting at the start of the next. The
/// culprits are the ranks whose heartbeats stopped, else the ranks with the least progress in
/// the earliest check that overran; every other rank that overran was waiting.
pub fn attribute(checks: &[CheckReport], ranks: &[RankInfo], overrun: Overrun, findings: &mut Vec<Finding>) {
    let hung: Vec<(usize, &RankResult)> = checks
        .iter()
        .enumerate()
        .flat_map(|(k, c)| c.ranks.iter().filter(|r| r.status == CheckStatus::TimedOut).map(move |r| (k, r)))
        .collect();
    let Some(first) = hung.iter().map(|(k, _)| *k).min() else {
        return;
    };
    let node_lost = checks.iter().any(|c| c.ranks.iter().any(|r| r.end.as_ref().is_some_and(|e| e.node_lost)));
    let stale: Vec<(usize, &RankResult)> = hung.iter().copied().filter(|(_, r)| age(r) > STALE_HEARTBEAT_S).collect();
    let culprits: Vec<(usize, &RankResult)> = if !stale.is_empty() {
        stale
    } else if overrun == Overrun::Run || node_lost {
        Vec::new()
    } else {
        let earliest: Vec<(usize, &RankResult)> = hung.iter().copied().filter(|(k, _)| *k == first).collect();
        let min = earliest.iter().map(|(_, r)| seq(r)).fold(f64::INFINITY, f64::min);
        // Everyone equally far: no rank stands out, all are named.
        earliest.into_iter().filter(|(_, r)| seq(r) == min).collect()
    };
    let waiting: Vec<(usize, &RankResult)> =
        hung.iter().copied().filter(|(_, r)| !culprits.iter().any(|(_, c)| c.rank == r.rank)).collect();
    let waiting_list: Vec<String> = waiting.iter().map(|(_, r)| r.rank.to_string()).collect();
    for (k, r) in &culprits {
        let state = if age(r) > STALE_HEARTBEAT_S {
            format!("no heartbeat for {:.1} s (process stopped or dead)", age(r))
        } else {
            "alive but not progressing".into()
        };
        let mut msg = format!("never reached the point its peers wait at: {state}; last progress: {}", last(r));
        if !waiting.is_empty() {
            msg.push_str(&format!("; ranks {} were waiting for it", waiting_list.join(", ")));
        }
        let mut f = place(Finding::new(Severity::Critical, Code::TestHang, checks[*k].name, msg), ranks, r.rank);
        f.evidence.push(format!("rank {}: last progress {}, heartbeat age {:.1} s", r.rank, last(r), age(r)));
        f.evidence.extend(
            waiting.iter().map(|(wk, w)| format!("rank {} waiting in {}: {}", w.rank, checks[*wk].name, last(w))),
        );
        f.action = Some(if age(r) > STALE_HEARTBEAT_S {
            "exclude the node; check the process state and the device (reset the GPU)".into()
        } else {
            "exclude the node; the device stopped making progress (reset the GPU)".into()
        });
        findings.push(f);
    }
}
