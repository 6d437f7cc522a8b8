//! The device a node checks on, as `gpusanity check --device` and `gpusanity agent --device`
//! take it: `auto` (CUDA when a GPU is usable, else the CPU), `cuda` or `cpu`.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Which backend a node's checks run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    /// CUDA when a GPU is usable, else the CPU.
    #[default]
    Auto,
    Cuda,
    Cpu,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("unknown device `{0}`: expected auto, cuda or cpu")]
pub struct UnknownDevice(pub String);

impl DeviceChoice {
    /// The names, as the flags take them.
    pub const NAMES: [&'static str; 3] = ["auto", "cuda", "cpu"];

    pub fn as_str(self) -> &'static str {
        match self {
            DeviceChoice::Auto => "auto",
            DeviceChoice::Cuda => "cuda",
            DeviceChoice::Cpu => "cpu",
        }
    }
}

impl FromStr for DeviceChoice {
    type Err = UnknownDevice;

    fn from_str(s: &str) -> Result<DeviceChoice, UnknownDevice> {
        match s {
            "auto" => Ok(DeviceChoice::Auto),
            "cuda" => Ok(DeviceChoice::Cuda),
            "cpu" => Ok(DeviceChoice::Cpu),
            _ => Err(UnknownDevice(s.to_string())),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Operator-only: a directory the NVIDIA hardware census reads in place of `/` (its `proc/`,
/// `dev/` and `sys/bus/pci/devices/`), for test rigs' fake trees. Read from the launcher's own
/// environment, which a job cannot set (`GPUSANITY_*` is never a job's to set).
pub const HW_ROOT_ENV: &str = "GPUSANITY_TEST_HW_ROOT";

/// PCI vendor id of NVIDIA.
const NVIDIA_VENDOR: u32 = 0x10de;
/// PCI classes of a GPU: VGA-compatible display controller and 3D controller (the base class
/// and subclass, the top 16 of the 24 bits of `class`).
const GPU_CLASSES: [u32; 2] = [0x0300, 0x0302];
/// The most entries read from one directory of the census (a PCI bus, `/dev`).
const MAX_ENTRIES: usize = 65_536;
/// The most GPUs the census names.
const MAX_GPUS: usize = 1024;

/// What of NVIDIA's hardware and driver a node shows, read from the file system only (no
/// library is loaded): whether the node is a GPU node, whatever CUDA says of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvidiaHardware {
    /// `/proc/driver/nvidia` exists: the kernel driver is loaded.
    pub driver_loaded: bool,
    /// The GPU device nodes in `/dev` (`nvidia0`, `nvidia1`...), sorted.
    pub dev_nodes: Vec<String>,
    /// PCI bus ids (`0000:19:00.0`) of NVIDIA display and 3D controllers, sorted.
    pub pci_gpus: Vec<String>,
}

impl NvidiaHardware {
    /// Reads the census under `root` (`/` on a real node). Unreadable parts count as absent.
    pub fn detect(root: &Path) -> NvidiaHardware {
        let driver_loaded = root.join("proc/driver/nvidia").is_dir();
        let mut dev_nodes: Vec<String> = entries(&root.join("dev"))
            .into_iter()
            .filter(|n| {
                n.strip_prefix("nvidia").is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
            })
            .take(MAX_GPUS)
            .collect();
        dev_nodes.sort();
        let pci = root.join("sys/bus/pci/devices");
        let mut pci_gpus: Vec<String> = entries(&pci)
            .into_iter()
            .filter(|id| {
                let dir = pci.join(id);
                hex_file(&dir.join("vendor")) == Some(NVIDIA_VENDOR)
                    && hex_file(&dir.join("class")).is_some_and(|c| GPU_CLASSES.contains(&(c >> 8)))
            })
            .take(MAX_GPUS)
            .collect();
        pci_gpus.sort();
        NvidiaHardware { driver_loaded, dev_nodes, pci_gpus }
    }

    /// The census of this node: under [`HW_ROOT_ENV`] where the operator set it, else `/`.
    pub fn of_this_node() -> NvidiaHardware {
        let root = std::env::var_os(HW_ROOT_ENV).filter(|v| !v.is_empty()).unwrap_or_else(|| "/".into());
        NvidiaHardware::detect(Path::new(&root))
    }

    /// Whether the node has any NVIDIA GPU hardware or driver.
    pub fn present(&self) -> bool {
        self.driver_loaded || !self.dev_nodes.is_empty() || !self.pci_gpus.is_empty()
    }

    /// One line of what was found, for a finding's evidence.
    pub fn describe(&self) -> String {
        if !self.present() {
            return "no NVIDIA driver (/proc/driver/nvidia), GPU device node (/dev/nvidia*) or PCI GPU (vendor 0x10de, class 0x0300/0x0302)".into();
        }
        let list = |v: &[String]| if v.is_empty() { "none".to_string() } else { v.join(", ") };
        format!(
            "NVIDIA driver {}; device nodes: {}; PCI GPUs: {}",
            if self.driver_loaded { "loaded" } else { "not loaded" },
            list(&self.dev_nodes),
            list(&self.pci_gpus)
        )
    }
}

/// The names in `dir` (at most [`MAX_ENTRIES`]), none where it cannot be read.
fn entries(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.take(MAX_ENTRIES).filter_map(|e| e.ok()?.file_name().into_string().ok()).collect()
}

/// A sysfs attribute holding one hex number (`0x10de`), read from at most 32 bytes.
fn hex_file(path: &Path) -> Option<u32> {
    use std::io::Read;
    let mut buf = [0u8; 32];
    let n = std::fs::File::open(path).ok()?.read(&mut buf).ok()?;
    let text = std::str::from_utf8(buf.get(..n)?).ok()?.trim();
    u32::from_str_radix(text.strip_prefix("0x").unwrap_or(text), 16).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in DeviceChoice::NAMES {
            let d: DeviceChoice = name.parse().unwrap();
            assert_eq!(d.to_string(), name);
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{name}\""));
        }
        assert!("gpu".parse::<DeviceChoice>().is_err());
    }

