//! Crash and error attribution: the rank whose process died first (its exit status or signal
//! and its last output lines) and the ranks that raised errors. Ranks stopped because of another rank
//! are not at fault, and an error beside a crash in the same check is most likely its
//! consequence (a peer gone): a warning.

use gpusanity_common::findings::Code;
use gpusanity_common::rank_end::RankEnd;
use gpusanity_common::report::{CheckReport, CheckStatus, Finding, RankInfo, RankResult, Severity};

use super::place;

pub fn attribute(c: &CheckReport, ranks: &[RankInfo], findings: &mut Vec<Finding>) {
    let errored: Vec<_> = c
        .ranks
        .iter()
        .filter(|r| r.status == CheckStatus::Error && !end(r).is_some_and(|e| e.stopped.is_some() || e.node_lost))
        .collect();
    let exit = |r: &RankResult| end(r).and_then(|e| e.exit.clone());
    let crashed: Vec<String> = errored.iter().filter(|r| exit(r).is_some()).map(|r| r.rank.to_string()).collect();
    // The rank that died first (by its exit time, when known): later deaths may be its
    // consequence (a peer gone), so they are warnings.
    let died_at = |r: &RankResult| end(r).and_then(|e| e.exit_unix_ms);
    let first = errored.iter().filter(|r| exit(r).is_some()).filter_map(|r| Some((died_at(r)?, r.rank))).min();
    for r in &errored {
        let why = r.error.clone().unwrap_or_else(|| "failed".into());
        // The first line is the status; the rest is the process's last output.
        let mut lines = why.lines();
        let head = lines.next().unwrap_or_default().to_string();
        let tail: Vec<String> =
            lines.filter(|l| !l.trim().is_empty() && *l != "last output:").map(str::to_string).collect();
        let later = first.filter(|(t, rank)| *rank != r.rank && died_at(r).is_some_and(|mine| mine > *t));
        let (sev, code, msg, action) = if let (Some(exit), Some((t, rank))) = (exit(r), later) {
            let after = died_at(r).unwrap_or(t).saturating_sub(t);
            (
                Severity::Warning,
                Code::WorkerCrashed,
                format!("the worker process {exit}, {after} ms after rank {rank} died first"),
                "none: most likely a consequence of the first crash",
            )
        } else if let Some(exit) = exit(r) {
            (
                Severity::Critical,
                Code::WorkerCrashed,
                format!("the worker process {exit}"),
                "exclude the node; read the worker's last output (driver or hardware fault?)",
            )
        } else if crashed.is_empty() {
            (
                Severity::Critical,
                Code::CheckError,
                head.clone(),
                "exclude the node; the device or its link raised an error",
            )
        } else {
            (
                Severity::Warning,
                Code::CheckError,
                format!("{head} (after rank {} crashed)", crashed.join(", ")),
                "none: a consequence of the crash",
            )
        };
        let mut f = place(Finding::new(sev, code, c.name, msg), ranks, r.rank);
        f.evidence = tail;
        f.action = Some(action.into());
        findings.push(f);
    }
}

/// The launcher's account of a rank that did not finish.
fn end(r: &RankResult) -> Option<&RankEnd> {
    r.end.as_deref()
}
