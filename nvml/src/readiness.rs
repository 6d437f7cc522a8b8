//! What decides whether a GPU is ready for a job beside its health: the processes on it (with
//! their memory and SM utilisation) and its settings. NVML calls of a few milliseconds, read
//! with the rest of [`crate::Monitor::read`].

use std::collections::BTreeMap;

use nvml_wrapper::enum_wrappers::device::{Clock, ComputeMode};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;
use nvml_wrapper::Device;

use std::path::Path;

use gpusanity_common::health::{GpuProcess, GpuSettings, Mps, Read};

use crate::raw;
use crate::read::read;

/// The most processes recorded per GPU.
const MAX_PROCESSES: usize = 256;
/// The longest process name kept (`/proc/PID/comm` holds at most 16 bytes).
const MAX_NAME: usize = 64;

/// The running compute and graphics processes of the GPU, each with its memory, its name from
/// `/proc` and the highest SM utilisation sampled since `since_us` (CPU time, microseconds
/// since the epoch).
pub(crate) fn processes(d: &Device<'_>, since_us: u64) -> Read<Vec<GpuProcess>> {
    let compute = read(d.running_compute_processes());
    let graphics = read(d.running_graphics_processes());
    let mut util: BTreeMap<u32, u32> = BTreeMap::new();
    // No sample since then is NVML's NotFound: nobody computed.
    if let Ok(samples) = d.process_utilization_stats(since_us) {
        for s in samples {
            let e = util.entry(s.pid).or_insert(0);
            *e = (*e).max(s.sm_util.min(100));
        }
    }
    let mut out = Vec::new();
    let lists = [("compute", &compute), ("graphics", &graphics)];
    for (kind, list) in lists {
        let Some(list) = list.value() else { continue };
        for p in list.iter().take(MAX_PROCESSES.saturating_sub(out.len())) {
            out.push(one(p, kind, util.get(&p.pid).copied()));
        }
    }
    match (&compute, &graphics) {
        (Read::Value(_), _) | (_, Read::Value(_)) => Read::Value(out),
        (Read::Error(e), _) | (_, Read::Error(e)) => Read::Error(e.clone()),
        _ => Read::NotSupported,
    }
}

fn one(p: &ProcessInfo, kind: &str, sm_util: Option<u32>) -> GpuProcess {
    let used_mib = match p.used_gpu_memory {
        UsedGpuMemory::Used(b) => Some(b >> 20),
        UsedGpuMemory::Unavailable => None,
    };
    GpuProcess { pid: p.pid, name: comm(p.pid), used_mib, kind: kind.into(), sm_util }
}

/// A process's name from `/proc/PID/comm`, where this process may read it (another
/// container's process is not visible).
fn comm(pid: u32) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    let name: String = text.trim().chars().filter(|c| !c.is_control()).take(MAX_NAME).collect();
    (!name.is_empty()).then_some(name)
}

/// Compute mode, MIG mode, pending ECC, application clocks, persistence, P0's highest SM clock
/// against the maximum (locked clocks), and the node's MPS daemon; each `None` where the
/// device or driver does not have it.
pub(crate) fn settings(nvml: &nvml_wrapper::Nvml, d: &Device<'_>) -> GpuSettings {
    let mig = d.mig_mode().ok();
    GpuSettings {
        compute_mode: d.compute_mode().ok().map(|m| {
            match m {
                ComputeMode::Default => "default",
                ComputeMode::ExclusiveThread => "exclusive_thread",
                ComputeMode::Prohibited => "prohibited",
                ComputeMode::ExclusiveProcess => "exclusive_process",
            }
            .to_string()
        }),
        mig_enabled: mig.as_ref().map(|m| m.current != 0),
        mig_pending: mig.as_ref().map(|m| m.pending != 0),
        ecc_pending: d.is_ecc_enabled().ok().map(|e| e.pending_enabled),
        app_sm_mhz: d.applications_clock(Clock::SM).ok(),
        default_app_sm_mhz: d.default_applications_clock(Clock::SM).ok(),
        persistence: d.is_in_persistent_mode().ok(),
        p0_max_sm_mhz: raw::p0_sm_clock_range(nvml, d).ok().map(|(_, max)| max),
        max_sm_mhz: d.max_clock_info(Clock::SM).ok(),
        mps: Some(mps(Path::new("/"), std::env::var("CUDA_MPS_PIPE_DIRECTORY").ok().as_deref())),
        fabric: raw::fabric(nvml, d).ok().flatten(),
    }
}

/// MPS's default pipe directory.
const MPS_PIPE_DIR: &str = "/tmp/nvidia-mps";
/// The most `/proc` entries looked at for MPS's processes.
const MAX_PROC_ENTRIES: usize = 1 << 20;

/// The node's MPS daemon under `root` (`/`; a tree of its own in tests): the `control` socket
/// of the pipe directory (`pipe_dir`, from `CUDA_MPS_PIPE_DIRECTORY`, else MPS's default) and
/// the `nvidia-cuda-mps-control` and `-server` processes this process can see.
pub(crate) fn mps(root: &Path, pipe_dir: Option<&str>) -> Mps {
    let dir = pipe_dir.filter(|d| !d.is_empty() && d.len() <= 4096).unwrap_or(MPS_PIPE_DIR);
    let control = root.join(dir.trim_start_matches('/')).join("control");
    let mut daemons = Vec::new();
    if let Ok(entries) = std::fs::read_dir(root.join("proc")) {
        for e in entries.take(MAX_PROC_ENTRIES).flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            let Ok(comm) = std::fs::read_to_string(e.path().join("comm")) else { continue };
            let name = comm.trim();
            if name.starts_with("nvidia-cuda-mps") && daemons.len() < MAX_PROCESSES {
                daemons.push((pid, name.chars().take(MAX_NAME).collect()));
            }
        }
    }
    daemons.sort_unstable();
    Mps { pipe_dir: dir.to_string(), control: std::fs::symlink_metadata(control).is_ok(), daemons }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_mps_daemon_is_seen_by_its_socket_and_its_processes_and_nothing_else_is() {
        let root = tempfile::tempdir().unwrap();
        let proc_ = root.path().join("proc");
        for (pid, comm) in
            [("1", "systemd\n"), ("3131", "nvidia-cuda-mps-control\n"), ("self", "x\n"), ("77", "nvidia-smi\n")]
        {
            std::fs::create_dir_all(proc_.join(pid)).unwrap();
            std::fs::write(proc_.join(pid).join("comm"), comm).unwrap();
        }
        let m = mps(root.path(), None);
        assert_eq!((m.pipe_dir.as_str(), m.control), (MPS_PIPE_DIR, false));
        assert_eq!(m.daemons, [(3131, "nvidia-cuda-mps-control".to_string())]);
        assert!(m.active());
        std::fs::create_dir_all(root.path().join("run/mps")).unwrap();
        std::fs::write(root.path().join("run/mps/control"), b"").unwrap();
        std::fs::remove_dir_all(proc_.join("3131")).unwrap();
        let m = mps(root.path(), Some("/run/mps"));
        assert!(m.control && m.daemons.is_empty() && m.active(), "{m:?}");
        let bare = tempfile::tempdir().unwrap();
        assert!(!mps(bare.path(), Some("")).active());
    }
}
