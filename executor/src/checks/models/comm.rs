//! The models' [`Comm`] over the executor's transports: the TCP ring between CPU workers and
//! NCCL on the model's CUDA stream.

use gpusanity_models::comm::{Comm, Solo};
use gpusanity_models::cpu::CpuOps;
use gpusanity_models::cuda::CudaOps;
use gpusanity_models::{ModelError, Result};

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

struct RingComm(Ring);

impl Comm<Vec<f32>> for RingComm {
    fn size(&self) -> usize {
        self.0.size()
    }
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn all_reduce_sum(&mut self, buf: &mut Vec<f32>) -> Result<()> {
        let send = buf.clone();
        self.0.all_reduce_sum(&send, buf).map_err(comm_err)
    }
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
        Ok(Box::new(RingComm(Ring::connect_group(place, store, key, members).map_err(comm_err)?)))
    }
}

struct NcclComm {
    comm: cudarc::nccl::Comm,
    rank: usize,
    size: usize,
    /// The ops' bf16 twins: an all-reduce writes its buffer outside the ops.
    twins: gpusanity_models::cuda::twins::Twins,
}

impl Comm<cudarc::driver::CudaSlice<f32>> for NcclComm {
    fn size(&self) -> usize {
        self.size
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_reduce_sum(&mut self, buf: &mut cudarc::driver::CudaSlice<f32>) -> Result<()> {
        self.twins.wrote(buf);
        self.comm
            .all_reduce_in_place(buf, &cudarc::nccl::ReduceOp::Sum)
            .map(|_| ())
            .map_err(|e| ModelError::Comm(format!("ncclAllReduce of {} f32: {:?}", buf.len(), e.0)))
    }
}

impl Groups for CudaOps {
    fn group(
        &mut self,
        place: &WorkerPlace,
        store: &mut StoreClient,
        key: &str,
        members: &[usize],
    ) -> Result<Box<dyn Comm<cudarc::driver::CudaSlice<f32>>>> {
        if members.len() == 1 {
            return Ok(Box::new(Solo));
        }
        let comm = nccl::connect_group(self.stream(), place, store, key, members).map_err(comm_err)?;
        let rank = members.iter().position(|r| *r == place.rank).unwrap_or(0);
        Ok(Box::new(NcclComm { comm, rank, size: members.len(), twins: self.twins().clone() }))
    }
}
