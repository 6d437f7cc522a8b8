//! `gpu-health`: its configuration and `--check-param` fields.

use serde::{Deserialize, Serialize};

use super::param::{Param, ParamError};
use crate::health::xid;
use crate::host::NodePolicy;

/// The most GPUs one node is expected to have.
pub const MAX_GPUS_PER_NODE: u64 = 1024;
pub use crate::health::xid::MAX_XID;
/// The most XIDs `fatal-xids` takes, and the longest value it reads.
pub const MAX_FATAL_XIDS: usize = 256;
const MAX_LIST_CHARS: usize = 2048;
/// The longest load and the longest sampling period, milliseconds.
pub const MAX_LOAD_MS: u64 = 60_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuHealthConfig {
    /// GPUs each node must have; `None`: as many as the job runs workers on the node.
    pub expected_gpus: Option<usize>,
    /// XIDs that fail the GPU (default: [`xid::FATAL_XIDS`]).
    pub fatal_xids: Vec<u32>,
    /// How long the check's own load (a GEMM through the backend) runs while the SM clock,
    /// power, temperature and PCIe link are sampled, milliseconds.
    pub load_ms: u64,
    /// Side of that GEMM.
    pub load_size: usize,
    /// Sampling period during the load, milliseconds.
    pub sample_ms: u64,
    /// An SM clock under load below this fraction of its maximum is a warning.
    pub min_clock_fraction: f64,
    /// GPU memory held by other processes above this fails the GPU, MiB.
    #[serde(default = "default_leftover_mib")]
    pub leftover_memory_mib: u64,
    /// Another process computing on the GPU is a warning, not a failure.
    #[serde(default)]
    pub foreign_compute_warns: bool,
    /// MIG enabled is expected (the job asked for MIG).
    #[serde(default)]
    pub allow_mig: bool,
    /// The lowest driver version accepted (dotted numbers); none: any.
    #[serde(default)]
    pub min_driver: Option<String>,
    /// Locked SM clocks are expected (the operator locks them on purpose).
    #[serde(default)]
    pub allow_locked_clocks: bool,
    /// An MPS control daemon on the node is expected (the job runs under MPS).
    #[serde(default)]
    pub allow_mps: bool,
    /// The policy for the host's readings (kernel log, shm, memlock, GPUDirect RDMA, ACS,
    /// fabric, driver): docs/health.md, "Ready for the next job".
    #[serde(default)]
    pub node: NodePolicy,
}

/// Memory other processes may hold on a job's GPU before it fails, MiB (a CUDA context of
/// another process is about 500 MiB).
pub const DEFAULT_LEFTOVER_MIB: u64 = 1024;
/// The most `leftover-memory-mib` takes (1 PiB).
pub const MAX_LEFTOVER_MIB: u64 = 1 << 30;
const MAX_DRIVER_CHARS: usize = 32;

fn default_leftover_mib() -> u64 {
    DEFAULT_LEFTOVER_MIB
}

impl Default for GpuHealthConfig {
    fn default() -> Self {
        GpuHealthConfig {
            expected_gpus: None,
            fatal_xids: xid::default_fatal(),
            load_ms: 300,
            load_size: 4096,
            sample_ms: 10,
            min_clock_fraction: 0.5,
            leftover_memory_mib: DEFAULT_LEFTOVER_MIB,
            foreign_compute_warns: false,
            allow_mig: false,
            min_driver: None,
            allow_locked_clocks: false,
            allow_mps: false,
            node: NodePolicy::default(),
        }
    }
}

impl GpuHealthConfig {
    pub const KEYS: &'static [&'static str] = &[
        "expected-gpus",
        "fatal-xids",
        "load-ms",
        "load-size",
        "sample-ms",
        "min-clock-fraction",
        "leftover-memory-mib",
        "foreign-compute",
        "allow-mig",
        "min-driver",
        "allow-locked-clocks",
        "allow-mps",
        "kernel-xids",
        "shm",
        "shm-mib-per-rank",
        "memlock",
        "gpudirect-rdma",
        "pcie-acs",
        "fabric",
        "bundled-driver",
    ];

    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "expected-gpus" => self.expected_gpus = Some(p.bounded(MAX_GPUS_PER_NODE)? as usize),
            "fatal-xids" => self.fatal_xids = parse_xids(p)?,
            "load-ms" => self.load_ms = p.bounded(MAX_LOAD_MS)?,
            "load-size" => self.load_size = p.bounded(16_384)? as usize,
            "sample-ms" => self.sample_ms = p.bounded(1000)?,
            "min-clock-fraction" => self.min_clock_fraction = p.fraction("a fraction between 0 and 1")?,
            "leftover-memory-mib" => {
                self.leftover_memory_mib = match p.value {
                    "0" => 0,
                    _ => p.bounded(MAX_LEFTOVER_MIB)?,
                }
            }
            "foreign-compute" => {
                self.foreign_compute_warns = match p.value {
                    "critical" => false,
                    "warning" => true,
                    _ => return Err(p.bad("`critical` or `warning`")),
                }
            }
            "allow-mig" => self.allow_mig = flag(p)?,
            "allow-locked-clocks" => self.allow_locked_clocks = flag(p)?,
            "allow-mps" => self.allow_mps = flag(p)?,
            "min-driver" => self.min_driver = parse_driver(p)?,
            _ => return self.node.apply(p),
        }
        Ok(true)
    }
}

/// `true` or `false`.
fn flag(p: &Param<'_>) -> Result<bool, ParamError> {
    match p.value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(p.bad("`true` or `false`")),
    }
}

