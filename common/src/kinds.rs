//! The words every part of the crate speaks — the device kind, a finding's severity, a GPU's
//! link, a measured node pair — in a leaf module that imports nothing of the crate, so that the
//! report, the findings, the settings and the fleet can all use them without importing each
//! other. `report` re-exports them where report.json's readers look for them.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    Cpu,
    Cuda,
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Warning,
    Critical,
}

/// How a GPU is linked to the others of its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Link {
    /// At least one NVLink is up.
    Nvlink,
    /// No NVLink is up: the GPUs reach each other over PCIe.
    Pcie,
}

impl Link {
    pub fn as_str(self) -> &'static str {
        match self {
            Link::Nvlink => "NVLink",
            Link::Pcie => "PCIe",
        }
    }
}

/// One measured node pair of the link test: bus bandwidth of a 2-member all-reduce between
/// the two nodes (the slowest rail when nodes have several workers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairBandwidth {
    pub nodes: [usize; 2],
    pub busbw_gbps: f64,
    /// The round of the link test that measured it (1-based).
    pub round: usize,
}
