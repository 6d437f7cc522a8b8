//! Before a node is isolated (docs/fleet.md, "Re-check and quarantine"): a definitive failure
//! isolates it at once; a node that failed `quarantine_failures` of its last
//! `quarantine_window` runs is quarantined without a re-check; otherwise a re-check run of the
//! node alone is stored in the transaction that ends the failed run, and the node is isolated
//! only when that run fails too. Every decision is stored with its reason (`node_decisions`).
//!
//! A finding of a check that probes between nodes (`Needs::TwoNodes`: connectivity, pair
//! bandwidth) cannot be reproduced by a node alone: that check would measure nothing and the
//! node would be cleared by a run that looked at nothing. Such a re-check pairs the node with a
//! known-good node of the failed run (one not named faulty there, whose recent job runs all
//! passed); the pair's run isolates only the node under re-check, whichever of the two its
//! findings name. Without such a partner, the node is isolated at once, and the decision says
//! why.
//!
//! A re-check is an ordinary run of one node (`runs.recheck_of`): the replica holding the
//! failed run's job-events partition claims it, tasks the node's agent and ends it under its
//! lease, so among replicas it is done once and survives a replica's crash.

use gpusanity_common::checks::Needs;
use gpusanity_common::envs::FAULT_ENV;
use gpusanity_common::findings::Code;
use gpusanity_common::registry::{CheckId, Scope};
use gpusanity_common::report::{Finding, Severity};
use gpusanity_common::wire::output::{IsolationBasis, IsolationDecision, OutputBody};
use gpusanity_common::{Settings, TimeoutOps};
use gpusanity_db::reputation::{insert_recheck, recent_outcomes, record_decision, Basis, Decided, NodeDecision};
use gpusanity_db::results::finding_node;
use gpusanity_db::rows::{RunRow, ServiceRunState};
use gpusanity_db::{now_ms, DbError, Tx};

use super::config::RecheckConfig;

/// One faulty node of an ending run.
pub struct Faulty<'a> {
    pub run: &'a RunRow,
    /// The run `run` re-checks (None: a job's own run).
    pub origin: Option<&'a str>,
    pub node: &'a str,
    /// The codes of the node's critical findings.
    pub codes: &'a [Code],
    /// Every finding of the run.
    pub findings: &'a [Finding],
    /// The reason every NodeIsolated of the run starts with.
    pub reason: String,
    /// The run's nodes not named faulty, in node order: the partners a link re-check may take.
    pub peers: &'a [String],
}

