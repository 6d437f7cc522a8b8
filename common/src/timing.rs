//! The timing policy (`--sanity-check-timing`): does this start of the job get a check? One
//! rule for `gpusanity check` (which knows the restart count) and the service (which knows the
//! job event and the restart's reason).

use crate::wire::job::RestartReason;
use crate::Timing;

/// Whether a start gets a check, or why not.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Run,
    Skip(String),
}

/// What kind of start this is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start<'a> {
    /// `gpusanity check` with a restart count of 0: the job's first start.
    First,
    /// JobResourcesAllocated: the job's start (attempt 0) or a new allocation.
    Allocated,
    /// A restart whose reason is known (JobRestarted).
    Restarted(&'a RestartReason),
    /// `gpusanity check` with a restart count above 0: the platform restarts a job through the
    /// fault-tolerance machinery, so such a start counts as a fault-tolerant restart.
    Restart,
}

impl Start<'_> {
    /// The start `gpusanity check` sees, from the job's restart count.
    pub fn from_restart_count(restart_count: u64) -> Start<'static> {
        if restart_count == 0 {
            Start::First
        } else {
            Start::Restart
        }
    }
}

/// `BeforeJobRunning` checks every start; `AfterJobFaultTolerant` only a fault-tolerant restart.
pub fn decide(timing: Timing, start: &Start) -> Decision {
    match (timing, start) {
        (Timing::BeforeJobRunning, _) => Decision::Run,
        (Timing::AfterJobFaultTolerant, Start::Restarted(RestartReason::FaultTolerant) | Start::Restart) => {
            Decision::Run
        }
        (Timing::AfterJobFaultTolerant, Start::First) => {
            Decision::Skip("AfterJobFaultTolerant: this is the job's first start, not a fault-tolerant restart".into())
        }
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

    #[test]
    fn before_runs_always_after_only_on_a_fault_tolerant_restart() {
        let (before, after) = (Timing::BeforeJobRunning, Timing::AfterJobFaultTolerant);
        for s in [Start::First, Start::Allocated, Start::Restart, Start::Restarted(&RestartReason::Manual)] {
            assert_eq!(decide(before, &s), Decision::Run);
        }
        assert_eq!(decide(after, &Start::Restarted(&RestartReason::FaultTolerant)), Decision::Run);
        assert_eq!(decide(after, &Start::from_restart_count(2)), Decision::Run);
        assert!(matches!(decide(after, &Start::from_restart_count(0)), Decision::Skip(r) if r.contains("first start")));
        assert!(matches!(decide(after, &Start::Allocated), Decision::Skip(r) if r.contains("job's start")));
        assert!(
            matches!(decide(after, &Start::Restarted(&RestartReason::Manual)), Decision::Skip(r) if r.contains("Manual"))
        );
    }
}
