//! Ending a run: the verdict, the findings, the rows and the output events, in one transaction.

use gpusanity_common::report::{Code, DeviceKind, Finding, Report, Scope, Severity};
use gpusanity_common::verdict;
use gpusanity_common::wire::output::{FailReason, OutputBody};
use gpusanity_common::wire::Topics;
use gpusanity_db::lease::Fence;
use gpusanity_db::reputation::recheck_of;
use gpusanity_db::results::{finding_node, store_results};
use gpusanity_db::rows::{RunRow, ServiceRunState};
use gpusanity_db::runs;
use gpusanity_db::{outbox, Db, DbError};
use gpusanity_ingest::consume::output_event;
use thiserror::Error;

use super::config::RecheckConfig;
use super::recheck::{self, Faulty};

/// How a run ends: derived from the report and the service's facts in one place.
pub use gpusanity_common::verdict::Verdict;

/// How a run ended, with its evidence: the report of node 0 if any, and findings of the
/// service's own (lost agents, overruns).
pub struct Ending<'a> {
    pub verdict: Verdict,
    pub summary: &'a str,
    pub report: Option<&'a Report>,
    pub extra: &'a [Finding],
    /// The fence of the replica that owns the run (None: a person's decision, which holds no
    /// lease: the stored state alone decides).
    pub fence: Option<&'a Fence>,
    /// Nodes whose loss of contact overlapped a blind spell of the service's own: no
    /// NodeIsolated for them when that is their only critical evidence.
    pub withheld: &'a [String],
    /// Set when the verdict was reached across such a spell: said in every NodeIsolated.
    pub across: Option<&'a str>,
    /// Re-check and quarantine before isolation (None: a person's decision, isolated at once).
    pub recheck: Option<&'a RecheckConfig>,
}

/// The service's own findings that mean only a loss of contact with a node's agent.
const CONTACT_LOSS: [Code; 4] = [Code::AgentLost, Code::NoAgent, Code::AgentNoStart, Code::RunUnfinished];

