use chrono::Utc;

use super::*;
use crate::findings::Code;
use crate::kinds::DeviceKind;
use crate::registry::Scope;
use crate::settings::Settings;

fn report(status: RunStatus, faulty: &[usize]) -> Report {
    Report {
        schema_version: crate::report::REPORT_SCHEMA_VERSION,
        gpusanity_version: "test".into(),
        run_id: "r".into(),
        started_at: Utc::now(),
        finished_at: Utc::now(),
        status,
        summary: String::new(),
        settings: Settings::default(),
        backend: DeviceKind::Cpu,
        nodes: Vec::new(),
        ranks: Vec::new(),
        checks: Vec::new(),
        findings: Vec::new(),
        events: Vec::new(),
        node_verdicts: Vec::new(),
        faulty_nodes: faulty.to_vec(),
        remeasured: Vec::new(),
        pair_bandwidth: Vec::new(),
        sweep_summaries: Vec::new(),
        hosts: Vec::new(),
    }
}

/// A finding of the service's own about node `k`.
fn own(severity: Severity, k: usize) -> Finding {
    let mut f = Finding::new(severity, Code::AgentLost, Scope::Agent, "lost".into());
    f.node_rank = Some(k);
    f
}

#[test]
fn the_report_decides_unless_the_service_knows_worse() {
    let facts = |own: &'static [Finding], keep| ServiceFacts { own, keep_job_hang: keep, stop: Stop::DataPlane };
    let none = facts(&[], false);
    let cases = [
        (RunStatus::Passed, none, Verdict::Passed),
        (RunStatus::Skipped, none, Verdict::Passed),
        (RunStatus::Failed, none, Verdict::Failed(FailReason::CheckFailed)),
        (RunStatus::TimedOut, none, Verdict::Failed(FailReason::TimedOut)),
        (RunStatus::TimedOut, facts(&[], true), Verdict::Hold),
    ];
    for (status, facts, want) in cases {
        assert_eq!(run_verdict(Some(&report(status, &[])), facts), want, "{status:?}");
    }
    // No report: the check could not run, whatever else is known.
    assert_eq!(run_verdict(None, none), Verdict::Failed(FailReason::Error));
    assert_eq!(run_verdict(None, facts(&[], true)), Verdict::Failed(FailReason::Error));
}

#[test]
fn a_lost_agent_fails_a_passed_or_held_run_and_a_warning_does_not() {
    let lost = [own(Severity::Critical, 1)];
    let warned = [own(Severity::Warning, 1)];
    for status in [RunStatus::Passed, RunStatus::Skipped, RunStatus::Failed, RunStatus::TimedOut] {
        let r = report(status, &[]);
        let v = run_verdict(Some(&r), ServiceFacts { own: &lost, keep_job_hang: true, ..Default::default() });
        assert_eq!(v, Verdict::Failed(FailReason::CheckFailed), "{status:?}");
    }
    let v = run_verdict(Some(&report(RunStatus::Passed, &[])), ServiceFacts { own: &warned, ..Default::default() });
    assert_eq!(v, Verdict::Passed);
}

#[test]
fn the_services_own_stops_decide_without_a_report() {
    let lost = [own(Severity::Critical, 1)];
    let stop = |stop, keep_job_hang| ServiceFacts { own: &lost, keep_job_hang, stop };
    assert_eq!(run_verdict(None, stop(Stop::Overran, true)), Verdict::Hold);
    assert_eq!(run_verdict(None, stop(Stop::Overran, false)), Verdict::Failed(FailReason::TimedOut));
    assert_eq!(run_verdict(None, stop(Stop::Agents, true)), Verdict::Failed(FailReason::CheckFailed));
    assert_eq!(run_verdict(None, stop(Stop::DataPlane, true)), Verdict::Failed(FailReason::Error));
    // An overrun holds even beside a report and critical findings of the service's own: the
    // policy is about the run's time, not about its evidence.
    let r = report(RunStatus::Passed, &[]);
    assert_eq!(run_verdict(Some(&r), stop(Stop::Overran, true)), Verdict::Hold);
    assert_eq!(run_verdict(Some(&r), ServiceFacts::default()), Verdict::Passed);
}

#[test]
fn faulty_nodes_are_the_reports_and_the_services_own_once_each() {
    let r = report(RunStatus::Failed, &[3, 1]);
    let own = [own(Severity::Critical, 1), own(Severity::Critical, 0), own(Severity::Warning, 5)];
    assert_eq!(faulty_nodes(Some(&r), &own), [0, 1, 3]);
    assert_eq!(faulty_nodes(Some(&r), &[]), [1, 3]);
    assert_eq!(faulty_nodes(None, &own), [0, 1]);
    assert!(faulty_nodes(None, &[]).is_empty());
}

#[test]
fn labels_name_the_verdict_and_its_reason() {
    assert_eq!(Verdict::Passed.label(), ("passed", String::new()));
    assert_eq!(Verdict::Hold.label(), ("held", String::new()));
    assert_eq!(Verdict::Failed(FailReason::TimedOut).label(), ("failed", "timed_out".to_string()));
}
