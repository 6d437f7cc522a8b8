//! Whether a GPU is ready for the job, beside whether it is healthy: other processes on it
//! (leftovers of a previous job, a co-runner) and the settings that break or slow a job
//! (compute mode, MIG, ECC pending, application clocks, persistence, the driver's version).
//! Pure decisions on [`Readings`] and a [`Readiness`] policy (docs/health.md, "Ready for the
//! job").

use serde::{Deserialize, Serialize};

use super::Readings;
use crate::config::health::GpuHealthConfig;
use crate::findings::{Code, Finding};
use crate::kinds::Severity;
use crate::registry::CheckId;

/// A process NVML lists on the GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuProcess {
    pub pid: u32,
    /// Its name from `/proc/PID/comm`, where readable.
    #[serde(default)]
    pub name: Option<String>,
    /// GPU memory it holds, MiB (`None`: the driver does not say).
    #[serde(default)]
    pub used_mib: Option<u64>,
    /// `compute` or `graphics`.
    pub kind: String,
    /// The highest SM utilisation NVML sampled for it over the window, percent.
    #[serde(default)]
    pub sm_util: Option<u32>,
}

/// The GPU's settings that decide whether a job runs on it as fast as it can.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSettings {
    /// `default`, `exclusive_process`, `prohibited` (or `exclusive_thread`, old drivers).
    #[serde(default)]
    pub compute_mode: Option<String>,
    #[serde(default)]
    pub mig_enabled: Option<bool>,
    #[serde(default)]
    pub mig_pending: Option<bool>,
    /// ECC mode after the next reset (ECC now is in [`Readings::ecc`]).
    #[serde(default)]
    pub ecc_pending: Option<bool>,
    /// Application SM clock now and its default, MHz.
    #[serde(default)]
    pub app_sm_mhz: Option<u32>,
    #[serde(default)]
    pub default_app_sm_mhz: Option<u32>,
    #[serde(default)]
    pub persistence: Option<bool>,
    /// The highest SM clock of performance state P0 and the device's maximum SM clock, MHz
    /// (NVML's min/max clock of a P-state, and its maximum clock): the first below the second
    /// means the SM clocks are locked (`nvidia-smi -lgc`).
    #[serde(default)]
    pub p0_max_sm_mhz: Option<u32>,
    #[serde(default)]
    pub max_sm_mhz: Option<u32>,
    /// The node's MPS control daemon, as seen from the worker (`None`: not read).
    #[serde(default)]
    pub mps: Option<Mps>,
    /// The GPU's NVSwitch fabric (`nvmlDeviceGetGpuFabricInfo`; `None`: the driver or the
    /// GPU has none to report).
    #[serde(default)]
    pub fabric: Option<Fabric>,
}

/// NVML's fabric state of a GPU on an NVSwitch system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fabric {
    /// `not_supported` (no NVSwitch fabric), `not_started`, `in_progress` or `completed`.
    pub state: String,
    /// The registration's result once completed: NVML's return code, 0 for success.
    pub status: u32,
}

impl Fabric {
    /// Ready: no fabric to wait for, or its registration completed with success.
    pub fn ready(&self) -> bool {
        self.state == "not_supported" || (self.state == "completed" && self.status == 0)
    }
}

/// What shows an MPS control daemon on the node: its pipe directory's control socket
/// (`CUDA_MPS_PIPE_DIRECTORY`, else `/tmp/nvidia-mps`) and its processes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mps {
    /// The pipe directory looked at.
    pub pipe_dir: String,
    /// Its `control` socket exists.
    pub control: bool,
    /// `nvidia-cuda-mps-control` and `nvidia-cuda-mps-server` processes: pid and name.
    #[serde(default)]
    pub daemons: Vec<(u32, String)>,
}

impl Mps {
    pub fn active(&self) -> bool {
        self.control || !self.daemons.is_empty()
    }
}

/// What the readiness decisions compare with (from `gpu-health.*`).
#[derive(Debug, Clone, PartialEq)]
pub struct Readiness {
    /// Memory held by other processes above this fails the GPU, MiB.
    pub leftover_memory_mib: u64,
    /// Severity of another process computing on the GPU.
    pub foreign_compute: Severity,
    /// MIG enabled is expected (the job asked for MIG).
    pub allow_mig: bool,
    /// The lowest driver accepted, as dotted numbers (`580.65.06`); none: any.
    pub min_driver: Option<String>,
    /// Locked SM clocks are expected.
    pub allow_locked_clocks: bool,
    /// An MPS control daemon is expected.
    pub allow_mps: bool,
    /// What an NVSwitch fabric that is not ready becomes.
    pub fabric: crate::host::Level,
}

