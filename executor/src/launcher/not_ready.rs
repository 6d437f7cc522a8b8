//! A node other than node 0 that cannot run the job's GPUs is named with its evidence: it
//! brings its readiness findings (readiness.rs) to the rendezvous in its registration instead
//! of devices, and once every node has arrived node 0 writes the report and the verdict naming
//! each such node (its GPUs' PCI bus ids, the error) while every node exits 1 without a check.
//! What a node sends is bounded and placed first (sent.rs).

use std::time::Duration;

use anyhow::Result;
use gpusanity_common::config::CheckConfigs;
use gpusanity_common::events::CheckState;
use gpusanity_common::report::{DeviceKind, Finding, NodeInfo, RunStatus};
use gpusanity_common::ExitCode;

use super::events::EventLog;
use super::gather;
use super::node::{Cluster, RunEnd};
use super::sent::summary;
use super::{CheckOptions, Finished, Handover};

/// How long a node that is not node 0 waits for node 0's verdict before it exits.
const VERDICT_WAIT: Duration = Duration::from_secs(30);

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
    super::report_files::write_report(&opts.report_dir, &report)?;
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
