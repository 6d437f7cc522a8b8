//! The operator's policy for the host's readings: one level per reading, and the size of
//! `/dev/shm` a rank needs. `--check-param gpu-health.KEY=VALUE` sets them (docs/health.md).

use serde::{Deserialize, Serialize};

use crate::config::param::{Param, ParamError};
use crate::kinds::Severity;

/// What a reading that breaks the rule becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    /// A critical finding: the node fails.
    Critical,
    /// A warning: the node is suspect, the job is not stopped.
    Warning,
    /// Not judged (for the kernel log: not read).
    Off,
}

impl Level {
    /// The finding's severity, `None` when off.
    pub fn severity(self) -> Option<Severity> {
        match self {
            Level::Critical => Some(Severity::Critical),
            Level::Warning => Some(Severity::Warning),
            Level::Off => None,
        }
    }

    /// At most `self`: a warning stays a warning under a critical policy.
    pub fn cap(self, sev: Severity) -> Option<Severity> {
        match (self, sev) {
            (Level::Off, _) => None,
            (Level::Warning, _) => Some(Severity::Warning),
            (Level::Critical, s) => Some(s),
        }
    }

    fn parse(p: &Param<'_>) -> Result<Level, ParamError> {
        match p.value {
            "critical" => Ok(Level::Critical),
            "warning" => Ok(Level::Warning),
            "off" => Ok(Level::Off),
            _ => Err(p.bad("`critical`, `warning` or `off`")),
        }
    }
}

/// `/dev/shm` NCCL needs per rank of a node, MiB. NCCL's shared-memory transport creates one
/// segment per channel and connection (9,637,888 bytes, about 9.2 MiB, in NCCL's own errors when
/// `/dev/shm` is full), at least two channels per rank: 18.4 MiB a rank, with room for more
/// channels and the proxy's state. Docker's default 64 MiB then holds two ranks, not four, as
/// NCCL's users report.
pub const DEFAULT_SHM_MIB_PER_RANK: u64 = 32;
/// The most `shm-mib-per-rank` takes (1 TiB).
pub const MAX_SHM_MIB_PER_RANK: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePolicy {
    /// XIDs in the kernel log: critical judges the fatal table critical and others warnings.
    pub kernel_xids: Level,
    pub shm: Level,
    pub shm_mib_per_rank: u64,
    pub memlock: Level,
    pub gpudirect_rdma: Level,
    pub pcie_acs: Level,
    pub fabric: Level,
    pub bundled_driver: Level,
}

impl Default for NodePolicy {
    fn default() -> Self {
        NodePolicy {
            kernel_xids: Level::Critical,
            shm: Level::Critical,
            shm_mib_per_rank: DEFAULT_SHM_MIB_PER_RANK,
            memlock: Level::Critical,
            gpudirect_rdma: Level::Warning,
            pcie_acs: Level::Warning,
            fabric: Level::Critical,
            bundled_driver: Level::Critical,
        }
    }
}

impl NodePolicy {
    /// Applies one `gpu-health.KEY=VALUE`; `false` when the key is not one of these (the keys
    /// are listed with the check's others, `GpuHealthConfig::KEYS`).
    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "kernel-xids" => self.kernel_xids = Level::parse(p)?,
            "shm" => self.shm = Level::parse(p)?,
            "shm-mib-per-rank" => self.shm_mib_per_rank = p.bounded(MAX_SHM_MIB_PER_RANK)?,
            "memlock" => self.memlock = Level::parse(p)?,
            "gpudirect-rdma" => self.gpudirect_rdma = Level::parse(p)?,
            "pcie-acs" => self.pcie_acs = Level::parse(p)?,
            "fabric" => self.fabric = Level::parse(p)?,
            "bundled-driver" => self.bundled_driver = Level::parse(p)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}