/// Stores the end of `run` and queues its output events. False when the run had already ended
/// (or was already held): nothing is written twice.
pub async fn finish(
    db: &Db,
    topics: &Topics,
    report_url: &str,
    run: &RunRow,
    end: Ending<'_>,
) -> Result<bool, DbError> {
    let Ending { verdict, summary, report, extra, fence, withheld, across, recheck } = end;
    let mut findings: Vec<Finding> = report.map(|r| r.findings.clone()).unwrap_or_default();
    findings.extend(extra.iter().cloned());
    let report_json = report.map(serde_json::to_string).transpose()?;
    let url = report_url.replace("{run_id}", &run.run_id);
    let mut tx = db.begin().await?;
    let changed = match &verdict {
        Verdict::Hold => runs::hold_run(&mut tx, &run.run_id, summary, report_json.as_deref(), fence).await?,
        Verdict::Passed => {
            let state = ServiceRunState::CheckPassed;
            runs::finish_run(&mut tx, &run.run_id, state, summary, report_json.as_deref(), fence).await?
        }
        Verdict::Failed(_) => {
            let state = ServiceRunState::CheckFailed;
            runs::finish_run(&mut tx, &run.run_id, state, summary, report_json.as_deref(), fence).await?
        }
    };
    if !changed {
        return Ok(false);
    }
    // A re-check of one node after another run failed: it decides that node's isolation and
    // publishes no verdict of its own (the job's went out when the run it re-checks ended).
    let origin = recheck_of(&mut tx, &run.run_id).await?;
    // A held run stored its evidence when it was held; its resolution adds only the verdict.
    if !run.held {
        store_results(&mut tx, &run.run_id, &run.job_id, &run.nodes, report, &findings).await?;
        // The fleet learns from passed runs the coordinator decided (a fence: not a person's).
        if let (Verdict::Passed, Some(report), Some(_), None) = (&verdict, report, fence, &origin) {
            crate::fleet::learn(&mut tx, run, report).await?;
        }
    }
    // Nodes are isolated only by a failure (not while held, not when a person passes the run).
    let mut faulty = if matches!(verdict, Verdict::Failed(_)) { faulty_nodes(run, report, extra) } else { Vec::new() };
    if let Some(origin) = &origin {
        match verdict {
            // A failed re-check isolates the node it re-checks (its first), even when no
            // finding names it, and never the known-good partner of a link re-check.
            Verdict::Failed(_) => faulty = run.nodes.first().map(|n| n.name.clone()).into_iter().collect(),
            Verdict::Passed => recheck::cleared(&mut tx, run, origin).await?,
            Verdict::Hold => {}
        }
    }
    let peers: Vec<String> = run.nodes.iter().map(|n| n.name.clone()).filter(|n| !faulty.contains(n)).collect();
    let backend = report.map(|r| r.backend);
    let said = with_backend(summary, backend, run);
    let body = match verdict {
        Verdict::Hold => None,
        _ if origin.is_some() => None,
        Verdict::Passed => Some(OutputBody::CheckPassed {
            summary: said,
            report_url: url,
            backend,
            // A held run a person passed proves nothing about its nodes.
            passed_nodes: if run.held { Vec::new() } else { run.nodes.iter().map(|n| n.name.clone()).collect() },
        }),
        Verdict::Failed(reason) => Some(OutputBody::CheckFailed {
            summary: said,
            faulty_nodes: faulty.clone(),
            report_url: url,
            reason,
            backend,
        }),
    };
    let emit = |body| output_event(&run.job_id, &run.workspace_id, Some(&run.run_id), &run.cause_event_id, body);
    if let Some(body) = body {
        outbox::enqueue(&mut tx, &topics.output, &emit(body)).await?;
    }
    for node in &faulty {
        let critical = findings.iter().filter(|f| f.severity == Severity::Critical);
        let mut codes: Vec<Code> =
            critical.clone().filter(|f| finding_node(f, &run.nodes) == Some(node.as_str())).map(|f| f.code).collect();
        if codes.is_empty() && origin.is_some() {
            // A link re-check's findings may name its partner: they are the node's evidence,
            // unless they say only that the partner's agent was lost (nothing reproduced).
            codes = critical.map(|f| f.code).collect();
            codes.dedup();
            if !codes.is_empty() && codes.iter().all(|c| CONTACT_LOSS.contains(c)) {
                tracing::warn!(
                    run_id = run.run_id,
                    node,
                    ?codes,
                    "re-check inconclusive: its partner was lost; not isolated"
                );
                continue;
            }
        }
        if withheld.contains(node) && codes.iter().all(|c| CONTACT_LOSS.contains(c)) {
            tracing::warn!(
                run_id = run.run_id,
                node,
                "no NodeIsolated: the node's only evidence is a silence that overlapped the service's own outage"
            );
            continue;
        }
        let mut reason = format!("critical finding(s) in run {}", run.run_id);
        if let Some(note) = across {
            reason = format!("{reason}; {note}");
        }
        let f =
            Faulty { run, origin: origin.as_deref(), node, codes: &codes, findings: &findings, reason, peers: &peers };
        if let Some(body) = recheck::decide(&mut tx, f, recheck).await? {
            outbox::enqueue(&mut tx, &topics.output, &emit(body)).await?;
        }
    }
    tx.commit().await?;
    Ok(true)
}

/// The verdict event's summary: a GPU job checked on the CPU backend (an agent started with
/// `--device cpu`, a test rig) says so, so that nobody reads it as a check of the job's GPUs.
fn with_backend(summary: &str, backend: Option<DeviceKind>, run: &RunRow) -> String {
    match backend {
        Some(DeviceKind::Cpu) if run.nodes.iter().any(|n| n.gpus > 0) => {
            format!("{summary} [CPU backend: the agent runs with --device cpu; the job's GPUs were not checked]")
        }
        _ => summary.to_string(),
    }
}

/// Names of the run's nodes to isolate ([`verdict::faulty_nodes`]: the report's and those the
/// service's own critical findings name), in node order.
fn faulty_nodes(run: &RunRow, report: Option<&Report>, own: &[Finding]) -> Vec<String> {
    verdict::faulty_nodes(report, own).into_iter().filter_map(|k| run.nodes.get(k)).map(|n| n.name.clone()).collect()
}

/// A critical finding about node `k` of the run, found by the service itself.
pub fn node_finding(run: &RunRow, k: usize, code: Code, message: String) -> Finding {
    let mut f = Finding::new(Severity::Critical, code, Scope::Agent, message);
    f.node_rank = Some(k);
    f.host = run.nodes.get(k).map(|n| n.name.clone());
    f
}

