//! Compute and communication backends. A worker owns one backend for its device; the checks are
//! written once over the [`Backend`] trait.
//!
//! - `cpu`: fp32 GEMM through the `gemm` crate; collectives between worker processes over TCP
//!   with NCCL's semantics (ring all-reduce, exact results).
//! - `cuda`: cudarc with dynamic loading: cuBLAS(Lt) bf16 GEMM, CUDA events, NCCL.

pub mod cpu;
pub mod cuda;

use gpusanity_common::report::DeviceKind;
use thiserror::Error;

use crate::store::{StoreClient, StoreError};

#[derive(Debug, Error)]
pub enum BackendError {
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("device error: {0}")]
    Device(String),
    #[error("communication error: {0}")]
    Comm(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Element type of device buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::Bf16 => "bf16",
        }
    }

    /// Element `i` of a little-endian buffer of this type, as f32.
    pub fn decode(self, bytes: &[u8], i: usize) -> f32 {
        match self {
            Dtype::F32 => {
                let b = &bytes[4 * i..4 * i + 4];
                f32::from_le_bytes([b[0], b[1], b[2], b[3]])
            }
            Dtype::Bf16 => half::bf16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f32(),
        }
    }

    /// Appends `x` to `out` as little-endian bytes of this type.
    pub fn encode(self, x: f32, out: &mut Vec<u8>) {
        match self {
            Dtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
            Dtype::Bf16 => out.extend_from_slice(&half::bf16::from_f32(x).to_bits().to_le_bytes()),
        }
    }

    /// Rounds `x` to the nearest value this type holds.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Dtype::F32 => x,
            Dtype::Bf16 => half::bf16::from_f32(x).to_f32(),
        }
    }
}

/// Where a worker sits in the job.
#[derive(Debug, Clone)]
pub struct WorkerPlace {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    pub node_rank: usize,
    /// The address other nodes reach this worker's node at (for the CPU transport).
    pub node_addr: String,
    /// Workers per node, by node rank; node `i`'s ranks follow node `i - 1`'s.
    pub node_sizes: Vec<usize>,
}

impl WorkerPlace {
    /// Rank `rank` of `world` ranks that all sit on one node at `127.0.0.1` (for tests).
    pub fn single_node(rank: usize, world: usize) -> WorkerPlace {
        WorkerPlace {
            rank,
            world,
            local_rank: rank,
            node_rank: 0,
            node_addr: "127.0.0.1".into(),
            node_sizes: vec![world],
        }
    }

    /// The global ranks of node `node`, in order (empty for a node that does not exist).
    pub fn node_ranks(&self, node: usize) -> std::ops::Range<usize> {
        let start: usize = self.node_sizes.iter().take(node).sum();
        start..start + self.node_sizes.get(node).copied().unwrap_or(0)
    }

    /// The node rank of global rank `rank`.
    pub fn node_of(&self, rank: usize) -> Option<usize> {
        (0..self.node_sizes.len()).find(|&n| self.node_ranks(n).contains(&rank))
    }
}

/// One device's compute and communication, as the checks use them.
///
/// Timing contract: every duration returned is measured on the device's own clock (CUDA events
/// on GPU) after the work is complete, never by a host timer around an asynchronous launch.
pub trait Backend {
    fn kind(&self) -> DeviceKind;
    /// The device model, e.g. `NVIDIA H200` or the CPU's model name.
    fn device_name(&self) -> String;

    // ---- GEMM ----
    /// Element type of GEMM inputs and output.
    fn gemm_dtype(&self) -> Dtype;
    /// Loads row-major `n x n` matrices A and B (values already rounded to `gemm_dtype`) and
    /// allocates C.
    fn gemm_load(&mut self, n: usize, a: &[f32], b: &[f32]) -> Result<(), BackendError>;
    /// Runs `iters` products C = A B; returns the seconds of each, timed on the device.
    fn gemm_run(&mut self, iters: usize) -> Result<Vec<f64>, BackendError>;
    /// C, row-major, raw little-endian bytes of `gemm_dtype`.
    fn gemm_output(&mut self) -> Result<Vec<u8>, BackendError>;
    /// Frees the GEMM buffers.
    fn gemm_free(&mut self);

    // ---- all-reduce (sum) over all ranks ----
    /// Element type of collective buffers.
    fn coll_dtype(&self) -> Dtype;
    /// Allocates send and receive buffers of `max_elems` and fills the send buffer with
    /// element `i` = `period[i % period.len()]`.
    fn all_reduce_prepare(&mut self, max_elems: usize, period: &[u8]) -> Result<(), BackendError>;
    /// Fills the receive buffer with NaN (so stale data cannot pass verification), then runs
    /// `warmup` untimed and `iters` timed out-of-place sum all-reduces of the first `elems`
    /// elements; returns the mean seconds of one timed call.
    fn all_reduce_run(&mut self, elems: usize, warmup: usize, iters: usize) -> Result<f64, BackendError>;
    /// The first `elems` elements of the receive buffer, raw little-endian bytes of `coll_dtype`.
    fn all_reduce_output(&mut self, elems: usize) -> Result<Vec<u8>, BackendError>;
    /// Frees the collective buffers.
    fn all_reduce_free(&mut self);
}

/// Which backend a worker opens.
pub fn open(
    kind: DeviceKind,
    place: &WorkerPlace,
    store: &mut StoreClient,
) -> Result<Box<dyn Backend>, BackendError> {
    match kind {
        DeviceKind::Cpu => Ok(Box::new(cpu::CpuBackend::new(place, store)?)),
        DeviceKind::Cuda => Ok(Box::new(cuda::CudaBackend::new(place, store)?)),
    }
}
