//! A node other than node 0 that cannot run the job's GPUs is named with its evidence: it
//! brings its readiness findings (readiness.rs) to the rendezvous in its registration instead
//! of devices, and once every node has arrived node 0 writes the report and the verdict naming
//! each such node (its GPUs' PCI bus ids, the error) while every node exits 1 without a check.
//!
//! What a node sends is bounded and placed here, not trusted: only readiness codes, at most
//! [`MAX_FINDINGS`] of them, strings cut short, and each finding put on the node that sent it
//! (a node cannot blame another).

use std::time::Duration;

use anyhow::Result;
use gpusanity_common::config::CheckConfigs;
use gpusanity_common::events::CheckState;
use gpusanity_common::report::{Code, DeviceKind, Finding, NodeInfo, RunStatus, Scope, Severity};
use gpusanity_common::ExitCode;

use super::events::EventLog;
use super::gather;
use super::node::{Cluster, RunEnd};
use super::{CheckOptions, Finished, Handover};

/// The most findings one node's registration may bring.
pub const MAX_FINDINGS: usize = 8;
/// The longest message, evidence line or action kept of a node's finding.
const MAX_TEXT: usize = 2048;
/// The most evidence lines kept of one finding.
const MAX_EVIDENCE: usize = 16;
/// How long a node that is not node 0 waits for node 0's verdict before it exits.
const VERDICT_WAIT: Duration = Duration::from_secs(30);

/// The readiness findings that node `info` sent, bounded and placed on it. A node that said it
/// is not ready but sent nothing usable is still not ready: one finding says so.
pub fn accepted(info: &NodeInfo, sent: &[Finding]) -> Vec<Finding> {
    if sent.is_empty() {
        return Vec::new();
    }
    let mut kept: Vec<Finding> = sent
        .iter()
        .filter(|f| {
            matches!(f.code, Code::NodeGpuUnusable | Code::NodeGpusMissing | Code::NodeNoGpu | Code::NodeDriverTooOld)
        })
        .take(MAX_FINDINGS)
        .map(|f| bounded(f, Severity::Critical))
        .collect();
    if kept.is_empty() {
        kept.push(Finding::new(
            Severity::Critical,
            Code::NodeGpuUnusable,
            Scope::Device,
            format!("node {}: said it cannot run the job's GPUs but sent no readiness finding", info.hostname),
        ));
    }
    for f in &mut kept {
        f.node_rank = Some(info.node_rank);
        f.host = Some(info.hostname.clone());
    }
    kept
}

/// A node's own finding as node 0 keeps it: at `severity`, in the device scope, its text and
/// evidence bounded, its figures finite, unplaced (the caller places it on the node that sent it).
pub(crate) fn bounded(f: &Finding, severity: Severity) -> Finding {
    let mut g = Finding::new(severity, f.code, Scope::Device, cut(&f.message));
    g.measured = f.measured.filter(|v| v.is_finite());
    g.expected = f.expected.filter(|v| v.is_finite());
    g.evidence = f.evidence.iter().take(MAX_EVIDENCE).map(|e| cut(e)).collect();
    g.action = f.action.as_deref().map(cut);
    g
}

fn cut(s: &str) -> String {
    s.chars().take(MAX_TEXT).collect()
}

/// One line naming every finding: the report's summary and a node's stderr.
pub fn summary(findings: &[Finding]) -> String {
    findings.iter().map(|f| format!("{}: {}", f.code, f.message)).collect::<Vec<_>>().join("; ")
}

