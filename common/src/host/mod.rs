//! The host a job's GPUs sit in, read by each node's launcher before any check
//! (docs/health.md, "Ready for the next job"): the XIDs the kernel log holds since the last reset
//! or boot, and the node and pod settings that break or slow NCCL and RDMA (`/dev/shm`,
//! `RLIMIT_MEMLOCK`, the GPUDirect RDMA path, PCIe ACS on the bridges above the GPUs, the
//! driver against the CUDA libraries). The readings ([`HostReadings`]) are filled by the
//! executor; the decisions ([`judge`]) are pure functions of them and of the operator's policy
//! ([`NodePolicy`]).

pub mod judge;
pub mod kernel_log;
pub mod policy;

use serde::{Deserialize, Serialize};

pub use judge::{driver_too_old, judge};
pub use policy::{Level, NodePolicy};

/// Where the kernel log was read, and what it held.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum KernelLog {
    /// Read: from `source` (`/dev/kmsg`, `journalctl -k -b`, or a rig's file).
    Read {
        source: String,
        bytes: u64,
        /// The read stopped at its byte or time bound: the oldest lines were read, not all.
        #[serde(default)]
        truncated: bool,
        scan: kernel_log::Scan,
    },
    /// Not read, and why (no CAP_SYSLOG, `kernel.dmesg_restrict`, no journal in the pod).
    Unreadable { why: String },
    /// Not read: the policy turned it off (`gpu-health.kernel-xids=off`).
    Off,
}

/// `RLIMIT_MEMLOCK` of the launcher (its workers inherit it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Memlock {
    Unlimited,
    Bytes(u64),
}

/// The PCIe ACS control register of one bridge above a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcsBridge {
    /// The GPU below it.
    pub gpu: String,
    /// The bridge's PCI address.
    pub bridge: String,
    /// ACS Control (extended capability 0x000d, offset 6); `None`: the bridge has no ACS
    /// capability. Unread bridges are in [`HostReadings::acs_unreadable`].
    pub control: Option<u16>,
}

/// ACS Control bits that send peer-to-peer traffic up to the root complex: P2P Request
/// Redirect (bit 2) and P2P Completion Redirect (bit 3).
pub const ACS_P2P_REDIRECT: u16 = 0b1100;

/// Everything the launcher read of its host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostReadings {
    /// The job's GPUs on this node judged (PCI addresses, `0000:3b:00.0`).
    pub gpus: Vec<String>,
    /// The job's ranks on this node.
    pub local_ranks: usize,
    pub kernel_log: KernelLog,
    /// Size of `/dev/shm`, bytes (`None`: not mounted or not readable).
    pub shm_bytes: Option<u64>,
    pub memlock: Option<Memlock>,
    /// RDMA devices (`/sys/class/infiniband`).
    pub rdma_devices: Vec<String>,
    /// `nvidia_peermem` is loaded (`/proc/modules`).
    pub peermem_loaded: bool,
    /// The NVIDIA kernel module is the open one (`/proc/driver/nvidia/version`), which
    /// GPUDirect RDMA through DMA-BUF needs.
    pub open_kernel_module: bool,
    /// `/proc/sys/kernel/osrelease`.
    pub kernel_release: Option<String>,
    /// The NVIDIA driver's version (`/proc/driver/nvidia/version`, else
    /// `/sys/module/nvidia/version`).
    pub driver_version: Option<String>,
    /// The bridges above the job's GPUs, each with its ACS control.
    pub acs: Vec<AcsBridge>,
    /// Bridges whose extended configuration space could not be read (not root).
    pub acs_unreadable: Vec<String>,
    /// How long the reads took, milliseconds.
    pub read_ms: f64,
}

impl HostReadings {
    /// Whether the kernel supports DMA-BUF for GPUDirect RDMA (5.12 or later).
    pub fn kernel_has_dmabuf(&self) -> bool {
        let Some(rel) = self.kernel_release.as_deref() else { return false };
        let mut parts = rel.split(|c: char| !c.is_ascii_digit()).filter(|p| !p.is_empty());
        let major = parts.next().and_then(|p| p.parse::<u32>().ok()).unwrap_or(0);
        let minor = parts.next().and_then(|p| p.parse::<u32>().ok()).unwrap_or(0);
        (major, minor) >= (5, 12)
    }
}
