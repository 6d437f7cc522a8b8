//! The one CUDA device of a worker process: its context, its main stream and the cuBLAS handle
//! on that stream, opened once and shared (through `Arc`) by the executor's CUDA backend and the
//! models' CUDA tensor ops, so that a worker has exactly one of each for its whole run.
//!
//! Nothing CUDA is linked at build time: cudarc opens libcuda and libcublas (and, for the
//! backend, libnccl and libnvrtc) at run time and panics when one is missing. [`probe`] and
//! [`check_libraries`] look for them first, so a machine without them gets an error message
//! rather than that panic, and [`CudaDevice::open`] turns any panic left into an error.
//!
//! What stays with the users: the NCCL communicators, GEMM timing and launch-latency kernel in
//! the executor's backend; the NVRTC kernels of the model ops in the models crate.

pub mod bundled;
mod probe;
#[cfg(test)]
mod tests;

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas::{result::CublasError, CudaBlas};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use thiserror::Error;

pub use probe::{check_libraries, driver_error, driver_present, panic_message, probe, probe_memory, probe_pci_bus_ids};

/// The CUDA generation of the bindings (cudarc's `cuda-13000`).
pub const CUDA_GENERATION: &str = "13.0";
/// The oldest NVIDIA driver branch that runs CUDA 13.0 and the libraries bundled with it.
pub const MIN_DRIVER_MAJOR: u32 = 580;

#[derive(Debug, Error)]
pub enum CudaError {
    /// A call of the driver API failed: `what` names the step.
    #[error("{what}: {}", driver_error(.err))]
    Driver { what: String, err: DriverError },
    /// A cuBLAS call failed.
    #[error("{what}: {:?}", .err.0)]
    Blas { what: String, err: CublasError },
    /// cudarc panicked (a library or symbol missing after all, an unexpected state).
    #[error("{what}: panicked: {message}")]
    Panicked { what: String, message: String },
}

impl CudaError {
    /// A driver error of step `what`.
    pub fn driver(what: impl Into<String>, err: DriverError) -> CudaError {
        CudaError::Driver { what: what.into(), err }
    }

    /// A cuBLAS error of step `what`.
    pub fn blas(what: impl Into<String>, err: CublasError) -> CudaError {
        CudaError::Blas { what: what.into(), err }
    }
}

/// Runs `f`, turning a panic inside cudarc into [`CudaError::Panicked`] for step `what`. The
/// default panic hook still prints it.
pub fn guarded<R>(what: &str, f: impl FnOnce() -> Result<R, CudaError>) -> Result<R, CudaError> {
    panic::catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(CudaError::Panicked { what: what.to_string(), message: panic_message(p.as_ref()) }))
}

/// One GPU, opened once per worker: the context, the main stream and cuBLAS on that stream.
///
/// Every user issues its work on [`CudaDevice::stream`] (the backend's extra NCCL streams are
/// made from [`CudaDevice::context`] and ordered against it explicitly) and its products through
/// [`CudaDevice::blas`]. Fields drop in order: cuBLAS, then the stream, then the context.
#[derive(Debug)]
pub struct CudaDevice {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
    ordinal: usize,
    name: String,
}

impl CudaDevice {
    /// Opens device `ordinal` (a worker's local rank): its context with cudarc's event tracking
    /// off, its name, one non-blocking stream and a cuBLAS handle on it. Call
    /// [`check_libraries`] first for a clear message when a library is missing; a panic of
    /// cudarc is an error here all the same.
    pub fn open(ordinal: usize) -> Result<Arc<CudaDevice>, CudaError> {
        guarded(&format!("opening CUDA device {ordinal}"), || {
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| CudaError::driver(format!("opening CUDA device {ordinal}"), e))?;
            // SAFETY: with tracking off, cudarc stops recording an event on every buffer use;
            // it is then up to the users to order uses across streams. The models allocate,
            // use and free every buffer on the main stream; their NCCL groups run on a stream
            // of their own that waits for the main stream before each collective, and the main
            // stream waits for it before it reads a sum (the executor's models/comm.rs). The backend allocates, fills and reads its buffers
            // on the main stream with a synchronize after each step; a run on group streams
            // starts after its inputs are complete (they were synchronized) and its streams
            // wait for an event of the main stream; it ends by waiting for every stream.
            // Called here, before any buffer of the context exists, as required.
            unsafe { ctx.disable_event_tracking() };
            let name = ctx.name().map_err(|e| CudaError::driver("cuDeviceGetName", e))?;
            let stream = ctx.new_stream().map_err(|e| CudaError::driver("cuStreamCreate", e))?;
            let blas = CudaBlas::new(stream.clone()).map_err(|e| CudaError::blas("cublasCreate", e))?;
            Ok(Arc::new(CudaDevice { blas, stream, ctx, ordinal, name }))
        })
    }

    /// The context (for modules, events and further streams).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The main stream: all work of the backend's GEMM and world communicator and of the
    /// models runs on it.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The cuBLAS handle, bound to [`CudaDevice::stream`].
    pub fn blas(&self) -> &CudaBlas {
        &self.blas
    }

    /// The device ordinal it was opened with.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device model, e.g. `NVIDIA H200`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> Result<(i32, i32), CudaError> {
        self.ctx.compute_capability().map_err(|e| CudaError::driver("compute capability", e))
    }
}
