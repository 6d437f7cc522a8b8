//! Whether this node can run the job's GPUs, decided before any check (docs/health.md,
//! "Before any check"): the backend `--device` resolves to, and the findings that fail a node
//! whose GPUs CUDA cannot use or that has fewer usable GPUs than the job asked for.
//!
//! `--device auto` falls back to the CPU backend only on a node with no NVIDIA hardware at all
//! (no driver, no `/dev/nvidia*`, no NVIDIA GPU on the PCI bus), and says so. On a node that has
//! NVIDIA hardware, or under `--device cuda`, a CUDA that cannot be used is the node's fault:
//! a report and exit 1, never "bad input".

use std::collections::HashMap;

use gpusanity_common::config::health::MAX_GPUS_PER_NODE;
use gpusanity_common::config::CheckConfigs;
use gpusanity_common::device::{DeviceChoice, NvidiaHardware};
use gpusanity_common::report::{Code, DeviceKind, Finding, NodeInfo, Scope, Severity};
use gpusanity_common::ExitCode;

/// The longest `SLURM_JOB_GPUS` read.
const MAX_SLURM_LIST: usize = 8192;

/// How many GPUs the job asks for on this node, and who asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    pub count: usize,
    pub source: String,
}

/// The largest of what the job asks for on this node: `--nproc-per-node`, Slurm's
/// `SLURM_GPUS_ON_NODE` and `SLURM_JOB_GPUS`, and `gpu-health.expected-gpus`. Values that do not
/// parse or exceed [`MAX_GPUS_PER_NODE`] are ignored (with a warning): the job's environment is
/// not to be trusted with the node's verdict.
pub fn asked_gpus(
    nproc_per_node: Option<usize>,
    expected: Option<usize>,
    env: &HashMap<String, String>,
) -> Option<Asked> {
    let mut asked: Vec<(usize, String)> = Vec::new();
    if let Some(n) = nproc_per_node {
        asked.push((n, "--nproc-per-node".into()));
    }
    if let Some(n) = expected {
        asked.push((n, "gpu-health.expected-gpus".into()));
    }
    let max = usize::try_from(MAX_GPUS_PER_NODE).unwrap_or(usize::MAX);
    if let Some(v) = env.get("SLURM_GPUS_ON_NODE") {
        match v.trim().parse::<usize>() {
            Ok(n) if n <= max => asked.push((n, format!("SLURM_GPUS_ON_NODE={n}"))),
            _ => tracing::warn!("SLURM_GPUS_ON_NODE is not a GPU count up to {max}: ignored"),
        }
    }
    if let Some(v) = env.get("SLURM_JOB_GPUS").filter(|v| !v.trim().is_empty()) {
        let ids: Option<Vec<usize>> = (v.len() <= MAX_SLURM_LIST)
            .then(|| v.split(',').map(|i| i.trim().parse::<usize>().ok()).collect())
            .flatten();
        match ids {
            Some(ids) if ids.len() <= max => asked.push((ids.len(), format!("SLURM_JOB_GPUS={v}"))),
            _ => tracing::warn!("SLURM_JOB_GPUS is not a list of at most {max} GPU indices: ignored"),
        }
    }
    asked.into_iter().max_by_key(|(n, _)| *n).map(|(count, source)| Asked { count, source })
}

/// What `--device` resolves to on this node.
#[derive(Debug)]
pub enum Resolved {
    /// CUDA, with the names of the devices it can use.
    Cuda(Vec<String>),
    /// The CPU backend, and why (asked for, or no NVIDIA hardware here).
    Cpu(String),
    /// The node cannot run the job: the findings say why.
    NotReady(Vec<Finding>),
}

/// What the node showed: CUDA's probe and library check, and the hardware census (read only
/// when CUDA cannot be used).
pub struct Probe {
    pub cuda: Result<Vec<String>, String>,
    pub libraries: Result<(), String>,
    pub hardware: fn() -> NvidiaHardware,
}

impl Probe {
    /// This node's CUDA and hardware.
    /// The library check (opening cuBLAS, cuBLASLt and NCCL, hundreds of MB read from disk on
    /// a cold node) runs beside the driver's initialisation, not after it; its answer counts
    /// only where CUDA has devices.
    pub fn this_node() -> Probe {
        let started = std::time::Instant::now();
        let (cuda, libraries) = std::thread::scope(|s| {
            let libraries = s.spawn(crate::backend::cuda::check_libraries);
            let cuda = crate::backend::cuda::probe();
            let libraries = libraries.join().unwrap_or_else(|_| Err("the CUDA library check panicked".into()));
            (cuda, libraries)
        });
        let libraries = match &cuda {
            Ok(names) if !names.is_empty() => libraries,
            _ => Ok(()),
        };
        tracing::info!(probe_ms = started.elapsed().as_millis() as u64, "CUDA probed and libraries checked");
        Probe { cuda, libraries, hardware: NvidiaHardware::of_this_node }
    }
}

/// Where the findings are placed.
pub struct Place<'a> {
    pub node_rank: usize,
    pub host: &'a str,
    pub env: &'a HashMap<String, String>,
}

