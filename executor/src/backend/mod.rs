//! Compute and communication backends. A worker owns one backend for its device; the checks are
//! written once over the [`DeviceBackend`] trait.
//!
//! - `cpu`: fp32 GEMM through the `gemm` crate; collectives between worker processes over TCP
//!   with NCCL's semantics (ring all-reduce, exact results).
//! - `cuda`: cudarc with dynamic loading: cuBLAS bf16 GEMM, CUDA events, NCCL, on the worker's
//!   one [`CudaDevice`] (context, stream, cuBLAS handle), which the model checks share.

pub mod cpu;
pub mod cuda;
pub mod mem;

use std::sync::Arc;

use gpusanity_common::bandwidth::Collective;
use gpusanity_common::report::DeviceKind;
use gpusanity_cuda::CudaDevice;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::store::{StoreClient, StoreError};
pub use mem::{CopyPath, HostDir, HostSide, Verified};

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
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("not applicable: {0}")]
    NotApplicable(String),
}

/// A communicator handle: [`GroupId::WORLD`] (every rank, made when the backend opens) or a
/// group made with [`DeviceBackend::group`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GroupId(pub(crate) usize);

impl GroupId {
    pub const WORLD: GroupId = GroupId(0);
}

/// A device buffer handle from [`DeviceBackend::buf_alloc`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BufId(pub(crate) usize);

/// A collective operation with NCCL's semantics over a group of `n` ranks. `elems` of a
/// [`CollCall`] is nccl-tests' "size" in elements: the buffer whose bytes enter the bandwidth
/// formulas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollOp {
    /// Sum of `send[..elems]` over the ranks into `recv[..elems]`.
    AllReduce,
    /// Rank `i`'s `send[..elems / n]` lands in `recv[i * elems / n..]` on every rank.
    AllGather,
    /// Rank `i`'s `recv[..elems / n]` is the sum over the ranks of block `i` of `send[..elems]`.
    ReduceScatter,
    /// Block `j` of `send[..elems]` (`elems / n` elements) lands in block `i` of rank `j`'s
    /// `recv`, for rank `i`.
    AllToAll,
    /// Sends `send[..elems]` to group rank `peer` and receives `elems` from it into `recv`.
    SendRecv { peer: usize },
}

impl CollOp {
    /// The nccl-tests bandwidth formula its figures are given by.
    pub fn collective(self) -> Collective {
        match self {
            CollOp::AllReduce => Collective::AllReduce,
            CollOp::AllGather => Collective::AllGather,
            CollOp::ReduceScatter => Collective::ReduceScatter,
            CollOp::AllToAll => Collective::AllToAll,
            CollOp::SendRecv { .. } => Collective::SendRecv,
        }
    }

    /// Whether a call splits its `elems` into one block per rank (a multiple of the group's
    /// size).
    pub fn splits(self) -> bool {
        match self {
            CollOp::AllGather | CollOp::ReduceScatter | CollOp::AllToAll => true,
            CollOp::AllReduce | CollOp::SendRecv { .. } => false,
        }
    }

    /// The elements a rank sends in a call of `elems` over `n` ranks: its own block for an
    /// all-gather.
    pub fn sent(self, elems: usize, n: usize) -> usize {
        match self {
            CollOp::AllGather => elems / n.max(1),
            CollOp::AllReduce | CollOp::ReduceScatter | CollOp::AllToAll | CollOp::SendRecv { .. } => elems,
        }
    }

    /// The elements a rank receives in a call of `elems` over `n` ranks: its block of the sum
    /// for a reduce-scatter.
    pub fn received(self, elems: usize, n: usize) -> usize {
        match self {
            CollOp::ReduceScatter => elems / n.max(1),
            CollOp::AllReduce | CollOp::AllGather | CollOp::AllToAll | CollOp::SendRecv { .. } => elems,
        }
    }
}

/// One collective call of a [`Work`] list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollCall {
    pub op: CollOp,
    pub group: GroupId,
    pub send: BufId,
    pub recv: BufId,
    pub elems: usize,
    /// Past this wait the run fails with [`BackendError::Timeout`] instead of waiting for the
    /// launcher to kill the worker (probes that must not hang). On CUDA a timed-out group is
    /// abandoned: its stream may still hold the stuck operation.
    pub timeout: Option<std::time::Duration>,
}

impl CollCall {
    pub fn new(op: CollOp, group: GroupId, send: BufId, recv: BufId, elems: usize) -> CollCall {
        CollCall { op, group, send, recv, elems, timeout: None }
    }
}

