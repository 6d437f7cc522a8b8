//! The host's findings: pure decisions on [`HostReadings`] and the operator's [`NodePolicy`].
//! Each finding names what was read (the evidence) and what to do; the launcher places them on
//! its node.

use super::kernel_log::{pci_key, Outstanding};
use super::{HostReadings, KernelLog, Memlock, NodePolicy, ACS_P2P_REDIRECT};
use crate::findings::{Code, Finding};
use crate::health::xid;
use crate::kinds::Severity;
use crate::registry::Scope;

/// The most XID findings one node gives (the count of the rest is in the last one's evidence).
const MAX_XID_FINDINGS: usize = 16;
const MIB: u64 = 1 << 20;

/// The findings of the host's readings under `policy`. `fatal_xids`: `gpu-health.fatal-xids`;
/// `min_driver_major`: the oldest driver branch the bundled CUDA libraries run on.
pub fn judge(r: &HostReadings, policy: &NodePolicy, fatal_xids: &[u32], min_driver_major: u32) -> Vec<Finding> {
    let mut out = Vec::new();
    kernel_xids(r, policy, fatal_xids, &mut out);
    shm(r, policy, &mut out);
    rdma(r, policy, &mut out);
    acs(r, policy, &mut out);
    driver(r, policy, min_driver_major, &mut out);
    out
}

fn finding(sev: Severity, code: Code, message: String, action: &str) -> Finding {
    let mut f = Finding::new(sev, code, Scope::Device, message);
    f.action = Some(action.into());
    f
}

fn kernel_xids(r: &HostReadings, policy: &NodePolicy, fatal: &[u32], out: &mut Vec<Finding>) {
    let (source, scan, truncated) = match &r.kernel_log {
        KernelLog::Off => return,
        KernelLog::Unreadable { why } => {
            if let Some(sev) = policy.kernel_xids.cap(Severity::Warning) {
                out.push(finding(
                    sev,
                    Code::NodeKernelLogUnreadable,
                    format!("the kernel log could not be read ({why}): XIDs the GPUs raised before this check are not seen"),
                    "let the check read the kernel log: CAP_SYSLOG (or kernel.dmesg_restrict=0) and the host's /dev/kmsg, or its journal, in the pod (docs/health.md)",
                ));
            }
            return;
        }
        KernelLog::Read { source, scan, truncated, .. } => (source, scan, *truncated),
    };
    let job: Vec<String> = r.gpus.iter().filter_map(|g| pci_key(g)).collect();
    let ours = |o: &&Outstanding| job.is_empty() || job.contains(&o.pci);
    let relevant: Vec<&Outstanding> = scan.outstanding.iter().filter(ours).collect();
    let left_out = relevant.len().saturating_sub(MAX_XID_FINDINGS);
    for o in relevant.into_iter().take(MAX_XID_FINDINGS) {
        let is_fatal = fatal.contains(&o.xid);
        let (code, worst) = if is_fatal {
            (Code::NodeKernelXidFatal, Severity::Critical)
        } else {
            (Code::NodeKernelXid, Severity::Warning)
        };
        let Some(sev) = policy.kernel_xids.cap(worst) else { continue };
        let name = xid::name(u64::from(o.xid)).map_or(String::new(), |n| format!(" ({n})"));
        let last = o.events.last();
        let when = last.and_then(|e| e.at_s).map_or(String::new(), |s| format!(", last at {s:.1} s after boot"));
        let mut f = finding(
            sev,
            code,
            format!(
                "GPU {}: XID {}{name} in the kernel log, {} line(s){when}, not cleared by a GPU reset, a driver reload or a reboot since",
                o.pci, o.xid, o.count
            ),
            xid::action(u64::from(o.xid)).unwrap_or("read the XID's line in the kernel log and NVIDIA's XID catalogue"),
        );
        f.measured = Some(f64::from(o.xid));
        f.evidence = o.events.iter().map(|e| e.line.clone()).collect();
        f.evidence
            .push(format!("read from {source}{}", if truncated { " (bounded: the oldest lines only)" } else { "" }));
        out.push(f);
    }
    if let (Some(f), true) = (out.last_mut(), left_out > 0) {
        f.evidence.push(format!("{left_out} more GPU and XID pair(s) not listed"));
    }
}

fn shm(r: &HostReadings, policy: &NodePolicy, out: &mut Vec<Finding>) {
    let (Some(have), true) = (r.shm_bytes, r.local_ranks >= 2) else { return };
    let need = policy.shm_mib_per_rank.saturating_mul(r.local_ranks as u64).saturating_mul(MIB);
    let Some(sev) = policy.shm.severity().filter(|_| have < need) else { return };
    let mut f = finding(
        sev,
        Code::NodeShmSmall,
        format!(
            "/dev/shm holds {} MiB; {} ranks on the node need {} MiB for NCCL's shared-memory transport ({} MiB a rank, gpu-health.shm-mib-per-rank)",
            have / MIB,
            r.local_ranks,
            need / MIB,
            policy.shm_mib_per_rank
        ),
        "give the pod a larger /dev/shm (an emptyDir of medium Memory at /dev/shm; docker --shm-size=1g)",
    );
    f.measured = Some((have / MIB) as f64);
    f.expected = Some((need / MIB) as f64);
    out.push(f);
}

