//! The verdict of a run, derived in one place. The data plane's diagnosis states it in the
//! report (`status`, `node_verdicts`, `faulty_nodes`); the control plane takes it from there and
//! adds only what the report cannot know, by the rules of [`run_verdict`] and [`faulty_nodes`]:
//! the service's own findings (an agent lost while the run went on, no report at all) and the
//! run's timeout policy.

use crate::findings::Finding;
use crate::kinds::Severity;
use crate::report::{Report, RunStatus};
use crate::wire::output::FailReason;

/// How a run ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Passed,
    Failed(FailReason),
    /// A timed-out run under KeepJobHang: it stays Checking, held for a person.
    Hold,
}

impl Verdict {
    /// (verdict, reason) for the metrics.
    pub fn label(&self) -> (&'static str, String) {
        match self {
            Verdict::Passed => ("passed", String::new()),
            Verdict::Hold => ("held", String::new()),
            Verdict::Failed(r) => (
                "failed",
                serde_json::to_value(r).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default(),
            ),
        }
    }
}

/// Why the run ends, as the control plane saw it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Stop {
    /// The data plane's word decides: node 0's launcher ended (with a report, or without one),
    /// or what the service has of the run cannot be used (a refused result, unreadable
    /// settings): no report then means the check could not run.
    #[default]
    DataPlane,
    /// The service stopped the run before node 0's verdict because of its agents (missing,
    /// lost, or not starting the run): its own critical findings say why.
    Agents,
    /// The run overran its deadline (plus the service's grace) without node 0's verdict.
    Overran,
}

/// What the control plane knows of a run beyond node 0's report.
#[derive(Debug, Clone, Copy, Default)]
pub struct ServiceFacts<'a> {
    /// The service's own findings about the run (an agent lost while it ran...).
    pub own: &'a [Finding],
    /// The run's timeout policy is KeepJobHang: a timed-out run is held rather than failed.
    pub keep_job_hang: bool,
    /// Why the run ends.
    pub stop: Stop,
}

/// The verdict of a run from node 0's report (`None`: the data plane ended without one) and
/// the service's facts, in this order:
///
/// 1. the service's own overrun ([`Stop::Overran`]): held under KeepJobHang, else failed,
///    [`FailReason::TimedOut`];
/// 2. stopped for its agents ([`Stop::Agents`]): failed, [`FailReason::CheckFailed`];
/// 3. no report: failed, [`FailReason::Error`] (the check could not run);
/// 4. a critical finding of the service's own: failed, [`FailReason::CheckFailed`], whatever
///    the report says (it cannot vouch for a node whose agent was lost);
/// 5. else the report's status: passed or skipped pass; failed fails with
///    [`FailReason::CheckFailed`]; timed out holds under KeepJobHang, else fails with
///    [`FailReason::TimedOut`].
pub fn run_verdict(report: Option<&Report>, facts: ServiceFacts<'_>) -> Verdict {
    match facts.stop {
        Stop::Overran if facts.keep_job_hang => return Verdict::Hold,
        Stop::Overran => return Verdict::Failed(FailReason::TimedOut),
        Stop::Agents => return Verdict::Failed(FailReason::CheckFailed),
        Stop::DataPlane => {}
    }
    let Some(report) = report else {
        return Verdict::Failed(FailReason::Error);
    };
    if facts.own.iter().any(|f| f.severity == Severity::Critical) {
        return Verdict::Failed(FailReason::CheckFailed);
    }
    match report.status {
        RunStatus::Passed | RunStatus::Skipped => Verdict::Passed,
        RunStatus::Failed => Verdict::Failed(FailReason::CheckFailed),
        RunStatus::TimedOut if facts.keep_job_hang => Verdict::Hold,
        RunStatus::TimedOut => Verdict::Failed(FailReason::TimedOut),
    }
}

/// The node ranks to isolate: the report's `faulty_nodes` as the data plane stated them, and
/// every node that a critical finding of the service's own names; in order, each once.
pub fn faulty_nodes(report: Option<&Report>, own: &[Finding]) -> Vec<usize> {
    let stated = report.map(|r| r.faulty_nodes.as_slice()).unwrap_or_default();
    let mine = own.iter().filter(|f| f.severity == Severity::Critical).filter_map(|f| f.node_rank);
    let mut nodes: Vec<usize> = stated.iter().copied().chain(mine).collect();
    nodes.sort_unstable();
    nodes.dedup();
    nodes
}

#[cfg(test)]
mod tests;
