//! The host's settings from its files, under `root` (`/`, or a rig's tree): `/dev/shm`'s size,
//! `RLIMIT_MEMLOCK` (`/proc/self/limits`), RDMA devices, `nvidia_peermem`, the driver's
//! version and kind, the kernel's release, and the PCIe ACS control of every bridge above a GPU
//! (its configuration space in sysfs).

use std::io::Read;
use std::path::{Path, PathBuf};

use gpusanity_common::host::kernel_log::pci_key;
use gpusanity_common::host::{AcsBridge, Memlock};

/// The most bytes read of one small file.
const SMALL: u64 = 64 << 10;
/// The most entries listed of one directory.
const MAX_ENTRIES: usize = 4096;
/// PCIe's extended configuration space: 4096 bytes; the conventional space is the first 256.
const CONFIG_EXTENDED: usize = 4096;
const CONFIG_CONVENTIONAL: usize = 256;
/// The extended capability id of ACS, and its control register's offset in it.
const ACS_CAP_ID: u32 = 0x000d;
const ACS_CONTROL: usize = 6;
/// The most extended capabilities followed (a loop in a forged list ends here).
const MAX_CAPS: usize = 128;

/// A rig's stand-in for `/dev/shm`'s size, which is no file on a real node: `RIG_SHM` in the tree.
pub const RIG_SHM: &str = "rig/shm-bytes";

