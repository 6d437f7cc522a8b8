//! Typed configurations of gemm and the micro-benchmarks other than the collective sweeps and
//! their `--check-param` fields; their defaults per backend are in their descriptors.

use serde::{Deserialize, Serialize};

use super::param::{Param, ParamError};
use crate::kinds::DeviceKind;

/// `gemm`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmConfig {
    /// m = n = k of the square product.
    pub size: usize,
    pub warmup: usize,
    pub iters: usize,
    /// Side of the square tile of C verified against an f64 reference on the host.
    pub verify_tile: usize,
}

impl GemmConfig {
    pub const KEYS: &'static [&'static str] = &["size", "warmup", "iters", "verify-tile"];

    pub fn defaults(device: DeviceKind) -> Self {
        match device {
            DeviceKind::Cuda => GemmConfig { size: 8192, warmup: 50, iters: 50, verify_tile: 32 },
            DeviceKind::Cpu => GemmConfig { size: 1024, warmup: 2, iters: 10, verify_tile: 16 },
        }
    }

    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "size" => self.size = p.dim()?,
            "warmup" => self.warmup = p.count()?,
            "iters" => self.iters = p.count()?,
            "verify-tile" => self.verify_tile = p.dim()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Once every override is applied: the verified tile fits in the product.
    pub fn settle(&mut self) {
        self.verify_tile = self.verify_tile.min(self.size);
    }
}

/// `multi-all-reduce`: one size, every group at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MultiAllReduceConfig {
    /// Bytes of each all-reduce.
    pub bytes: u64,
    /// Concurrent all-reduces on the world group, each on a communicator and stream of its own.
    pub world_streams: usize,
    pub warmup: usize,
    pub iters: usize,
    /// Whether the diagnosis compares groups of one kind. Off on CPU workers: the threads of
    /// one worker share the host's cores unfairly, so concurrent groups' figures are noise.
    pub compare_groups: bool,
}

impl MultiAllReduceConfig {
    pub const KEYS: &'static [&'static str] = &["bytes", "world-streams", "warmup", "iters"];

    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "bytes" => self.bytes = p.int()?,
            "world-streams" => self.world_streams = p.count()?,
            "warmup" => self.warmup = p.count()?,
            "iters" => self.iters = p.count()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// `network-connectivity`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectivityConfig {
    /// Each probe (a TCP connection, a back-end exchange) fails after this wait.
    pub timeout_ms: u64,
    /// Bytes each back-end probe exchanges.
    pub bytes: u64,
    /// Up to this many nodes every pair is probed; beyond, each node (and each rail) is probed
    /// with the nodes at distances 1, 2, 4, ... around a ring (about 2·log2(n) partners).
    #[serde(default = "ConnectivityConfig::default_full_matrix_nodes")]
    pub full_matrix_nodes: usize,
}

impl ConnectivityConfig {
    pub const KEYS: &'static [&'static str] = &["timeout-ms", "bytes", "full-matrix-nodes"];

    fn default_full_matrix_nodes() -> usize {
        16
    }

    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "timeout-ms" => self.timeout_ms = p.int()?,
            "bytes" => self.bytes = p.int()?,
            "full-matrix-nodes" => self.full_matrix_nodes = p.count()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// `matmul-all-reduce-overlap`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverlapConfig {
    /// m = n = k of the GEMM.
    pub gemm_size: usize,
    /// Bytes of the all-reduce.
    pub bytes: u64,
    pub warmup: usize,
    pub iters: usize,
}

impl OverlapConfig {
    pub const KEYS: &'static [&'static str] = &["gemm-size", "bytes", "warmup", "iters"];

    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "gemm-size" => self.gemm_size = p.dim()?,
            "bytes" => self.bytes = p.int()?,
            "warmup" => self.warmup = p.count()?,
            "iters" => self.iters = p.count()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// `kernel-launch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelLaunchConfig {
    /// Launches per measurement.
    pub iters: usize,
}

impl KernelLaunchConfig {
    pub const KEYS: &'static [&'static str] = &["iters"];

    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "iters" => self.iters = p.count()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}
