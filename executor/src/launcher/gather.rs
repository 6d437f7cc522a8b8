//! Node 0 merges the nodes' outcomes into one report and diagnoses it.

use gpusanity_common::config::CheckConfigs;
use gpusanity_common::findings::Code;
use gpusanity_common::fleet::file::BaselineFile;
use gpusanity_common::rank_end::RankEnd;
use gpusanity_common::registry::{CheckId, Scope};
use gpusanity_common::report::{
    CheckReport, CheckStatus, DeviceKind, Finding, NodeInfo, RankInfo, RankResult, Report, Severity,
    REPORT_SCHEMA_VERSION,
};
use gpusanity_common::Settings;

use super::supervise::{NodeOutcome, Stop};
use crate::diagnosis;

pub struct RunMeta {
    pub run_id: String,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub settings: Settings,
    pub backend: DeviceKind,
    pub configs: CheckConfigs,
    pub checks: Vec<CheckId>,
}

/// `outcomes[k]` is node k's outcome, or None if it never reported.
/// `baseline`: the fleet baseline every headline figure is also judged against.
pub fn build_report(
    meta: &RunMeta,
    nodes: &[NodeInfo],
    outcomes: &[Option<NodeOutcome>],
    baseline: Option<&BaselineFile>,
) -> Report {
    let mut ranks: Vec<RankInfo> = Vec::new();
    let mut checks = not_run_checks(meta);
    let mut lost = Vec::new();
    let mut overrun = diagnosis::Overrun::None;
    let mut stops: Vec<Stop> = Vec::new();
    let mut offset = 0;
    for (k, node) in nodes.iter().enumerate() {
        match outcomes.get(k).and_then(Option::as_ref) {
            Some(o) => {
                ranks.extend(o.ranks.iter().cloned());
                match &o.stop {
                    Some(Stop::TestTimeout { .. } | Stop::Stalled { .. }) => overrun = diagnosis::Overrun::Test,
                    Some(Stop::RunTimeout { .. }) if overrun == diagnosis::Overrun::None => {
                        overrun = diagnosis::Overrun::Run
                    }
                    _ => {}
                }
                if let Some(s) = &o.stop {
                    stops.push(s.clone());
                }
                for (c, (dur, results)) in checks.iter_mut().zip(&o.checks) {
                    c.duration_s = c.duration_s.max(*dur);
                    c.ranks.extend(results.iter().cloned());
                }
            }
            None => {
                lost.push(node.clone());
                for local in 0..node.nproc {
                    let rank = offset + local;
                    ranks.push(RankInfo {
                        rank,
                        node_rank: k,
                        local_rank: local,
                        host: node.hostname.clone(),
                        device: String::new(),
                        pid: 0,
                        link: None,
                    });
                    for c in checks.iter_mut() {
                        let mut r = RankResult::new(rank, CheckStatus::Error);
                        r.end = Some(Box::new(RankEnd { node_lost: true, ..RankEnd::default() }));
                        c.ranks.push(r);
                    }
                }
            }
        }
        offset += node.nproc;
    }
    ranks.sort_by_key(|r| r.rank);
    for c in checks.iter_mut() {
        c.ranks.sort_by_key(|r| r.rank);
    }
    let mut diag =
        diagnosis::diagnose_with_baseline(&mut checks, &ranks, &meta.configs, overrun, meta.backend, baseline);
    // A stall stopped the test before its limit: say so beside the hang it names.
    if let Some(Stop::Stalled { node_rank, check, stall_s, silent_rank }) =
        stops.iter().find(|s| matches!(s, Stop::Stalled { .. }))
    {
        let why = match silent_rank {
            Some(r) => format!("rank {r} sent no heartbeat"),
            None => "no rank progressed".to_string(),
        };
        let line = format!(
            "{check} stopped by node {node_rank} after {stall_s:.0} s in which {why} (diagnosis.stall-s), before the per-test limit"
        );
        for f in diag.findings.iter_mut().filter(|f| f.code == Code::TestHang) {
            f.evidence.push(line.clone());
        }
    }
    // What ended the run, when no rank is to blame for it.
    for stop in stops.iter().take(1) {
        let (code, message) = match stop {
            Stop::RunTimeout { limit_s, .. } => {
                (Code::RunTimeout, format!("the whole check overran --sanity-check-max-time ({limit_s:.0} s)"))
            }
            Stop::Interrupted { node_rank, signal } => {
                (Code::RunInterrupted, format!("the launcher of node {node_rank} was stopped by {signal}"))
            }
            _ => continue,
        };
        diag.findings.push(Finding::new(Severity::Critical, code, Scope::Run, message.clone()));
        if diag.summary == "a check did not pass" || diag.summary.is_empty() {
            diag.summary = format!("{code}: {message}");
        }
    }
    for node in &lost {
        let mut f = Finding::new(
            Severity::Critical,
            Code::NodeLost,
            Scope::Rendezvous,
            format!(
                "node {} ({}, {}) never reported its results: unreachable (network down) or dead",
                node.node_rank, node.hostname, node.addr
            ),
        );
        f.node_rank = Some(node.node_rank);
        f.host = Some(node.hostname.clone());
        f.action = Some("exclude the node; check its network link and whether it is up".into());
        diag.findings.insert(0, f);
    }
    if !lost.is_empty() && diag.status == gpusanity_common::report::RunStatus::Passed {
        diag.status = gpusanity_common::report::RunStatus::Failed;
    }
    if !lost.is_empty() {
        let names: Vec<String> = lost.iter().map(|n| n.hostname.clone()).collect();
        diag.summary = format!("NODE_LOST ({}); {}", names.join(", "), diag.summary);
    }
    let (host_findings, hosts) = super::host::fold(nodes, outcomes);
    diag.findings.extend(host_findings.iter().cloned());
    let node_verdicts = diagnosis::verdict::node_verdicts(nodes, &diag.findings);
    let faulty_nodes = diagnosis::verdict::faulty_nodes(&node_verdicts);
    let mut report = Report {
        node_verdicts,
        faulty_nodes,
        remeasured: diag.remeasured,
        pair_bandwidth: diag.pair_bandwidth,
        sweep_summaries: Vec::new(),
        hosts,
        schema_version: REPORT_SCHEMA_VERSION,
        gpusanity_version: env!("CARGO_PKG_VERSION").into(),
        run_id: meta.run_id.clone(),
        started_at: meta.started_at,
        finished_at: chrono::Utc::now(),
        status: diag.status,
        summary: diag.summary,
        settings: meta.settings.clone(),
        backend: meta.backend,
        nodes: nodes.to_vec(),
        ranks,
        checks,
        findings: diag.findings,
        events: Vec::new(),
    };
    super::host::apply(&mut report, &host_findings);
    super::compact::compact(&mut report);
    report
}