/// Decides about one faulty node in the transaction that ends its run: the NodeIsolated to
/// publish now, or None when a re-check was made instead. `config` None: a person's decision
/// (no lease to hand a re-check to), isolated at once.
pub async fn decide(tx: &mut Tx, f: Faulty<'_>, config: Option<&RecheckConfig>) -> Result<Option<OutputBody>, DbError> {
    let defaults = RecheckConfig::default();
    let c = config.unwrap_or(&defaults);
    let outcomes = recent_outcomes(tx, f.node, c.quarantine_window).await?;
    let failures = u32::try_from(outcomes.iter().filter(|h| !**h).count()).unwrap_or(u32::MAX);
    let needs = needs_partner(&f);
    let partner = if needs { known_good(tx, f.peers, c.quarantine_window).await? } else { None };
    let mut immediate = "isolated without a re-check (re-checks off, or a person's decision)".to_string();
    let said = |basis: IsolationBasis, immediate: &str| match basis {
        IsolationBasis::Definitive => format!("definitive: {}", gpusanity_db::column::code_list(f.codes)),
        IsolationBasis::Quarantine => {
            format!("quarantine: failed {failures} of its last {} runs", outcomes.len())
        }
        IsolationBasis::Reproduced => format!("re-check of run {} reproduced the failure", f.origin.unwrap_or("")),
        IsolationBasis::Immediate => immediate.to_string(),
    };
    let basis = match (f.origin, config) {
        (Some(_), _) => IsolationBasis::Reproduced,
        (None, Some(c)) if c.enabled => {
            if f.codes.iter().any(|code| c.definitive.contains(code)) {
                IsolationBasis::Definitive
            } else if failures >= c.quarantine_failures {
                IsolationBasis::Quarantine
            } else if needs && partner.is_none() {
                immediate = "isolated without a re-check: a finding between nodes, and no node of the run known to be \
                             good to pair the re-check with"
                    .into();
                IsolationBasis::Immediate
            } else {
                match recheck_run(f.run, f.node, f.findings, c, partner.as_deref()) {
                    Ok(recheck) => {
                        start_recheck(tx, &f, &recheck, partner.as_deref(), failures, outcomes.len()).await?;
                        return Ok(None);
                    }
                    Err(e) => {
                        tracing::warn!(run_id = f.run.run_id, node = f.node, "no re-check: {e}");
                        immediate = format!("isolated without a re-check: {e}");
                        IsolationBasis::Immediate
                    }
                }
            }
        }
        (None, _) => IsolationBasis::Immediate,
    };
    let reason = format!("{}; {}", f.reason, said(basis, &immediate));
    let recheck = f.origin.map(|_| f.run.run_id.clone());
    let d = decision(f.node, &f.run.run_id, Decided::Isolated, basis.into(), reason.clone(), f.codes, recheck.clone());
    record_decision(tx, &d).await?;
    Ok(Some(OutputBody::NodeIsolated {
        node: f.node.to_string(),
        codes: f.codes.to_vec(),
        reason,
        decision: Some(IsolationDecision {
            basis,
            failed_run: f.origin.unwrap_or(&f.run.run_id).to_string(),
            recheck_run: recheck,
            failures,
            window: u32::try_from(outcomes.len()).unwrap_or(u32::MAX),
        }),
        gpus: f.run.nodes.iter().find(|n| n.name == f.node).map(|n| n.gpu_ids.clone()).unwrap_or_default(),
    }))
}

/// Stores the re-check run of a faulty node and the decision that says so.
async fn start_recheck(
    tx: &mut Tx,
    f: &Faulty<'_>,
    recheck: &RunRow,
    partner: Option<&str>,
    failures: u32,
    window: usize,
) -> Result<(), DbError> {
    insert_recheck(tx, recheck, &f.run.run_id).await?;
    let with = partner.map_or("alone".to_string(), |p| format!("paired with known-good node {p}"));
    let why = format!(
        "{}; re-checking the node {with} in run {} before isolating it (failed {failures} of its last {window} runs)",
        f.reason, recheck.run_id,
    );
    tracing::info!(run_id = f.run.run_id, node = f.node, recheck = recheck.run_id, "re-checking before isolation");
    let d = decision(
        f.node,
        &f.run.run_id,
        Decided::Rechecking,
        Basis::Recheck,
        why,
        f.codes,
        Some(recheck.run_id.clone()),
    );
    record_decision(tx, &d).await
}

/// The checks the node's critical findings of the run name.
fn failed_checks(run: &RunRow, node: &str, findings: &[Finding]) -> Vec<CheckId> {
    findings
        .iter()
        .filter(|f| f.severity == Severity::Critical && finding_node(f, &run.nodes) == Some(node))
        .filter_map(|f| match f.check {
            Scope::Check(id) => Some(id),
            _ => None,
        })
        .collect()
}

/// Whether a re-check of the node must pair it with another node: one of its failed checks
/// probes between nodes.
fn needs_partner(f: &Faulty<'_>) -> bool {
    failed_checks(f.run, f.node, f.findings).iter().any(|id| id.descriptor().needs == Needs::TwoNodes)
}

/// The first of `peers` whose last `window` job runs all passed, the run being ended (stored
/// already) and at least one before it: a node the fleet has reason to trust, to pair a link
/// re-check with, not only one this run's diagnosis did not name.
async fn known_good(tx: &mut Tx, peers: &[String], window: u32) -> Result<Option<String>, DbError> {
    for p in peers {
        let outcomes = recent_outcomes(tx, p, window.max(2)).await?;
        if outcomes.len() >= 2 && outcomes.iter().all(|healthy| *healthy) {
            return Ok(Some(p.clone()));
        }
    }
    Ok(None)
}