/// Node 0's report of a run that no check ran in because some nodes cannot run the job's GPUs;
/// written, printed, and returned.
pub fn write_report(
    opts: &CheckOptions,
    run_id: String,
    backend: DeviceKind,
    configs: &CheckConfigs,
    nodes: &[NodeInfo],
    findings: Vec<Finding>,
) -> Result<gpusanity_common::report::Report> {
    let mut log = EventLog::new(Some(opts.report_dir.as_path()))?;
    let hosts: Vec<&str> = nodes
        .iter()
        .filter(|n| findings.iter().any(|f| f.node_rank == Some(n.node_rank)))
        .map(|n| n.hostname.as_str())
        .collect();
    log.push(CheckState::Checking, format!("{}: node(s) {} not ready", opts.device, hosts.join(", ")))?;
    let meta = gather::RunMeta {
        run_id,
        started_at: chrono::Utc::now(),
        settings: opts.settings.clone(),
        backend,
        configs: configs.clone(),
        checks: opts.settings.selected_checks(),
    };
    let line = summary(&findings);
    let mut report = gather::early_report(&meta, nodes, findings, line);
    log.push(CheckState::CheckFailed, report.summary.clone())?;
    report.events = log.events.clone();
    super::write_report(&opts.report_dir, &report)?;
    print!("{}", gpusanity_reports::text::summary(&report));
    Ok(report)
}

/// Every node arrived and some cannot run the job: node 0 reports and publishes the verdict;
/// every other node says why on stderr, acknowledges the verdict and exits 1.
pub async fn conclude(
    opts: &CheckOptions,
    cluster: &Cluster,
    backend: DeviceKind,
    configs: &CheckConfigs,
    findings: Vec<Finding>,
    summary: &str,
) -> Result<Finished> {
    if cluster.node_rank != 0 {
        eprintln!("gpusanity: error: node(s) not ready, no check runs: {summary}");
        if let Err(e) = cluster.await_verdict(VERDICT_WAIT).await {
            tracing::warn!("no verdict from node 0: {e:#}");
        }
        return Ok(Handover::Exit(ExitCode::CheckFailed).into());
    }
    let report = write_report(opts, cluster.run_id.clone(), backend, configs, &cluster.nodes, findings)?;
    let v = RunEnd { status: RunStatus::Failed, summary: report.summary.clone(), hold: false };
    cluster.publish_verdict(&v).await;
    Ok(Finished { handover: Handover::Exit(ExitCode::CheckFailed), report: Some(report) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> NodeInfo {
        NodeInfo { node_rank: 3, hostname: "gpu-d".into(), addr: "10.0.0.4".into(), nproc: 0 }
    }

    #[test]
    fn a_node_cannot_blame_another_nor_send_other_codes_nor_grow_without_bound() {
        let mut blame = Finding::new(Severity::Warning, Code::NodeGpuUnusable, Scope::Run, "x".repeat(100_000));
        blame.node_rank = Some(0);
        blame.host = Some("gpu-a".into());
        blame.evidence = vec!["e".repeat(10_000); 1000];
        blame.measured = Some(f64::NAN);
        let other = Finding::new(Severity::Critical, Code::NodeMissing, Scope::Run, "node 0 is missing".into());
        let mut sent = vec![other];
        sent.extend(std::iter::repeat_n(blame, 100));
        let kept = accepted(&info(), &sent);
        assert_eq!(kept.len(), MAX_FINDINGS);
        for f in &kept {
            assert_eq!(f.code, Code::NodeGpuUnusable);
            assert_eq!((f.node_rank, f.host.as_deref()), (Some(3), Some("gpu-d")));
            assert_eq!((f.severity, f.check), (Severity::Critical, Scope::Device));
            assert_eq!(f.message.chars().count(), MAX_TEXT);
            assert_eq!(f.evidence.len(), MAX_EVIDENCE);
            assert!(f.evidence.iter().all(|e| e.len() <= MAX_TEXT));
            assert_eq!(f.measured, None);
        }
    }

    #[test]
    fn a_ready_node_sends_nothing_and_a_node_with_only_foreign_codes_is_still_not_ready() {
        assert!(accepted(&info(), &[]).is_empty());
        let other = Finding::new(Severity::Warning, Code::NodeMissing, Scope::Run, "?".into());
        let kept = accepted(&info(), &[other]);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].code, Code::NodeGpuUnusable);
        assert_eq!(kept[0].node_rank, Some(3));
        assert!(kept[0].message.contains("gpu-d"), "{}", kept[0].message);
    }
}
