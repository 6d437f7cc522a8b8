//! The launcher's part of the host reading: which GPUs are the job's on this node, the readings
//! and findings it posts with its outcome, and node 0 folding every node's into the report.

use gpusanity_common::config::CheckConfigs;
use gpusanity_common::device::NvidiaHardware;
use gpusanity_common::report::{DeviceKind, Finding, NodeHost, NodeInfo, Report, RunStatus, Severity};

use super::outcome::{Heard, HostOutcome};
use crate::host::{self, Sources};

/// The most bytes of another node's readings kept in the report.
const MAX_READINGS_BYTES: usize = 64 << 10;

/// This node's host for its part of the job: `nproc` ranks on `device`. On CUDA the job's GPUs
/// are the devices its workers use; on the CPU backend (a rig, or an agent with `--device cpu`)
/// every NVIDIA GPU of the census. A node with neither has nothing of this to judge: `None`.
pub fn read(
    device: DeviceKind,
    nproc: usize,
    configs: &CheckConfigs,
    at: (usize, &str),
    test_faults: bool,
) -> Option<HostOutcome> {
    let src = Sources::of_this_node(test_faults);
    let gpus: Vec<String> = match device {
        DeviceKind::Cuda => gpusanity_cuda::probe_pci_bus_ids().unwrap_or_default().into_iter().take(nproc).collect(),
        DeviceKind::Cpu => {
            let census = NvidiaHardware::detect(&src.root);
            if !census.present() {
                return None;
            }
            census.pci_gpus
        }
    };
    let readings = host::read(&src, gpus, nproc, configs);
    let mut findings = host::judge(&readings, configs);
    for f in &mut findings {
        f.node_rank = Some(at.0);
        f.host = Some(at.1.to_string());
    }
    tracing::info!(read_ms = readings.read_ms, findings = findings.len(), "host read: kernel log and settings");
    Some(HostOutcome { readings, findings })
}

/// A node that is not ready: the driver's finding, where the driver is older than the CUDA
/// libraries need (CUDA's own error then only says it cannot start). Only the driver's version
/// is read.
pub fn driver_too_old(configs: &CheckConfigs, at: (usize, &str), test_faults: bool) -> Option<Finding> {
    let (version, _) = host::sysfs::driver(&Sources::of_this_node(test_faults).root);
    let mut f = gpusanity_common::host::driver_too_old(
        version.as_deref(),
        &configs.gpu_health.node,
        gpusanity_cuda::MIN_DRIVER_MAJOR,
    )?;
    f.node_rank = Some(at.0);
    f.host = Some(at.1.to_string());
    Some(f)
}

/// Node 0: every node's host findings (bounded, placed on the node that sent them) into the
/// report's findings, verdicts and summary, and their readings into `hosts`. Called before the
/// node verdicts are drawn.
pub fn fold(nodes: &[NodeInfo], outcomes: &[Heard]) -> (Vec<Finding>, Vec<NodeHost>) {
    let mut findings = Vec::new();
    let mut hosts = Vec::new();
    for (info, outcome) in nodes.iter().zip(outcomes) {
        let Some(h) = outcome.outcome().and_then(|o| o.host.as_ref()) else { continue };
        findings.extend(host::accepted(info, &h.findings));
        let size = serde_json::to_vec(&h.readings).map_or(usize::MAX, |v| v.len());
        if size <= MAX_READINGS_BYTES {
            hosts.push(NodeHost { node_rank: info.node_rank, readings: h.readings.clone() });
        }
    }
    (findings, hosts)
}

/// The run fails on a critical host finding; the summary names it first.
pub fn apply(report: &mut Report, findings: &[Finding]) {
    let critical: Vec<&Finding> = findings.iter().filter(|f| f.severity == Severity::Critical).collect();
    if critical.is_empty() {
        return;
    }
    let named: Vec<String> = critical
        .iter()
        .map(|f| format!("{} ({})", f.code, f.host.as_deref().unwrap_or("?")))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    report.summary = match report.status {
        RunStatus::Passed => format!("{}: {}", named.join(", "), critical[0].message),
        _ => format!("{}; {}", named.join(", "), report.summary),
    };
    if report.status == RunStatus::Passed {
        report.status = RunStatus::Failed;
    }
}