/// One item of [`DeviceBackend::run`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Work {
    Coll(CollCall),
    /// One product C = A B of the buffers of [`DeviceBackend::gemm_load`].
    Gemm,
}

/// What [`DeviceBackend::run`] measured: mean seconds per round.
#[derive(Debug, Clone, PartialEq)]
pub struct Timing {
    /// Per item, from the common start to the item's end, divided by the rounds.
    pub each: Vec<f64>,
    /// From the common start to the last item's end, divided by the rounds.
    pub total: f64,
}

/// Kernel launch figures, in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct LaunchTiming {
    /// Host time per launch of a batch of asynchronous launches of an empty kernel.
    pub launch_us: f64,
    /// Per launch followed by a synchronize (host round trip), median.
    pub round_trip_us: f64,
    /// Best launch + synchronize round trip.
    pub round_trip_best_us: f64,
}

/// Checks the calls of a [`Work`] list against the rules of [`DeviceBackend::run`]: distinct groups,
/// distinct receive buffers, no buffer both sent and received, at most one GEMM; `elems` a
/// multiple of the group size where the operation splits it.
pub(crate) fn check_work(
    work: &[Work],
    group_size: impl Fn(GroupId) -> Result<usize, BackendError>,
) -> Result<(), BackendError> {
    let bad = |m: String| Err(BackendError::Device(m));
    let calls: Vec<&CollCall> =
        work.iter().filter_map(|w| if let Work::Coll(c) = w { Some(c) } else { None }).collect();
    if work.iter().filter(|w| matches!(w, Work::Gemm)).count() > 1 {
        return bad("more than one GEMM in one run".into());
    }
    for (i, c) in calls.iter().enumerate() {
        let n = group_size(c.group)?;
        if c.send == c.recv {
            return bad(format!("{:?}: send and receive buffer are the same", c.op));
        }
        if calls[..i].iter().any(|d| d.group == c.group) {
            return bad(format!("two operations on group {} in one run", c.group.0));
        }
        if calls[..i].iter().any(|d| d.recv == c.recv) {
            return bad("two operations receive into one buffer".into());
        }
        if calls.iter().any(|d| d.recv == c.send) {
            return bad("a buffer is sent by one operation and received by another".into());
        }
        if c.op.splits() && c.elems % n != 0 {
            return bad(format!("{:?} of {} elements over {n} ranks: not a multiple", c.op, c.elems));
        }
        if let CollOp::SendRecv { peer } = c.op {
            if peer >= n {
                return bad(format!("send/recv peer {peer} outside a group of {n}"));
            }
        }
    }
    Ok(())
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

/// Where a worker sits in the job (in its [`WorkerSpec`](crate::protocol::WorkerSpec), at the
/// top level of the spec's JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
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
pub trait DeviceBackend {
    fn kind(&self) -> DeviceKind;
    /// The device model, e.g. `NVIDIA H200` or the CPU's model name.
    fn device_name(&self) -> String;
    /// The GPU this backend drives (context, main stream, cuBLAS handle), for other users in
    /// the worker (the model checks) to share instead of opening their own; `None` off CUDA.
    fn cuda_device(&self) -> Option<Arc<CudaDevice>> {
        None
    }

    /// Seconds of CPU time the calling thread has had so far, where the device's work runs on
    /// that thread (the CPU backend): a check reads it around its timed work and reports its
    /// rate per CPU-second beside the wall-clock one, which the diagnosis judges on CPU workers
    /// ([`gpusanity_common::peers::cpu_key`]). `None` where the device times its own work
    /// (CUDA events).
    fn thread_cpu_seconds(&self) -> Option<f64> {
        None
    }

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

    // ---- collectives: buffers by handle, groups, one timed entry point ----
    /// Element type of collective buffers.
    fn coll_dtype(&self) -> Dtype;
    /// Makes the communicator of the group `members` (global ranks; group rank = index in it),
    /// which must contain this rank. Every member calls this with the same `key`, unique per
    /// group in the run. On CUDA each group gets a stream of its own, so operations on
    /// different groups in one [`DeviceBackend::run`] proceed at the same time.
    fn group(&mut self, store: &mut StoreClient, key: &str, members: &[usize]) -> Result<GroupId, BackendError>;
    /// The number of ranks of `group`.
    fn group_size(&self, group: GroupId) -> Result<usize, BackendError>;
    /// Allocates a buffer of `elems` elements of `coll_dtype`, contents undefined.
    fn buf_alloc(&mut self, elems: usize) -> Result<BufId, BackendError>;
    /// Fills the whole buffer with element `i` = `period[i % period.len()]`.
    fn buf_fill(&mut self, buf: BufId, period: &[u8]) -> Result<(), BackendError>;
    /// Fills the first `elems` elements with NaN, so stale data cannot pass verification.
    fn buf_poison(&mut self, buf: BufId, elems: usize) -> Result<(), BackendError>;
    /// The first `elems` elements, raw little-endian bytes of `coll_dtype`.
    fn buf_read(&mut self, buf: BufId, elems: usize) -> Result<Vec<u8>, BackendError>;
    /// Frees a buffer (unknown handles are ignored).
    fn buf_free(&mut self, buf: BufId);
    /// Runs every item of `work` at the same time (each collective on its group's stream, GEMM
    /// on the device's main stream): `warmup` untimed rounds, then `iters` timed rounds, each
    /// round issuing every item once in the order given (the same on every rank). Returns,
    /// per item, the mean seconds per round from the common start to that item's end, and the
    /// same for the whole. Two items may not share a group or a receive buffer.
    fn run(&mut self, work: &[Work], warmup: usize, iters: usize) -> Result<Timing, BackendError>;

    // ---- kernel launch ----
    /// Launch latency of an empty kernel over `iters` launches; `NotApplicable` where the
    /// device has no kernels (CPU).
    fn kernel_launch(&mut self, iters: usize) -> Result<LaunchTiming, BackendError>;

    // ---- device memory: a copy of the backend's own ----
    /// Allocates a source and a destination of `bytes` each (a multiple of 16), fills the
    /// source with the pattern of [`mem::pattern_word`] with `seed` and the destination with
    /// zeros. `blocks_per_sm` sizes the copy kernel's grid (GPU).
    fn copy_load(&mut self, bytes: u64, seed: u32, blocks_per_sm: usize) -> Result<(), BackendError>;
    /// The copy paths this backend times, the one the bandwidth figure comes from first: a
    /// GPU's driver copy, then its own kernel; the CPU's memcpy alone.
    fn copy_paths(&self) -> &'static [CopyPath] {
        &[CopyPath::Kernel]
    }
    /// Copies the source into the destination `iters` times through `path`, back to back; the
    /// seconds of each copy, timed on the device.
    fn copy_run(&mut self, path: CopyPath, iters: usize) -> Result<Vec<f64>, BackendError>;
    /// Zeroes the destination, so that the next path's copy is verified on its own.
    fn copy_clear(&mut self) -> Result<(), BackendError>;
    /// Overwrites byte `offset` of the destination with `value` (fault injection).
    fn copy_poke(&mut self, offset: u64, value: u8) -> Result<(), BackendError>;
    /// Verifies the source and the destination against the pattern with `seed`, exactly,
    /// where they are (on the device for a GPU).
    fn copy_verify(&mut self, seed: u32) -> Result<Verified, BackendError>;
    /// Frees the copy's buffers.
    fn copy_free(&mut self);

    // ---- the host link: pinned host memory and device memory ----
    /// Allocates a pinned host buffer and a device buffer of `bytes` each (a multiple of 16);
    /// `NotApplicable` where there is no device link (CPU).
    fn host_load(&mut self, bytes: u64) -> Result<(), BackendError>;
    /// Fills one buffer with the pattern with `seed`, or with zeros for `None`.
    fn host_fill(&mut self, side: HostSide, seed: Option<u32>) -> Result<(), BackendError>;
    /// Copies the whole buffer in direction `dir` `iters` times, back to back; the seconds of
    /// each copy, timed on the device.
    fn host_copy(&mut self, dir: HostDir, iters: usize) -> Result<Vec<f64>, BackendError>;
    /// Verifies one buffer against the pattern with `seed`, exactly.
    fn host_verify(&mut self, side: HostSide, seed: u32) -> Result<Verified, BackendError>;
    /// Frees the host-link buffers.
    fn host_free(&mut self);
}

/// Which backend a worker opens.
pub fn open(
    kind: DeviceKind,
    place: &WorkerPlace,
    store: &mut StoreClient,
) -> Result<Box<dyn DeviceBackend>, BackendError> {
    match kind {
        DeviceKind::Cpu => Ok(Box::new(cpu::CpuBackend::new(place, store)?)),
        DeviceKind::Cuda => Ok(Box::new(cuda::CudaBackend::new(place, store)?)),
    }
}