fn rdma(r: &HostReadings, policy: &NodePolicy, out: &mut Vec<Finding>) {
    if r.rdma_devices.is_empty() {
        return;
    }
    let devices = format!("RDMA devices: {}", r.rdma_devices.join(", "));
    if let (Some(Memlock::Bytes(b)), Some(sev)) = (r.memlock, policy.memlock.severity()) {
        let mut f = finding(
            sev,
            Code::NodeMemlockLimited,
            format!("RLIMIT_MEMLOCK is {} KiB, not unlimited, on a node with RDMA devices: NCCL's memory registration fails", b / 1024),
            "raise the memlock limit to unlimited (LimitMEMLOCK=infinity for the container runtime, ulimit -l unlimited)",
        );
        f.evidence.push(devices.clone());
        out.push(f);
    }
    let dmabuf = r.open_kernel_module && r.kernel_has_dmabuf();
    if !r.peermem_loaded && !dmabuf {
        if let Some(sev) = policy.gpudirect_rdma.severity() {
            let mut f = finding(
                sev,
                Code::NodeNoGpudirectRdma,
                "no GPUDirect RDMA path: nvidia_peermem is not loaded and DMA-BUF is not available (it needs NVIDIA's open kernel module and Linux 5.12 or later): NCCL stages GPU traffic through host memory".into(),
                "load nvidia_peermem (modprobe nvidia-peermem), or use the open kernel module on Linux 5.12+",
            );
            f.evidence.push(devices);
            f.evidence.push(format!(
                "kernel {}; NVIDIA kernel module {}",
                r.kernel_release.as_deref().unwrap_or("unknown"),
                if r.open_kernel_module { "open" } else { "proprietary or unknown" }
            ));
            out.push(f);
        }
    }
}

fn acs(r: &HostReadings, policy: &NodePolicy, out: &mut Vec<Finding>) {
    // Peer-to-peer traffic needs two GPUs, or a GPU and a NIC.
    if r.gpus.len() < 2 && r.rdma_devices.is_empty() {
        return;
    }
    let Some(sev) = policy.pcie_acs.severity() else { return };
    let redirecting: Vec<String> = r
        .acs
        .iter()
        .filter_map(|b| b.control.filter(|c| c & ACS_P2P_REDIRECT != 0).map(|c| (b, c)))
        .map(|(b, c)| format!("bridge {} above GPU {}: ACS control {c:#06x}", b.bridge, b.gpu))
        .collect();
    if !redirecting.is_empty() {
        let mut f = finding(
            sev,
            Code::NodePcieAcsEnabled,
            format!(
                "PCIe ACS redirects peer-to-peer traffic on {} bridge(s) above the job's GPUs: GPU-to-GPU and GPU-to-NIC traffic detours through the root complex",
                redirecting.len()
            ),
            "disable ACS on the bridges (BIOS, or setpci) on bare metal; keep it where a hypervisor needs it",
        );
        f.evidence = redirecting;
        out.push(f);
    }
    if !r.acs_unreadable.is_empty() {
        let mut f = finding(
            Severity::Warning,
            Code::NodePcieAcsUnreadable,
            format!(
                "the PCIe configuration space of {} bridge(s) above the job's GPUs could not be read (it needs root): ACS not judged",
                r.acs_unreadable.len()
            ),
            "run the check as root, or check ACS with `lspci -vvv` as root",
        );
        f.evidence = r.acs_unreadable.iter().take(16).cloned().collect();
        out.push(f);
    }
}

fn driver(r: &HostReadings, policy: &NodePolicy, min_major: u32, out: &mut Vec<Finding>) {
    out.extend(driver_too_old(r.driver_version.as_deref(), policy, min_major));
}

/// The driver `have` against the oldest branch the bundled CUDA libraries run on: also read on
/// its own for a node whose CUDA cannot start, where nothing else of the host is judged.
pub fn driver_too_old(have: Option<&str>, policy: &NodePolicy, min_major: u32) -> Option<Finding> {
    let have = have?;
    let major = have.split('.').next().and_then(|m| m.parse::<u32>().ok())?;
    let sev = policy.bundled_driver.severity().filter(|_| major < min_major)?;
    let mut f = finding(
        sev,
        Code::NodeDriverTooOld,
        format!("the NVIDIA driver {have} is older than the CUDA libraries gpusanity runs need (driver {min_major} or later)"),
        "upgrade the driver to the required branch, or use a gpusanity build for an older CUDA",
    );
    f.measured = Some(f64::from(major));
    f.expected = Some(f64::from(min_major));
    Some(f)
}

#[cfg(test)]
#[path = "judge_tests.rs"]
mod tests;
