//! The models' [`Comm`] over the executor's transports: the TCP ring between CPU workers and
//! NCCL on the model's CUDA stream.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream};
use gpusanity_models::comm::{Comm, Solo};
use gpusanity_models::cpu::CpuOps;
use gpusanity_models::cuda::CudaOps;
use gpusanity_models::{ModelError, Result};

use super::ring_comm::RingComm;
use crate::backend::cpu::ring::Ring;
use crate::backend::cuda::nccl;
use crate::backend::WorkerPlace;
use crate::store::StoreClient;

/// A backend of the model layer that can join its ranks into groups.
pub trait Groups: gpusanity_models::ops::Ops {
    /// The group `members` (global ranks, this one among them); every member calls this with
    /// the same `key`, unique per group in the run.
    fn group(
        &mut self,
        place: &WorkerPlace,
        store: &mut StoreClient,
        key: &str,
        members: &[usize],
    ) -> Result<Box<dyn Comm<Self::Buf>>>;
}

fn comm_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Comm(e.to_string())
}

impl Groups for CpuOps {
    fn group(
        &mut self,
        place: &WorkerPlace,
        store: &mut StoreClient,
        key: &str,
        members: &[usize],
    ) -> Result<Box<dyn Comm<Vec<f32>>>> {
        if members.len() == 1 {
            return Ok(Box::new(Solo));
        }
        Ok(Box::new(RingComm::new(Ring::connect_group(place, store, key, members).map_err(comm_err)?)))
    }
}

/// NCCL on a stream of its own (`side`), so that a bucket started during the backward runs
/// beside it on the device. With buffer tracking off (gpusanity_cuda), the order is ours to
/// keep: before each collective the side stream waits for all the work the main stream has
/// issued (the gradients it sums are complete), and the main stream waits for the side stream
/// before it goes on past a plain all-reduce or reads a finished bucket.
struct NcclComm {
    comm: cudarc::nccl::Comm,
    main: Arc<CudaStream>,
    side: Arc<CudaStream>,
    rank: usize,
    size: usize,
    /// The ops' bf16 twins: an all-reduce writes its buffer outside the ops.
    twins: gpusanity_models::cuda::twins::Twins,
}

fn nccl_err(what: &str, e: cudarc::nccl::result::NcclError) -> ModelError {
    ModelError::Comm(format!("{what}: {:?}", e.0))
}

fn stream_err(what: &str, e: cudarc::driver::DriverError) -> ModelError {
    ModelError::Device(format!("{what}: {e:?}"))
}

impl NcclComm {
    /// The side stream waits for the main stream's work so far.
    fn side_after_main(&self) -> Result<()> {
        self.side.join(&self.main).map_err(|e| stream_err("ordering the NCCL stream after the main one", e))
    }
    /// The main stream waits for the side stream's work so far.
    fn main_after_side(&self) -> Result<()> {
        self.main.join(&self.side).map_err(|e| stream_err("ordering the main stream after the NCCL one", e))
    }
    /// Issues the all-reduce of `buf` on the side stream.
    fn issue(&mut self, buf: &mut CudaSlice<f32>) -> Result<()> {
        self.twins.wrote(buf);
        self.comm
            .all_reduce_in_place(buf, &cudarc::nccl::ReduceOp::Sum)
            .map(|_| ())
            .map_err(|e| ModelError::Comm(format!("ncclAllReduce of {} f32: {:?}", buf.len(), e.0)))
    }
    /// Issues the bucket's all-reduces as one NCCL group, which NCCL launches together. The
    /// group is closed whatever happens inside it (an open group would swallow every later
    /// collective).
    fn issue_group(&mut self, bufs: &mut [&mut CudaSlice<f32>]) -> Result<()> {
        use cudarc::nccl::result::{group_end, group_start};
        group_start().map_err(|e| nccl_err("ncclGroupStart", e))?;
        let mut first_error = None;
        for b in bufs.iter_mut() {
            if let Err(e) = self.issue(b) {
                first_error = Some(e);
                break;
            }
        }
        let ended = group_end().map_err(|e| nccl_err("ncclGroupEnd", e));
        match first_error {
            Some(e) => Err(e),
            None => ended.map(|_| ()),
        }
    }
}

impl Comm<CudaSlice<f32>> for NcclComm {
    fn size(&self) -> usize {
        self.size
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_reduce_sum(&mut self, buf: &mut CudaSlice<f32>) -> Result<()> {
        self.side_after_main()?;
        self.issue(buf)?;
        self.main_after_side()
    }
    fn all_reduce_sum_bucket(&mut self, bufs: &mut [&mut CudaSlice<f32>]) -> Result<()> {
        self.start_bucket(bufs)?;
        self.finish_bucket(bufs)
    }
    fn start_bucket(&mut self, bufs: &mut [&mut CudaSlice<f32>]) -> Result<()> {
        self.side_after_main()?;
        self.issue_group(bufs)
    }
    /// The main stream waits for every bucket started so far (they finish in order).
    fn finish_bucket(&mut self, _bufs: &mut [&mut CudaSlice<f32>]) -> Result<()> {
        self.main_after_side()
    }
}

impl Groups for CudaOps {
    fn group(
        &mut self,
        place: &WorkerPlace,
        store: &mut StoreClient,
        key: &str,
        members: &[usize],
    ) -> Result<Box<dyn Comm<CudaSlice<f32>>>> {
        if members.len() == 1 {
            return Ok(Box::new(Solo));
        }
        let main = self.stream().clone();
        let side = main.fork().map_err(|e| stream_err("creating the NCCL stream", e))?;
        let comm = nccl::connect_group(&side, place, store, key, members).map_err(comm_err)?;
        let rank = members.iter().position(|r| *r == place.rank).unwrap_or(0);
        Ok(Box::new(NcclComm { comm, main, side, rank, size: members.len(), twins: self.twins().clone() }))
    }
}