/// A re-check run `run` (of run `origin`) passed: the node is not isolated.
pub async fn cleared(tx: &mut Tx, run: &RunRow, origin: &str) -> Result<(), DbError> {
    let Some(node) = run.nodes.first() else { return Ok(()) };
    let reason = format!("re-check run {} of run {origin} passed: not isolated", run.run_id);
    tracing::info!(run_id = run.run_id, node = node.name, "re-check passed: not isolated");
    record_decision(tx, &decision(&node.name, &run.run_id, Decided::Cleared, Basis::RecheckPassed, reason, &[], None))
        .await
}

fn decision(
    node: &str,
    run_id: &str,
    decided: Decided,
    basis: Basis,
    reason: String,
    codes: &[Code],
    recheck_run: Option<String>,
) -> NodeDecision {
    NodeDecision {
        node_name: node.to_string(),
        run_id: run_id.to_string(),
        decision: decided,
        basis,
        reason,
        codes: codes.to_vec(),
        recheck_run,
        at: now_ms(),
    }
}

/// The re-check of `node` after `run` failed: that node alone, the checks its critical
/// findings name (all of the run's when they name none), the run's settings without fault
/// injection (it was the failed run's), failing rather than holding on a timeout, then
/// `extra_args`. An error when the run's settings do not read back or the re-check's
/// arguments do not apply (the node is isolated at once then, and its decision says why).
fn recheck_run(
    run: &RunRow,
    node: &str,
    findings: &[Finding],
    c: &RecheckConfig,
    partner: Option<&str>,
) -> Result<RunRow, RecheckError> {
    let job_node = run.nodes.iter().find(|n| n.name == node).ok_or_else(|| RecheckError::NotInRun(node.to_string()))?;
    // The node under re-check first: a failed re-check isolates its first node only.
    let mut nodes = vec![job_node.clone()];
    nodes.extend(partner.and_then(|p| run.nodes.iter().find(|n| n.name == p)).cloned());
    let mut s: Settings = serde_json::from_value(run.settings.clone()).map_err(RecheckError::StoredSettings)?;
    let failed = failed_checks(run, node, findings);
    if s.selected_checks().iter().any(|id| failed.contains(id)) {
        s.micro_benchmarks.retain(|id| failed.contains(id));
        s.model_benchmarks.retain(|id| failed.contains(id));
    }
    s.envs.retain(|(k, _)| k != FAULT_ENV);
    s.timeout_ops = TimeoutOps::MarkJobFail;
    s.apply_args_str(&c.extra_args).map_err(RecheckError::ExtraArgs)?;
    s.validate().map_err(RecheckError::ExtraArgs)?;
    let now = now_ms();
    let max_ms = (s.max_time_minutes * 60_000.0) as i64;
    Ok(RunRow {
        run_id: uuid::Uuid::new_v4().to_string(),
        job_id: run.job_id.clone(),
        workspace_id: run.workspace_id.clone(),
        attempt: run.attempt,
        cause_event_id: run.cause_event_id.clone(),
        nodes,
        check_args: s.to_args_string(),
        settings: serde_json::to_value(&s).map_err(RecheckError::StoredSettings)?,
        state: ServiceRunState::Checking,
        held: false,
        created_at: now,
        deadline_at: now.saturating_add(max_ms),
        finished_at: None,
        summary: match partner {
            Some(p) => format!("re-check of node {node}, paired with {p}, after run {}", run.run_id),
            None => format!("re-check of node {node} after run {}", run.run_id),
        },
    })
}

/// Why no re-check run could be made for a faulty node.
#[derive(Debug, thiserror::Error)]
enum RecheckError {
    #[error("node {0} is not a node of the run")]
    NotInRun(String),
    #[error("the run's stored settings do not read back: {0}")]
    StoredSettings(serde_json::Error),
    #[error("the re-check's arguments (recheck.extra_args) do not apply to the run's settings: {0}")]
    ExtraArgs(gpusanity_common::settings::SettingsError),
}