pub fn small(path: &Path) -> Option<String> {
    let mut buf = Vec::new();
    std::fs::File::open(path).ok()?.take(SMALL).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// `/dev/shm`'s size in bytes: a rig's file, else the file system's.
pub fn shm_bytes(root: &Path, rig: bool) -> Option<u64> {
    if rig {
        return small(&root.join(RIG_SHM)).and_then(|s| s.trim().parse().ok());
    }
    let st = nix::sys::statvfs::statvfs(&root.join("dev/shm")).ok()?;
    (st.blocks() as u64).checked_mul(st.fragment_size() as u64)
}

/// `Max locked memory` of `/proc/self/limits` (the soft limit).
pub fn memlock(root: &Path) -> Option<Memlock> {
    let text = small(&root.join("proc/self/limits"))?;
    let line = text.lines().find(|l| l.starts_with("Max locked memory"))?;
    let soft = line.trim_start_matches("Max locked memory").split_whitespace().next()?;
    match soft {
        "unlimited" => Some(Memlock::Unlimited),
        n => n.parse().ok().map(Memlock::Bytes),
    }
}

/// The names in `dir`, sorted (none where it cannot be read).
pub fn entries(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut v: Vec<String> =
        rd.take(MAX_ENTRIES).flatten().filter_map(|e| e.file_name().to_str().map(str::to_string)).collect();
    v.sort();
    v
}

/// Whether `/proc/modules` lists `module`.
pub fn module_loaded(root: &Path, module: &str) -> bool {
    small(&root.join("proc/modules")).is_some_and(|t| t.lines().any(|l| l.split_whitespace().next() == Some(module)))
}

/// The NVIDIA driver's version and whether its kernel module is the open one.
pub fn driver(root: &Path) -> (Option<String>, bool) {
    if let Some(text) = small(&root.join("proc/driver/nvidia/version")) {
        let first = text.lines().next().unwrap_or_default();
        let open = first.contains("Open Kernel Module");
        return (first.split_whitespace().find(|w| is_version(w)).map(str::to_string), open);
    }
    let v = small(&root.join("sys/module/nvidia/version")).map(|s| s.trim().to_string()).filter(|v| is_version(v));
    (v, false)
}

fn is_version(w: &str) -> bool {
    w.len() <= 32 && w.contains('.') && w.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// What the bridges above the GPUs show: each bridge's ACS control, and those whose extended
/// configuration space could not be read.
pub fn acs(root: &Path, gpus: &[String]) -> (Vec<AcsBridge>, Vec<String>) {
    let devices = root.join("sys/bus/pci/devices");
    let (mut bridges, mut unreadable) = (Vec::new(), Vec::new());
    for gpu in gpus {
        for (bridge, dir) in bridges_above(&devices, gpu) {
            if bridges.iter().any(|b: &AcsBridge| b.bridge == bridge && b.gpu == *gpu) {
                continue;
            }
            match config_space(&dir.join("config")) {
                Some(cfg) if cfg.len() >= CONFIG_EXTENDED => {
                    bridges.push(AcsBridge { gpu: gpu.clone(), bridge, control: acs_control(&cfg) })
                }
                // Exactly the conventional space: a device without an extended one, so no ACS.
                Some(cfg) if cfg.len() == CONFIG_CONVENTIONAL && nix::unistd::geteuid().is_root() => {
                    bridges.push(AcsBridge { gpu: gpu.clone(), bridge, control: None })
                }
                _ if !unreadable.contains(&bridge) => unreadable.push(bridge),
                _ => {}
            }
        }
    }
    (bridges, unreadable)
}

/// The PCI bridges on the path from the root complex to `gpu` (its sysfs directory's parents
/// named as PCI addresses), nearest first.
fn bridges_above(devices: &Path, gpu: &str) -> Vec<(String, PathBuf)> {
    let Ok(real) = std::fs::canonicalize(devices.join(gpu)) else { return Vec::new() };
    let mut out = Vec::new();
    let mut at = real.parent();
    while let Some(dir) = at {
        let Some(name) = dir.file_name().and_then(|n| n.to_str()) else { break };
        if !(name.len() == 12 && name.as_bytes()[7] == b':' && pci_key(name).is_some()) {
            break;
        }
        out.push((name.to_string(), dir.to_path_buf()));
        at = dir.parent();
    }
    out
}

fn config_space(path: &Path) -> Option<Vec<u8>> {
    let mut buf = Vec::new();
    std::fs::File::open(path).ok()?.take(CONFIG_EXTENDED as u64).read_to_end(&mut buf).ok()?;
    Some(buf)
}

/// ACS Control of a device's extended configuration space, `None` where it has no ACS
/// capability. The list starts at 0x100; each header holds the id (bits 0-15) and the next
/// capability's offset (bits 20-31).
pub fn acs_control(cfg: &[u8]) -> Option<u16> {
    let u32_at = |o: usize| cfg.get(o..o + 4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
    let mut offset = CONFIG_CONVENTIONAL;
    for _ in 0..MAX_CAPS {
        let header = u32_at(offset)?;
        if header == 0 || header == u32::MAX {
            return None;
        }
        if header & 0xffff == ACS_CAP_ID {
            let b = cfg.get(offset + ACS_CONTROL..offset + ACS_CONTROL + 2)?;
            return Some(u16::from_le_bytes([b[0], b[1]]));
        }
        let next = (header >> 20) as usize & !3;
        if next < CONFIG_CONVENTIONAL || next <= offset {
            return None;
        }
        offset = next;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An extended configuration space with the capabilities `caps` (id, the 4 bytes after the
    /// header's, control) chained from 0x100.
    pub fn config_with(caps: &[(u32, u16)]) -> Vec<u8> {
        let mut cfg = vec![0u8; CONFIG_EXTENDED];
        for (i, (id, control)) in caps.iter().enumerate() {
            let at = CONFIG_CONVENTIONAL + i * 0x40;
            let next = if i + 1 < caps.len() { (at + 0x40) as u32 } else { 0 };
            cfg[at..at + 4].copy_from_slice(&(id | (1 << 16) | (next << 20)).to_le_bytes());
            cfg[at + ACS_CONTROL..at + ACS_CONTROL + 2].copy_from_slice(&control.to_le_bytes());
        }
        cfg
    }

    #[test]
    fn acs_control_is_found_along_the_chain_and_a_forged_chain_ends() {
        assert_eq!(acs_control(&config_with(&[(0x0001, 0), (ACS_CAP_ID, 0x001d)])), Some(0x001d));
        assert_eq!(acs_control(&config_with(&[(0x0001, 0), (0x0010, 0)])), None);
        assert_eq!(acs_control(&[0u8; 64]), None);
        // A capability pointing back at itself.
        let mut cfg = vec![0u8; CONFIG_EXTENDED];
        cfg[256..260].copy_from_slice(&(0x0001u32 | (256 << 20)).to_le_bytes());
        assert_eq!(acs_control(&cfg), None);
    }

    #[test]
    fn limits_modules_and_driver_are_read_from_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("proc/self")).unwrap();
        std::fs::create_dir_all(root.join("proc/driver/nvidia")).unwrap();
        std::fs::write(
            root.join("proc/self/limits"),
            "Limit                     Soft Limit           Hard Limit           Units\nMax locked memory         8388608              8388608              bytes\n",
        )
        .unwrap();
        std::fs::write(root.join("proc/modules"), "nvidia_uvm 1 0 - Live 0x0\nnvidia_peermem 16384 0 - Live 0x0\n")
            .unwrap();
        std::fs::write(
            root.join("proc/driver/nvidia/version"),
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U22)\n",
        )
        .unwrap();
        assert_eq!(memlock(root), Some(Memlock::Bytes(8_388_608)));
        assert!(module_loaded(root, "nvidia_peermem"));
        assert!(!module_loaded(root, "nvidia_peer"));
        assert_eq!(driver(root), (Some("580.95.05".into()), true));
        assert_eq!(shm_bytes(root, true), None);
        std::fs::create_dir_all(root.join("rig")).unwrap();
        std::fs::write(root.join(RIG_SHM), "67108864\n").unwrap();
        assert_eq!(shm_bytes(root, true), Some(64 << 20));
        assert!(shm_bytes(Path::new("/"), false).is_some_and(|b| b > 0));
        assert!(memlock(Path::new("/")).is_some());
    }
}