/// Decides the backend from `--device`, what the node showed and what the job asked for.
pub fn resolve(choice: DeviceChoice, probe: impl FnOnce() -> Probe, asked: Option<&Asked>, at: &Place<'_>) -> Resolved {
    if choice == DeviceChoice::Cpu {
        return Resolved::Cpu("--device cpu".into());
    }
    let probe = probe();
    let why = match (probe.cuda, probe.libraries) {
        (Ok(names), Ok(())) if !names.is_empty() => {
            return match asked.filter(|a| a.count > names.len()) {
                Some(a) => Resolved::NotReady(vec![gpus_missing(&names, a, &(probe.hardware)(), at)]),
                None => Resolved::Cuda(names),
            };
        }
        (Ok(names), Err(lib)) if !names.is_empty() => {
            format!("{} GPU(s) found but the CUDA libraries are incomplete: {lib}", names.len())
        }
        (Ok(_), _) => "the CUDA driver reports no devices".to_string(),
        (Err(e), _) => e,
    };
    let hw = (probe.hardware)();
    match (choice, hw.present()) {
        (_, true) => Resolved::NotReady(vec![unusable(&why, &hw, at)]),
        (DeviceChoice::Cuda, false) => Resolved::NotReady(vec![no_gpu(&why, &hw, at)]),
        _ => Resolved::Cpu(format!("no NVIDIA hardware on this node ({}): CPU backend", hw.describe())),
    }
}

fn placed(code: Code, message: String, at: &Place<'_>) -> Finding {
    let mut f = Finding::new(Severity::Critical, code, Scope::Device, message);
    f.node_rank = Some(at.node_rank);
    f.host = Some(at.host.to_string());
    f
}

/// The device-selection variables the node's CUDA saw, as evidence.
fn visible_devices(at: &Place<'_>) -> Vec<String> {
    ["CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"]
        .iter()
        .filter_map(|k| at.env.get(*k).map(|v| format!("{k}={}", v.chars().take(256).collect::<String>())))
        .collect()
}

fn unusable(why: &str, hw: &NvidiaHardware, at: &Place<'_>) -> Finding {
    let gpus = if hw.pci_gpus.is_empty() { "(no PCI GPU listed)".to_string() } else { hw.pci_gpus.join(", ") };
    let mut f = placed(
        Code::NodeGpuUnusable,
        format!("node {}: NVIDIA GPU {gpus} present but CUDA cannot use it: {why}", at.host),
        at,
    );
    f.evidence.push(hw.describe());
    f.evidence.extend(visible_devices(at));
    f.action = Some(
        "exclude the node; check the driver (nvidia-smi), CUDA_VISIBLE_DEVICES and the device plugin; a GPU that fell off the bus needs a reboot"
            .into(),
    );
    f
}

fn no_gpu(why: &str, hw: &NvidiaHardware, at: &Place<'_>) -> Finding {
    let mut f = placed(
        Code::NodeNoGpu,
        format!("node {}: a GPU check was asked for (--device cuda) but the node has no NVIDIA GPU: {why}", at.host),
        at,
    );
    f.evidence.push(hw.describe());
    f.evidence.extend(visible_devices(at));
    f.action = Some("schedule GPU jobs on GPU nodes; if the node has GPUs, check that they are on the PCI bus".into());
    f
}

fn gpus_missing(names: &[String], asked: &Asked, hw: &NvidiaHardware, at: &Place<'_>) -> Finding {
    let missing: Vec<String> = (names.len()..asked.count).map(|i| i.to_string()).collect();
    let mut f = placed(
        Code::NodeGpusMissing,
        format!(
            "node {}: the job asks for {} GPU(s) ({}) but CUDA can use {}: local GPU(s) {} missing",
            at.host,
            asked.count,
            asked.source,
            names.len(),
            missing.join(", ")
        ),
        at,
    );
    f.measured = Some(names.len() as f64);
    f.expected = Some(asked.count as f64);
    f.evidence.push(format!("CUDA devices: {}", names.join(", ")));
    f.evidence.push(hw.describe());
    f.evidence.extend(visible_devices(at));
    f.action = Some(
        "exclude the node, or ask for the GPUs it has; a GPU that fell off the bus or was not enumerated needs a reboot"
            .into(),
    );
    f
}

/// A node alone cannot run the job: it writes a report of the findings and fails the run
/// (exit 1). No check runs. (On a run of several nodes every node takes its findings to the
/// rendezvous, and node 0 names them all: not_ready.rs.)
pub(super) fn fail(
    opts: &super::CheckOptions,
    node_rank: usize,
    host: &str,
    configs: &CheckConfigs,
    findings: Vec<Finding>,
) -> anyhow::Result<super::Finished> {
    if node_rank != 0 {
        eprintln!("gpusanity: error: {}", super::sent::summary(&findings));
        return Ok(super::Handover::Exit(ExitCode::CheckFailed).into());
    }
    let run_id = format!("{}-{}", chrono::Utc::now().format("%Y%m%dT%H%M%SZ"), std::process::id());
    let node = NodeInfo { node_rank, hostname: host.to_string(), addr: String::new(), nproc: 0 };
    let report = super::not_ready::write_report(opts, run_id, DeviceKind::Cuda, configs, &[node], findings)?;
    Ok(super::Finished { handover: super::Handover::Exit(ExitCode::CheckFailed), report: Some(report) })
}

#[cfg(test)]
#[path = "readiness_tests.rs"]
mod tests;
