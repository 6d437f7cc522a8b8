//! `gpu-health`: its configuration and `--check-param` fields.

use serde::{Deserialize, Serialize};

use super::{Param, ParamError};
use crate::health::xid;

/// The most GPUs one node is expected to have.
pub const MAX_GPUS_PER_NODE: u64 = 1024;
/// The highest XID accepted in `fatal-xids`.
pub const MAX_XID: u32 = 65_535;
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
        }
    }
}

impl GpuHealthConfig {
    pub const KEYS: &'static [&'static str] =
        &["expected-gpus", "fatal-xids", "load-ms", "load-size", "sample-ms", "min-clock-fraction"];

    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "expected-gpus" => self.expected_gpus = Some(p.bounded(MAX_GPUS_PER_NODE)? as usize),
            "fatal-xids" => self.fatal_xids = parse_xids(p)?,
            "load-ms" => self.load_ms = p.bounded(MAX_LOAD_MS)?,
            "load-size" => self.load_size = p.bounded(16_384)? as usize,
            "sample-ms" => self.sample_ms = p.bounded(1000)?,
            "min-clock-fraction" => self.min_clock_fraction = p.fraction("a fraction between 0 and 1")?,
            _ => return Ok(false),
        }
        Ok(true)
    }
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