/// `none`, or a driver version of dotted numbers (`580.65.06`, at most 32 characters).
fn parse_driver(p: &Param<'_>) -> Result<Option<String>, ParamError> {
    if p.value == "none" {
        return Ok(None);
    }
    let ok = p.value.len() <= MAX_DRIVER_CHARS
        && p.value.split('.').all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()));
    if !ok {
        return Err(p.bad("`none` or a driver version of dotted numbers, e.g. 580.65.06"));
    }
    Ok(Some(p.value.to_string()))
}

/// `none`, or a comma list of XIDs (1 to [`MAX_XID`], at most [`MAX_FATAL_XIDS`]): it replaces
/// the default table.
fn parse_xids(p: &Param<'_>) -> Result<Vec<u32>, ParamError> {
    let why = format!("`none` or a comma list of at most {MAX_FATAL_XIDS} XIDs from 1 to {MAX_XID}");
    if p.value.len() > MAX_LIST_CHARS {
        return Err(p.bad(&why));
    }
    if p.value == "none" {
        return Ok(Vec::new());
    }
    let mut xids = Vec::new();
    for part in p.value.split(',') {
        let x = part.trim().parse::<u32>().ok().filter(|x| (1..=MAX_XID).contains(x)).ok_or_else(|| p.bad(&why))?;
        xids.push(x);
        if xids.len() > MAX_FATAL_XIDS {
            return Err(p.bad(&why));
        }
    }
    xids.sort_unstable();
    xids.dedup();
    Ok(xids)
}

#[cfg(test)]
mod tests {
    use crate::checks::CheckConfigs;
    use crate::kinds::DeviceKind;

    fn apply(param: &str) -> Result<super::GpuHealthConfig, String> {
        let mut c = CheckConfigs::defaults(DeviceKind::Cuda);
        c.apply_params(&[param.to_string()]).map_err(|e| e.to_string())?;
        Ok(c.gpu_health)
    }

    #[test]
    fn the_host_policy_is_read_through_gpu_health_keys() {
        let node = ["kernel-xids", "shm", "shm-mib-per-rank", "memlock", "gpudirect-rdma", "pcie-acs", "fabric"];
        for k in node.into_iter().chain(["bundled-driver"]) {
            assert!(super::GpuHealthConfig::KEYS.contains(&k), "{k}");
            let value = if k == "shm-mib-per-rank" { "8" } else { "warning" };
            let p = crate::config::param::Param { key: k, field: k, value };
            assert_eq!(crate::host::NodePolicy::default().apply(&p), Ok(true), "{k}");
        }
        let d = apply("gpu-health.pcie-acs=critical").unwrap();
        assert_eq!(d.node.pcie_acs, crate::host::Level::Critical);
        assert_eq!(apply("gpu-health.shm-mib-per-rank=8").unwrap().node.shm_mib_per_rank, 8);
        assert_eq!(apply("gpu-health.kernel-xids=off").unwrap().node.kernel_xids, crate::host::Level::Off);
        assert!(apply("gpu-health.memlock=loud").is_err());
        assert!(apply("gpu-health.shm-mib-per-rank=0").is_err());
        assert!(apply("gpu-health.shm-mib-per-rank=99999999999").is_err());
    }

    #[test]
    fn the_readiness_policy_is_the_operators_and_bounded() {
        let d = apply("gpu-health.load-ms=300").unwrap();
        assert_eq!(
            (d.leftover_memory_mib, d.foreign_compute_warns, d.allow_mig, d.min_driver),
            (1024, false, false, None)
        );
        assert_eq!(apply("gpu-health.leftover-memory-mib=0").unwrap().leftover_memory_mib, 0);
        assert_eq!(apply("gpu-health.leftover-memory-mib=4096").unwrap().leftover_memory_mib, 4096);
        assert!(apply("gpu-health.foreign-compute=warning").unwrap().foreign_compute_warns);
        assert!(apply("gpu-health.allow-mig=true").unwrap().allow_mig);
        assert!(apply("gpu-health.allow-locked-clocks=true").unwrap().allow_locked_clocks);
        assert!(apply("gpu-health.allow-mps=true").unwrap().allow_mps);
        assert!(!apply("gpu-health.allow-mps=false").unwrap().allow_mps);
        assert_eq!(apply("gpu-health.min-driver=580.65.06").unwrap().min_driver.as_deref(), Some("580.65.06"));
        assert_eq!(apply("gpu-health.min-driver=none").unwrap().min_driver, None);
        let long = format!("gpu-health.min-driver={}", "5".repeat(40));
        for bad in [
            "gpu-health.leftover-memory-mib=-1",
            "gpu-health.leftover-memory-mib=99999999999999",
            "gpu-health.foreign-compute=ignore",
            "gpu-health.allow-mig=yes",
            "gpu-health.allow-mps=1",
            "gpu-health.allow-locked-clocks=",
            "gpu-health.min-driver=580..1",
            "gpu-health.min-driver=580.x",
            long.as_str(),
        ] {
            assert!(apply(bad).is_err(), "{bad} was taken");
        }
        // A configuration recorded before these keys existed still reads, with their defaults.
        let mut old = serde_json::to_value(super::GpuHealthConfig::default()).unwrap();
        for k in [
            "leftover_memory_mib",
            "foreign_compute_warns",
            "allow_mig",
            "min_driver",
            "allow_locked_clocks",
            "allow_mps",
        ] {
            old.as_object_mut().unwrap().remove(k);
        }
        let back: super::GpuHealthConfig = serde_json::from_value(old).unwrap();
        assert_eq!(back, super::GpuHealthConfig::default());
    }
}