impl Readiness {
    pub fn from_config(c: &GpuHealthConfig) -> Readiness {
        Readiness {
            leftover_memory_mib: c.leftover_memory_mib,
            foreign_compute: if c.foreign_compute_warns { Severity::Warning } else { Severity::Critical },
            allow_mig: c.allow_mig,
            min_driver: c.min_driver.clone(),
            allow_locked_clocks: c.allow_locked_clocks,
            allow_mps: c.allow_mps,
            fabric: c.node.fabric,
        }
    }
}

fn finding(sev: Severity, code: Code, gpu: &Readings, what: String, action: &str) -> Finding {
    let mut f = Finding::new(sev, code, CheckId::GpuHealth, format!("GPU {} ({}): {what}", gpu.index, gpu.pci_bus_id));
    f.action = Some(action.into());
    f
}

fn describe(p: &GpuProcess) -> String {
    let mem = p.used_mib.map_or("memory unknown".to_string(), |m| format!("{m} MiB"));
    let util = p.sm_util.filter(|u| *u > 0).map_or(String::new(), |u| format!(", SM {u}%"));
    format!("pid {} ({}, {}, {mem}{util})", p.pid, p.name.as_deref().unwrap_or("name unreadable"), p.kind)
}

/// The processes on the GPU that are not the check's own (`own`: the pids of the run's workers
/// on this node).
pub fn others<'a>(gpu: &'a Readings, own: &[u32]) -> Vec<&'a GpuProcess> {
    gpu.processes.value().map_or(Vec::new(), |ps| ps.iter().filter(|p| !own.contains(&p.pid)).collect())
}

/// Findings about other processes on the GPU.
pub fn leftovers(gpu: &Readings, own: &[u32], policy: &Readiness) -> Vec<Finding> {
    let others = others(gpu, own);
    if others.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    let held: u64 = others.iter().filter_map(|p| p.used_mib).fold(0, u64::saturating_add);
    let listed: Vec<String> = others.iter().map(|p| describe(p)).collect();
    let computing: Vec<String> =
        others.iter().filter(|p| p.sm_util.is_some_and(|u| u > 0)).map(|p| describe(p)).collect();
    if held > policy.leftover_memory_mib {
        let mut f = finding(
            Severity::Critical,
            Code::GpuHealthLeftoverMemory,
            gpu,
            format!("{held} MiB held by other processes: {}", listed.join("; ")),
            "end the processes (a previous job's that did not exit) or exclude the node",
        );
        f.measured = Some(held as f64);
        f.expected = Some(policy.leftover_memory_mib as f64);
        out.push(f);
    }
    if !computing.is_empty() {
        out.push(finding(
            policy.foreign_compute,
            Code::GpuHealthForeignCompute,
            gpu,
            format!("another process computes on the GPU: {}", computing.join("; ")),
            "end the process or exclude the node: the job would share the GPU",
        ));
    }
    if out.is_empty() {
        out.push(finding(
            Severity::Warning,
            Code::GpuHealthOtherProcess,
            gpu,
            format!("other processes on the GPU: {}", listed.join("; ")),
            "check what they are; they hold memory the job cannot use",
        ));
    }
    out
}

/// Findings about the GPU's settings.
pub fn settings(gpu: &Readings, own: &[u32], policy: &Readiness) -> Vec<Finding> {
    let mut out = Vec::new();
    out.extend(compute_mode(gpu, own));
    out.extend(mig_mode(gpu, policy));
    out.extend(ecc_pending(gpu));
    out.extend(app_clocks_low(gpu));
    if !policy.allow_locked_clocks {
        out.extend(locked_clocks(gpu));
    }
    out.extend(mps_active(gpu, policy));
    out.extend(persistence_off(gpu));
    out.extend(fabric_not_ready(gpu, policy));
    out.extend(driver_old(gpu, policy));
    out
}