/// Why a held run could not be resolved.
#[derive(Debug, Error)]
pub enum ResolveError {
    #[error("no run `{0}`")]
    NoRun(String),
    /// The run has ended, or is checking and not held.
    #[error("run `{run_id}` is {state} and not held by KeepJobHang")]
    NotHeld { run_id: String, state: &'static str },
    /// Another resolution, or the run's end, came first.
    #[error("run `{0}` was resolved meanwhile")]
    ResolvedMeanwhile(String),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// A person's decision on a held run (KeepJobHang): pass or fail it.
pub async fn resolve(
    db: &Db,
    topics: &Topics,
    report_url: &str,
    run_id: &str,
    pass: bool,
    note: &str,
) -> Result<RunRow, ResolveError> {
    let no_run = || ResolveError::NoRun(run_id.to_string());
    let run = db.get_run(run_id).await?.ok_or_else(no_run)?;
    if run.state != ServiceRunState::Checking || !run.held {
        return Err(ResolveError::NotHeld { run_id: run_id.to_string(), state: run.state.as_str() });
    }
    let summary = format!("resolved by an operator as {}: {note}", if pass { "passed" } else { "failed" });
    let verdict = if pass { Verdict::Passed } else { Verdict::Failed(FailReason::ResolvedByOperator) };
    let report = db.run_report(run_id).await?.and_then(|text| stored_report(run_id, &text));
    let end = Ending {
        verdict,
        summary: &summary,
        report: report.as_ref(),
        extra: &[],
        fence: None,
        withheld: &[],
        across: None,
        recheck: None,
    };
    if !finish(db, topics, report_url, &run, end).await? {
        return Err(ResolveError::ResolvedMeanwhile(run_id.to_string()));
    }
    db.get_run(run_id).await?.ok_or_else(no_run)
}

/// The stored report of `run_id`, read leniently ([`gpusanity_reports::lenient`]): a report that
/// another gpusanity version wrote keeps its faulty nodes and the findings this version knows.
/// `None` (logged) when it cannot be read at all.
pub(super) fn stored_report(run_id: &str, text: &str) -> Option<Report> {
    match gpusanity_reports::lenient::read(text) {
        Ok(read) => {
            if !read.left_out.is_empty() {
                tracing::warn!(run_id, left_out = ?read.left_out, "the stored report was read without parts this version does not know");
            }
            Some(read.report)
        }
        Err(e) => {
            tracing::warn!(run_id, "the stored report cannot be read: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use gpusanity_common::registry::CheckId;
    use gpusanity_common::report::{RunStatus, REPORT_SCHEMA_VERSION};
    use gpusanity_common::Settings;

    use super::*;

    /// A failed report naming node 1, with a finding about it.
    fn failed_report() -> Report {
        let now = chrono::Utc::now();
        let mut slow = Finding::new(Severity::Critical, Code::GemmSlow, CheckId::Gemm, "slow".into());
        slow.node_rank = Some(1);
        Report {
            schema_version: REPORT_SCHEMA_VERSION,
            gpusanity_version: "newer".into(),
            run_id: "r".into(),
            started_at: now,
            finished_at: now,
            status: RunStatus::Failed,
            summary: String::new(),
            settings: Settings::default(),
            backend: DeviceKind::Cpu,
            nodes: Vec::new(),
            ranks: Vec::new(),
            checks: Vec::new(),
            findings: vec![slow],
            events: Vec::new(),
            node_verdicts: Vec::new(),
            faulty_nodes: vec![1],
            remeasured: Vec::new(),
            pair_bandwidth: Vec::new(),
            sweep_summaries: Vec::new(),
            hosts: Vec::new(),
        }
    }

    #[test]
    fn a_stored_report_of_another_version_keeps_its_faulty_nodes() {
        let mut v = serde_json::to_value(failed_report()).expect("a report");
        let mut newer = v["findings"][0].clone();
        newer["code"] = serde_json::json!("X_FUTURE_CODE");
        v["findings"].as_array_mut().expect("findings").push(newer);
        let text = v.to_string();
        assert!(serde_json::from_str::<Report>(&text).is_err(), "the strict reader refuses it");
        let read = stored_report("r", &text).expect("read leniently");
        assert_eq!(read.faulty_nodes, [1]);
        assert_eq!(verdict::faulty_nodes(Some(&read), &[]), [1]);
        assert_eq!(read.findings, failed_report().findings, "the unknown finding is left out, the known one kept");
        assert_eq!(stored_report("r", "{not json"), None);
        assert_eq!(stored_report("r", r#"{"schema_version": "one"}"#), None);
    }
}