    /// A fake node: `pci` holds (bus id, vendor, class) of each PCI device.
    fn tree(driver: bool, dev: &[&str], pci: &[(&str, &str, &str)]) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        if driver {
            std::fs::create_dir_all(root.path().join("proc/driver/nvidia/gpus")).unwrap();
        }
        std::fs::create_dir_all(root.path().join("dev")).unwrap();
        for d in dev {
            std::fs::write(root.path().join("dev").join(d), b"").unwrap();
        }
        for (id, vendor, class) in pci {
            let dir = root.path().join("sys/bus/pci/devices").join(id);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("vendor"), format!("{vendor}\n")).unwrap();
            std::fs::write(dir.join("class"), format!("{class}\n")).unwrap();
        }
        root
    }

    #[test]
    fn the_census_finds_nvidia_gpus_by_driver_device_node_or_pci() {
        let t = tree(
            false,
            &["nvidia1", "nvidia0", "nvidiactl", "nvidia-uvm", "null"],
            &[
                ("0000:19:00.0", "0x10de", "0x030200"),
                ("0000:01:00.0", "0x10de", "0x030000"),
                // An NVIDIA bridge (NVSwitch, audio) is not a GPU; an Intel GPU is not NVIDIA.
                ("0000:05:00.0", "0x10de", "0x068000"),
                ("0000:00:02.0", "0x8086", "0x030000"),
            ],
        );
        let hw = NvidiaHardware::detect(t.path());
        assert!(hw.present());
        assert!(!hw.driver_loaded);
        assert_eq!(hw.dev_nodes, ["nvidia0", "nvidia1"]);
        assert_eq!(hw.pci_gpus, ["0000:01:00.0", "0000:19:00.0"]);
        assert!(hw.describe().contains("0000:19:00.0"), "{}", hw.describe());
        // Each of the three alone makes a GPU node.
        assert!(NvidiaHardware::detect(tree(true, &[], &[]).path()).present());
        assert!(NvidiaHardware::detect(tree(false, &["nvidia3"], &[]).path()).present());
        assert!(NvidiaHardware::detect(tree(false, &[], &[("0000:3b:00.0", "0x10de", "0x030200")]).path()).present());
    }

    #[test]
    fn a_node_without_nvidia_hardware_or_with_garbage_in_sysfs_has_none() {
        let t = tree(
            false,
            &["nvidia", "nvidiax", "null"],
            &[("0000:00:02.0", "0x8086", "0x030000"), ("0000:00:03.0", "garbage", "0x030000")],
        );
        // A vendor file longer than the read: not a number, not NVIDIA.
        let long = t.path().join("sys/bus/pci/devices/0000:00:04.0");
        std::fs::create_dir_all(&long).unwrap();
        std::fs::write(long.join("vendor"), "0x10de".repeat(100)).unwrap();
        std::fs::write(long.join("class"), "0x030000").unwrap();
        let hw = NvidiaHardware::detect(t.path());
        assert!(!hw.present(), "{hw:?}");
        assert!(!NvidiaHardware::detect(Path::new("/nonexistent/root")).present());
        assert!(hw.describe().starts_with("no NVIDIA driver"));
    }
}
