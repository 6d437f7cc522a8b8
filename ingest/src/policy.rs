//! The scope rule of the service (PyTorch jobs with GPUs, EnableSanityCheck) and then the timing
//! policy of `gpusanity_common::timing`: does this job event start a check run?

use gpusanity_common::timing;
pub use gpusanity_common::timing::{Decision, Start};
use gpusanity_common::wire::job::JobNode;
use gpusanity_common::Settings;

/// The scope (PyTorch jobs with at least one GPU), EnableSanityCheck, then the timing policy of
/// [`timing::decide`].
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
    timing::decide(settings.timing, start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusanity_common::wire::job::RestartReason;

    fn node(gpus: u32) -> JobNode {
        JobNode { name: "a".into(), address: "x".into(), gpus, gpu_ids: Vec::new() }
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