/// Every selected check, not run yet, with the configuration it runs with.
fn not_run_checks(meta: &RunMeta) -> Vec<CheckReport> {
    meta.checks
        .iter()
        .map(|name| CheckReport {
            name: *name,
            status: CheckStatus::NotRun,
            duration_s: 0.0,
            config: name.config_value(&meta.configs),
            ranks: Vec::new(),
        })
        .collect()
}

/// The report of a run some of whose nodes never arrived at the rendezvous: no check ran, each
/// missing node is named (rank and what is known of it), and the run fails. `not_ready` holds
/// the findings of the nodes that arrived but cannot run the job's GPUs.
pub fn missing_report(
    meta: &RunMeta,
    nodes: &[NodeInfo],
    missing: &[usize],
    waited: std::time::Duration,
    not_ready: Vec<Finding>,
) -> Report {
    let mut findings = Vec::new();
    for &k in missing {
        let mut f = Finding::new(
            Severity::Critical,
            Code::NodeMissing,
            Scope::Rendezvous,
            format!(
                "node {k}{} of {} never arrived at the rendezvous within {:.0} s: not started, unreachable, or dead",
                nodes
                    .get(k)
                    .filter(|n| n.hostname != format!("node {k}"))
                    .map_or(String::new(), |n| format!(" ({})", n.hostname)),
                nodes.len(),
                waited.as_secs_f64()
            ),
        );
        f.node_rank = Some(k);
        f.host = nodes.get(k).map(|n| n.hostname.clone());
        f.evidence.push(format!("nodes that arrived: {}", arrived(nodes, missing)));
        f.action =
            Some("exclude the node or start its launcher; check that it reaches node 0's address and port".into());
        findings.push(f);
    }
    let list: Vec<String> = missing.iter().map(|k| k.to_string()).collect();
    let summary = format!("NODE_MISSING: node(s) {} never arrived at the rendezvous", list.join(", "));
    findings.extend(not_ready);
    early_report(meta, nodes, findings, summary)
}

/// The report of a run that failed before any check ran: every selected check not run, the
/// findings that stopped it, and the nodes they name faulty.
pub fn early_report(meta: &RunMeta, nodes: &[NodeInfo], findings: Vec<Finding>, summary: String) -> Report {
    let checks = not_run_checks(meta);
    let node_verdicts = diagnosis::verdict::node_verdicts(nodes, &findings);
    let faulty_nodes = diagnosis::verdict::faulty_nodes(&node_verdicts);
    Report {
        node_verdicts,
        faulty_nodes,
        remeasured: Vec::new(),
        pair_bandwidth: Vec::new(),
        sweep_summaries: Vec::new(),
        hosts: Vec::new(),
        schema_version: REPORT_SCHEMA_VERSION,
        gpusanity_version: env!("CARGO_PKG_VERSION").into(),
        run_id: meta.run_id.clone(),
        started_at: meta.started_at,
        finished_at: chrono::Utc::now(),
        status: gpusanity_common::report::RunStatus::Failed,
        summary,
        settings: meta.settings.clone(),
        backend: meta.backend,
        nodes: nodes.to_vec(),
        ranks: Vec::new(),
        checks,
        findings,
        events: Vec::new(),
    }
}

fn arrived(nodes: &[NodeInfo], missing: &[usize]) -> String {
    let v: Vec<String> = nodes
        .iter()
        .filter(|n| !missing.contains(&n.node_rank))
        .map(|n| format!("{} ({}, {})", n.node_rank, n.hostname, n.addr))
        .collect();
    v.join(", ")
}
