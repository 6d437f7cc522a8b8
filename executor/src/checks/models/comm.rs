//! The models' [`Comm`] over the executor's transports: the TCP ring between CPU workers and
//! NCCL on the model's CUDA stream.

use gpusanity_models::comm::{Comm, Solo};
use gpusanity_models::cpu::CpuOps;
use gpusanity_models::{ModelError, Result};

use crate::backend::cpu::ring::Ring;
use crate::backend::WorkerPlace;
use crate::store::StoreClient;

/// A backend of the model layer that can join its ranks into groups.
pub trait Groups: gpusanity_models::ops::Ops {
    /// The group `members` (global ranks, this one among them); every member calls this with
    /// the same `key`, unique per group in the run.
    fn group(&mut self, place: &WorkerPlace, store: &mut StoreClient, key: &str, members: &[usize]) -> Result<Box<dyn Comm<Self::Buf>>>;
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
    fn group(&mut self, place: &WorkerPlace, store: &mut StoreClient, key: &str, members: &[usize]) -> Result<Box<dyn Comm<Vec<f32>>>> {
        if members.len() == 1 {
            return Ok(Box::new(Solo));
        }
        Ok(Box::new(RingComm(Ring::connect_group(place, store, key, members).map_err(comm_err)?)))
    }
}