/// A compute mode that keeps the job off the GPU: Prohibited, or Exclusive with another
/// process already on it.
fn compute_mode(gpu: &Readings, own: &[u32]) -> Option<Finding> {
    match gpu.settings.compute_mode.as_deref() {
        Some("prohibited") => Some(finding(
            Severity::Critical,
            Code::GpuHealthComputeMode,
            gpu,
            "compute mode is Prohibited: no process can use the GPU".into(),
            "set the default compute mode (nvidia-smi -c DEFAULT)",
        )),
        Some("exclusive_process" | "exclusive_thread") if !others(gpu, own).is_empty() => Some(finding(
            Severity::Critical,
            Code::GpuHealthComputeMode,
            gpu,
            "compute mode is Exclusive_Process and another process already holds the GPU: the job cannot open it"
                .into(),
            "end the other process, or set the default compute mode (nvidia-smi -c DEFAULT)",
        )),
        _ => None,
    }
}

/// MIG enabled when the job did not ask for it, or else a MIG mode change pending a reset.
fn mig_mode(gpu: &Readings, policy: &Readiness) -> Option<Finding> {
    let s = &gpu.settings;
    if s.mig_enabled == Some(true) && !policy.allow_mig {
        Some(finding(
            Severity::Critical,
            Code::GpuHealthMigEnabled,
            gpu,
            "MIG mode is enabled and the job did not ask for MIG: it gets a slice of the GPU, or none".into(),
            "disable MIG (nvidia-smi -mig 0) and reset the GPU, or set gpu-health.allow-mig=true",
        ))
    } else if s.mig_pending.is_some() && s.mig_pending != s.mig_enabled {
        Some(finding(
            Severity::Warning,
            Code::GpuHealthMigPending,
            gpu,
            format!("a MIG mode change is pending (to {}) until the GPU is reset", on_off(s.mig_pending)),
            "reset the GPU to apply the pending MIG mode",
        ))
    } else {
        None
    }
}

/// An ECC mode change pending a reset.
fn ecc_pending(gpu: &Readings) -> Option<Finding> {
    let pending = gpu.settings.ecc_pending;
    let ecc_now = gpu.ecc.value().map(|e| e.enabled);
    if pending.is_none() || ecc_now.is_none() || pending == ecc_now {
        return None;
    }
    Some(finding(
        Severity::Warning,
        Code::GpuHealthEccPending,
        gpu,
        format!("an ECC mode change is pending (to {}) until the GPU is reset", on_off(pending)),
        "reset the GPU to apply the pending ECC mode",
    ))
}

/// Application SM clocks set below their default.
fn app_clocks_low(gpu: &Readings) -> Option<Finding> {
    let (now, default) = (gpu.settings.app_sm_mhz?, gpu.settings.default_app_sm_mhz?);
    if now >= default {
        return None;
    }
    let mut f = finding(
        Severity::Warning,
        Code::GpuHealthAppClocksLow,
        gpu,
        format!("application SM clock {now} MHz is below its default {default} MHz"),
        "reset the application clocks (nvidia-smi -rac)",
    );
    f.measured = Some(f64::from(now));
    f.expected = Some(f64::from(default));
    Some(f)
}

/// An active MPS control daemon when the job does not run under MPS.
fn mps_active(gpu: &Readings, policy: &Readiness) -> Option<Finding> {
    let mps = gpu.settings.mps.as_ref().filter(|m| m.active() && !policy.allow_mps)?;
    let daemons: Vec<String> = mps.daemons.iter().map(|(pid, name)| format!("pid {pid} ({name})")).collect();
    let mut f = finding(
        Severity::Critical,
        Code::GpuHealthMpsActive,
        gpu,
        format!(
            "an MPS control daemon serves the node (pipe directory {}{}{}): the job's CUDA processes become its clients, sharing the GPU, or fail to start under another user's daemon",
            mps.pipe_dir,
            if mps.control { ", control socket present" } else { "" },
            if daemons.is_empty() { String::new() } else { format!(", {}", daemons.join(", ")) }
        ),
        "stop it (echo quit | nvidia-cuda-mps-control) or exclude the node; set gpu-health.allow-mps=true when the job runs under MPS",
    );
    f.evidence.extend(daemons);
    Some(f)
}

