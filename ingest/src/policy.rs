//! The timing policy and the scope rule: does this job event start a check run?

use gpusanity_common::wire::job::{JobNode, RestartReason};
use gpusanity_common::{Settings, Timing};

/// Why a job event starts a run, or why it does not.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Run,
    Skip(String),
}

/// What kind of start the event announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start<'a> {
    /// JobResourcesAllocated: the job's start (attempt 0) or a new allocation.
    Allocated,
    Restarted(&'a RestartReason),
}

/// DESIGN §2.3 scope (PyTorch jobs with at least one GPU), EnableSanityCheck, then the timing:
/// `BeforeJobRunning` checks every start; `AfterJobFaultTolerant` only a fault-tolerant restart.
pub fn decide(
    framework: Option<&str>,
    nodes: &[JobNode],
    enabled: bool,
    settings: &Settings,
    start: &Start,
) -> Decision {
    if let Some(f) = framework {
        if !f.eq_ignore_ascii_case("pytorch") {
            return Decision::Skip(format!("out of scope: framework `{f}` is not PyTorch"));
        }
    }
    if nodes.iter().map(|n| u64::from(n.gpus)).sum::<u64>() == 0 {
        return Decision::Skip("out of scope: the job has no GPUs".into());
    }
    if !enabled {
        return Decision::Skip("EnableSanityCheck is off".into());
    }
    match (settings.timing, start) {
        (Timing::BeforeJobRunning, _) => Decision::Run,
        (Timing::AfterJobFaultTolerant, Start::Restarted(RestartReason::FaultTolerant)) => Decision::Run,
        (Timing::AfterJobFaultTolerant, Start::Allocated) => {
            Decision::Skip("AfterJobFaultTolerant: this is the job's start, not a fault-tolerant restart".into())
        }
        (Timing::AfterJobFaultTolerant, Start::Restarted(r)) => {
            Decision::Skip(format!("AfterJobFaultTolerant: the restart's reason is {r:?}, not FaultTolerant"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(gpus: u32) -> JobNode {
        JobNode { name: "a".into(), address: "x".into(), gpus }
    }

    #[test]
    fn timing_and_scope() {
        let before = Settings::default();
        let after = Settings::from_args_str("--sanity-check-timing=AfterJobFaultTolerant").unwrap();
        let n = [node(8)];
        assert_eq!(decide(None, &n, true, &before, &Start::Allocated), Decision::Run);
        assert!(matches!(decide(None, &n, true, &after, &Start::Allocated), Decision::Skip(_)));
        assert_eq!(decide(None, &n, true, &after, &Start::Restarted(&RestartReason::FaultTolerant)), Decision::Run);
        assert!(matches!(decide(None, &n, true, &after, &Start::Restarted(&RestartReason::Manual)), Decision::Skip(_)));
        assert_eq!(decide(None, &n, true, &before, &Start::Restarted(&RestartReason::Manual)), Decision::Run);
        assert!(
            matches!(decide(Some("JAX"), &n, true, &before, &Start::Allocated), Decision::Skip(r) if r.contains("JAX"))
        );
        assert_eq!(decide(Some("pytorch"), &n, true, &before, &Start::Allocated), Decision::Run);
        assert!(
            matches!(decide(None, &[node(0)], true, &before, &Start::Allocated), Decision::Skip(r) if r.contains("no GPUs"))
        );
        assert!(matches!(decide(None, &n, false, &before, &Start::Allocated), Decision::Skip(_)));
    }
}
