//! CUDA backend: cudarc with dynamic loading. One worker process drives one GPU through one
//! non-blocking stream: cuBLAS bf16 GEMM timed with CUDA events, and NCCL sum all-reduce over
//! all ranks.
//!
//! Nothing CUDA is linked at build time: libcuda, libcublas and libnccl are opened at run time
//! (see `docs/cuda.md`). [`probe`] and [`check_libraries`] look for them first, so a machine
//! without them gets an error message rather than cudarc's panic.
//!
//! - `probe`: library and device discovery, panic-free.
//! - `gemm`: cuBLAS GEMM and its timing.
//! - `nccl`: communicator set-up through the rendezvous store, all-reduce and its timing.

mod gemm;
pub mod nccl;
mod probe;
#[cfg(test)]
mod tests;

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas::{result::CublasError, CudaBlas};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use cudarc::nccl::Comm;
use gpusanity_common::report::DeviceKind;
use half::bf16;

use super::{Backend, BackendError, Dtype, WorkerPlace};
use crate::store::StoreClient;

pub use probe::{check_libraries, probe};

/// A driver error as a [`BackendError::Device`] naming the failed step.
fn dev_err(what: &str, e: &DriverError) -> BackendError {
    BackendError::Device(format!("{what}: {}", probe::driver_error(e)))
}

/// A cuBLAS error as a [`BackendError::Device`] naming the failed step.
fn blas_err(what: &str, e: &CublasError) -> BackendError {
    BackendError::Device(format!("{what}: {:?}", e.0))
}

/// bf16 values as their little-endian bytes.
fn bf16_bytes(v: &[bf16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 2);
    for x in v {
        out.extend_from_slice(&x.to_bits().to_le_bytes());
    }
    out
}

/// Runs `f`, turning a panic inside cudarc (a symbol missing after all, an `expect` on an
/// unexpected state) into an error. The default hook still prints it.
fn guarded<R>(what: &str, f: impl FnOnce() -> Result<R, BackendError>) -> Result<R, BackendError> {
    panic::catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(BackendError::Device(format!(
            "{what}: panicked: {}",
            probe::panic_message(p.as_ref())
        )))
    })
}

/// One GPU of one worker. Fields drop in order: buffers, communicator, cuBLAS, stream.
pub struct CudaBackend {
    gemm: Option<gemm::GemmBufs>,
    coll: Option<nccl::CollBufs>,
    comm: Comm,
    blas: CudaBlas,
    stream: Arc<CudaStream>,
    name: String,
}

impl CudaBackend {
    /// Opens device `place.local_rank`, its stream and cuBLAS handle, and the NCCL
    /// communicator of all ranks (rank 0 publishes the NCCL id under `nccl/world/id` in `store`).
    pub fn new(place: &WorkerPlace, store: &mut StoreClient) -> Result<Self, BackendError> {
        check_libraries().map_err(BackendError::Unavailable)?;
        guarded("opening the CUDA backend", || {
            let ordinal = place.local_rank;
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| dev_err(&format!("opening CUDA device {ordinal}"), &e))?;
            // SAFETY: with tracking off, cudarc stops recording an event on every buffer use;
            // it is then up to us to order uses across streams. There is one stream per
            // worker, every buffer is allocated, used and freed on it (so stream order is
            // enough), and each operation ends with an explicit synchronize. Called before
            // any buffer exists, as required.
            unsafe { ctx.disable_event_tracking() };
            let name = ctx.name().map_err(|e| dev_err("cuDeviceGetName", &e))?;
            let stream = ctx
                .new_stream()
                .map_err(|e| dev_err("cuStreamCreate", &e))?;
            let blas = CudaBlas::new(stream.clone()).map_err(|e| blas_err("cublasCreate", &e))?;
            let comm = nccl::connect(&stream, place, store)?;
            Ok(CudaBackend {
                gemm: None,
                coll: None,
                comm,
                blas,
                stream,
                name,
            })
        })
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Let queued work finish before the fields (buffers, comm, handle) are torn down.
        let _ = self.stream.synchronize();
    }
}

fn not_prepared(what: &str) -> BackendError {
    BackendError::Device(format!("{what} buffers are not prepared"))
}

impl Backend for CudaBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn gemm_dtype(&self) -> Dtype {
        Dtype::Bf16
    }

    fn gemm_load(&mut self, n: usize, a: &[f32], b: &[f32]) -> Result<(), BackendError> {
        self.gemm = None;
        self.gemm = Some(guarded("gemm_load", || gemm::load(&self.stream, n, a, b))?);
        Ok(())
    }

    fn gemm_run(&mut self, iters: usize) -> Result<Vec<f64>, BackendError> {
        let g = self.gemm.as_mut().ok_or_else(|| not_prepared("GEMM"))?;
        guarded("gemm_run", || gemm::run(&self.blas, &self.stream, g, iters))
    }

    fn gemm_output(&mut self) -> Result<Vec<u8>, BackendError> {
        let g = self.gemm.as_ref().ok_or_else(|| not_prepared("GEMM"))?;
        guarded("gemm_output", || gemm::output(&self.stream, g))
    }

    fn gemm_free(&mut self) {
        self.gemm = None;
    }

    fn coll_dtype(&self) -> Dtype {
        Dtype::Bf16
    }

    fn all_reduce_prepare(&mut self, max_elems: usize, period: &[u8]) -> Result<(), BackendError> {
        self.coll = None;
        self.coll = Some(guarded("all_reduce_prepare", || {
            nccl::prepare(&self.stream, max_elems, period)
        })?);
        Ok(())
    }

    fn all_reduce_run(
        &mut self,
        elems: usize,
        warmup: usize,
        iters: usize,
    ) -> Result<f64, BackendError> {
        let c = self
            .coll
            .as_mut()
            .ok_or_else(|| not_prepared("all-reduce"))?;
        guarded("all_reduce_run", || {
            nccl::run(&self.comm, &self.stream, c, elems, warmup, iters)
        })
    }

    fn all_reduce_output(&mut self, elems: usize) -> Result<Vec<u8>, BackendError> {
        let c = self
            .coll
            .as_ref()
            .ok_or_else(|| not_prepared("all-reduce"))?;
        guarded("all_reduce_output", || nccl::output(&self.stream, c, elems))
    }

    fn all_reduce_free(&mut self) {
        self.coll = None;
    }
}