/// Persistence mode off.
fn persistence_off(gpu: &Readings) -> Option<Finding> {
    (gpu.settings.persistence == Some(false)).then(|| {
        finding(
            Severity::Warning,
            Code::GpuHealthPersistenceOff,
            gpu,
            "persistence mode is off: every job pays the driver's initialisation".into(),
            "enable persistence (nvidia-persistenced, or nvidia-smi -pm 1)",
        )
    })
}

/// A driver older than `gpu-health.min-driver`.
fn driver_old(gpu: &Readings, policy: &Readiness) -> Option<Finding> {
    let (min, have) = (policy.min_driver.as_deref()?, gpu.driver_version.as_deref()?);
    version_below(have, min).then(|| {
        finding(
            Severity::Critical,
            Code::GpuHealthDriverOld,
            gpu,
            format!("driver {have} is below the minimum {min} (gpu-health.min-driver)"),
            "upgrade the driver",
        )
    })
}

/// An NVSwitch fabric that is not ready: CUDA cannot start on the GPU.
fn fabric_not_ready(gpu: &Readings, policy: &Readiness) -> Option<Finding> {
    let fabric = gpu.settings.fabric.as_ref().filter(|f| !f.ready())?;
    Some(finding(
        policy.fabric.severity()?,
        Code::GpuHealthFabricNotReady,
        gpu,
        format!(
            "the NVSwitch fabric is not ready (state {}, status {}): CUDA fails with \"system not yet initialized\"",
            fabric.state, fabric.status
        ),
        "start nvidia-fabricmanager or wait for it to finish; read its log",
    ))
}

/// Locked SM clocks: P0's highest SM clock below the device's maximum, or, with the application
/// clocks at their default, NVML's applications-clocks-setting event active at the end of the
/// load (a clock setting, not the application clocks, held the GPU down).
fn locked_clocks(gpu: &Readings) -> Option<Finding> {
    let s = &gpu.settings;
    let (what, measured, expected) = match (s.p0_max_sm_mhz, s.max_sm_mhz) {
        (Some(p0), Some(max)) if p0 < max => {
            (format!("SM clocks are locked at most {p0} MHz, below the maximum {max} MHz"), Some(p0), Some(max))
        }
        _ => {
            let events = gpu.clock_events.value().map_or(0, |c| c.mask);
            let app_default = matches!((s.app_sm_mhz, s.default_app_sm_mhz), (Some(a), Some(d)) if a >= d);
            if events & super::ClockEvents::APPLICATIONS_CLOCKS == 0 || !app_default {
                return None;
            }
            let under = gpu.sm_clock.value().map(|c| (c.under_load_mhz, c.max_mhz));
            // At its maximum the GPU is held by nothing that matters.
            if under.is_some_and(|(now, max)| now >= max) {
                return None;
            }
            let what = match under {
                Some((now, max)) => format!(
                    "SM clocks held by a clock setting under load ({now} of {max} MHz) with the application clocks at their default: locked clocks"
                ),
                None => "SM clocks held by a clock setting under load with the application clocks at their default: locked clocks".into(),
            };
            (what, under.map(|u| u.0), under.map(|u| u.1))
        }
    };
    let mut f = finding(
        Severity::Warning,
        Code::GpuHealthClocksLocked,
        gpu,
        what,
        "reset the locked clocks (nvidia-smi -rgc), or set gpu-health.allow-locked-clocks=true when they are locked on purpose",
    );
    f.measured = measured.map(f64::from);
    f.expected = expected.map(f64::from);
    Some(f)
}

fn on_off(v: Option<bool>) -> &'static str {
    if v == Some(true) {
        "on"
    } else {
        "off"
    }
}

/// Whether dotted version `have` is below `min`, number by number (a missing part is 0; a part
/// that is not a number compares as 0).
pub fn version_below(have: &str, min: &str) -> bool {
    let parts = |v: &str| -> Vec<u64> { v.trim().split('.').take(8).map(|p| p.parse().unwrap_or(0)).collect() };
    let (h, m) = (parts(have), parts(min));
    let n = h.len().max(m.len());
    let at = |v: &[u64], i: usize| v.get(i).copied().unwrap_or(0);
    (0..n).map(|i| (at(&h, i), at(&m, i))).find(|(a, b)| a != b).is_some_and(|(a, b)| a < b)
}
