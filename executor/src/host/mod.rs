//! What each node's launcher reads of its host before any check (docs/health.md, "Ready for
//! the next job"): the kernel log's XIDs since the last reset or boot ([`kmsg`]) and the settings
//! that break NCCL and RDMA ([`sysfs`]). The decisions are `gpusanity_common::host::judge`'s; node
//! 0 keeps another node's findings bounded and placed on that node ([`accepted`]).
//!
//! Test rigs: with `--test-faults`, `GPUSANITY_TEST_KMSG=FILE` stands for the kernel log and
//! `GPUSANITY_TEST_HW_ROOT=DIR` for `/` (its `proc/`, `sys/`, and `rig/shm-bytes` for the size of
//! `/dev/shm`); without `--test-faults` both are ignored, with a warning.

pub mod kmsg;
pub mod sysfs;

use std::path::PathBuf;
use std::time::Instant;

use gpusanity_common::config::CheckConfigs;
use gpusanity_common::device::HW_ROOT_ENV;
use gpusanity_common::host::{HostReadings, KernelLog, Level};
use gpusanity_common::report::{Code, Finding, NodeInfo};

/// The rigs' kernel log: a file of log lines read in place of the kernel's.
pub const KMSG_ENV: &str = "GPUSANITY_TEST_KMSG";
/// The most host findings node 0 keeps of one node.
const MAX_FINDINGS: usize = 24;

/// The codes a node's host reading may raise on itself.
pub const CODES: [Code; 9] = [
    Code::NodeKernelXidFatal,
    Code::NodeKernelXid,
    Code::NodeKernelLogUnreadable,
    Code::NodeShmSmall,
    Code::NodeMemlockLimited,
    Code::NodeNoGpudirectRdma,
    Code::NodePcieAcsEnabled,
    Code::NodePcieAcsUnreadable,
    Code::NodeDriverTooOld,
];

/// Where the host is read.
#[derive(Debug, Clone)]
pub struct Sources {
    /// `/`, or a rig's tree.
    pub root: PathBuf,
    /// The root is a rig's tree.
    pub rig: bool,
    pub kmsg: kmsg::Source,
}

impl Sources {
    /// This node's: `/` and its kernel, or, with `test_faults`, the rig's tree and log file
    /// where the launcher's environment names them.
    pub fn of_this_node(test_faults: bool) -> Sources {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        let (root, kmsg) = (var(HW_ROOT_ENV), var(KMSG_ENV));
        if !test_faults {
            if kmsg.is_some() {
                tracing::warn!("{KMSG_ENV} is a test rig's and needs --test-faults: the kernel's log is read");
            }
            return Sources { root: "/".into(), rig: false, kmsg: kmsg::Source::Kernel };
        }
        Sources {
            rig: root.is_some(),
            root: root.unwrap_or_else(|| "/".into()),
            kmsg: kmsg.map_or(kmsg::Source::Kernel, kmsg::Source::File),
        }
    }
}

/// Reads the host for the job's `gpus` (PCI addresses) and its `local_ranks` on this node.
pub fn read(src: &Sources, gpus: Vec<String>, local_ranks: usize, configs: &CheckConfigs) -> HostReadings {
    let started = Instant::now();
    let policy = &configs.gpu_health.node;
    let root = src.root.as_path();
    let kernel_log = match policy.kernel_xids {
        Level::Off => KernelLog::Off,
        _ => kmsg::read(&src.kmsg),
    };
    let (driver_version, open_kernel_module) = sysfs::driver(root);
    let (acs, acs_unreadable) = match policy.pcie_acs {
        Level::Off => (Vec::new(), Vec::new()),
        _ => sysfs::acs(root, &gpus),
    };
    HostReadings {
        local_ranks,
        kernel_log,
        shm_bytes: sysfs::shm_bytes(root, src.rig),
        memlock: sysfs::memlock(root),
        rdma_devices: sysfs::entries(&root.join("sys/class/infiniband")),
        peermem_loaded: sysfs::module_loaded(root, "nvidia_peermem"),
        open_kernel_module,
        kernel_release: sysfs::small(&root.join("proc/sys/kernel/osrelease")).map(|s| s.trim().to_string()),
        driver_version,
        acs,
        acs_unreadable,
        gpus,
        read_ms: started.elapsed().as_secs_f64() * 1e3,
    }
}

/// The findings of `readings` under the run's policy.
pub fn judge(readings: &HostReadings, configs: &CheckConfigs) -> Vec<Finding> {
    gpusanity_common::host::judge(
        readings,
        &configs.gpu_health.node,
        &configs.gpu_health.fatal_xids,
        gpusanity_cuda::MIN_DRIVER_MAJOR,
    )
}

/// The host findings node `info` sent about itself, bounded and placed on it: only the host's
/// codes, at the severity sent (a node can only blame itself).
pub fn accepted(info: &NodeInfo, sent: &[Finding]) -> Vec<Finding> {
    sent.iter()
        .filter(|f| CODES.contains(&f.code))
        .take(MAX_FINDINGS)
        .map(|f| {
            let mut g = crate::launcher::sent::bounded(f, f.severity);
            g.node_rank = Some(info.node_rank);
            g.host = Some(info.hostname.clone());
            g
        })
        .collect()
}
