//! What a report asks of Slurm: drain every faulty node of a failed run; resume every node of
//! a passed run (each only if gpusanity drained it).

use gpusanity_common::report::{NodeHealth, Report, RunStatus};

use crate::drain_reason;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Drain { node: String, reason: String },
    ResumeIfOurs { node: String },
}

/// The actions for `report`, with drain reasons under `prefix`. A run that failed or timed
/// out drains its faulty nodes (suspect ones are only reported); a passed run resumes its
/// nodes; a skipped run (no check) does nothing. Healthy nodes of a failed run are left as
/// they are: a run that did not pass has not shown that every check passes on them.
pub fn plan(report: &Report, prefix: &str) -> Vec<Action> {
    match report.status {
        RunStatus::Skipped => Vec::new(),
        RunStatus::Passed => {
            report.node_verdicts.iter().map(|v| Action::ResumeIfOurs { node: v.host.clone() }).collect()
        }
        RunStatus::Failed | RunStatus::TimedOut => report
            .node_verdicts
            .iter()
            .filter(|v| v.health == NodeHealth::Faulty)
            .map(|v| {
                // The first critical finding placed on this node is the evidence.
                let evidence =
                    report.evidence(v.node_rank).map(|f| format!("in {}: {}", f.check, f.message)).unwrap_or_default();
                Action::Drain { node: v.host.clone(), reason: drain_reason(prefix, &v.codes, &evidence) }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusanity_common::report::{CheckId, Code, DeviceKind, Finding, NodeVerdict, Severity};

    fn report(status: RunStatus, health: [NodeHealth; 3]) -> Report {
        let now = chrono::Utc::now();
        let node_verdicts = health
            .iter()
            .enumerate()
            .map(|(k, h)| NodeVerdict {
                node_rank: k,
                host: format!("node{}", k + 1),
                health: *h,
                codes: if *h == NodeHealth::Healthy { vec![] } else { vec![Code::GemmWrongResult] },
            })
            .collect();
        let mut warn = Finding::new(Severity::Warning, Code::GemmSlow, CheckId::Gemm, "a bit slow".into());
        warn.node_rank = Some(1);
        let mut crit =
            Finding::new(Severity::Critical, Code::GemmWrongResult, CheckId::Gemm, "tile differs \"x\"\n".into());
        crit.node_rank = Some(1);
        Report {
            schema_version: 1,
            gpusanity_version: "0".into(),
            run_id: "r".into(),
            started_at: now,
            finished_at: now,
            status,
            summary: String::new(),
            settings: Default::default(),
            backend: DeviceKind::Cpu,
            nodes: vec![],
            ranks: vec![],
            checks: vec![],
            findings: vec![warn, crit],
            events: vec![],
            node_verdicts,
            faulty_nodes: vec![],
            remeasured: vec![],
            pair_bandwidth: vec![],
            sweep_summaries: Vec::new(),
            hosts: Vec::new(),
        }
    }

    #[test]
    fn a_failed_run_drains_its_faulty_nodes_only_with_the_evidence() {
        use NodeHealth::*;
        let r = report(RunStatus::Failed, [Healthy, Faulty, Suspect]);
        let reason = "gpusanity: GEMM_WRONG_RESULT in gemm: tile differs x".to_string();
        assert_eq!(plan(&r, "gpusanity:"), [Action::Drain { node: "node2".into(), reason }]);
        let r = report(RunStatus::TimedOut, [Faulty, Healthy, Healthy]);
        assert!(
            matches!(&plan(&r, "hc:")[..], [Action::Drain { node, reason }] if node == "node1" && reason == "hc: GEMM_WRONG_RESULT")
        );
    }

    #[test]
    fn a_passed_run_resumes_every_node_and_a_skipped_one_does_nothing() {
        use NodeHealth::*;
        let r = report(RunStatus::Passed, [Healthy, Healthy, Healthy]);
        let nodes: Vec<Action> = (1..=3).map(|k| Action::ResumeIfOurs { node: format!("node{k}") }).collect();
        assert_eq!(plan(&r, "gpusanity:"), nodes);
        assert!(plan(&report(RunStatus::Skipped, [Healthy, Healthy, Healthy]), "gpusanity:").is_empty());
    }
}
