//! Kernel launch latency: an empty kernel written in PTX by hand (no compiler on the node; the
//! driver JIT-compiles it for the device once), launched through the driver API.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;

use super::dev_err;
use crate::backend::{BackendError, LaunchTiming};
use gpusanity_common::stats::median;

/// An entry point with no parameters that returns at once. PTX ISA 7.0 / sm_70: every driver
/// since CUDA 11 JIT-compiles it for newer devices.
const EMPTY_PTX: &str = "\
.version 7.0
.target sm_70
.address_size 64

.visible .entry gpusanity_empty()
{
\tret;
}
";

/// Loads the empty kernel into the stream's context.
pub(super) fn load(stream: &Arc<CudaStream>) -> Result<CudaFunction, BackendError> {
    let module = stream
        .context()
        .load_module(Ptx::from_src(EMPTY_PTX))
        .map_err(|e| dev_err("cuModuleLoadData (empty kernel PTX)", &e))?;
    module.load_function("gpusanity_empty").map_err(|e| dev_err("cuModuleGetFunction", &e))
}

/// One launch of the empty kernel: exactly one `cuLaunchKernel`, as a native loop does (the
/// context was made current once by the caller).
fn launch(stream: &Arc<CudaStream>, f: &CudaFunction) -> Result<(), BackendError> {
    // SAFETY: `f` is the parameterless empty kernel of a module loaded in this stream's
    // context; a kernel without parameters reads no parameter array; grid and block of one.
    unsafe {
        cudarc::driver::result::launch_kernel(f.cu_function(), (1, 1, 1), (1, 1, 1), 0, stream.cu_stream(), &mut [])
    }
    .map_err(|e| dev_err("cuLaunchKernel (empty kernel)", &e))
}

/// `iters` launches: a batch of asynchronous launches (host time per launch), then each launch
/// followed by a synchronize (round trip).
pub(super) fn measure(stream: &Arc<CudaStream>, f: &CudaFunction, iters: usize) -> Result<LaunchTiming, BackendError> {
    let iters = iters.max(1);
    stream.context().bind_to_thread().map_err(|e| dev_err("binding the CUDA context", &e))?;
    // SAFETY: the stream is alive (held by `stream`) and belongs to the current context.
    let sync = || {
        unsafe { cudarc::driver::result::stream::synchronize(stream.cu_stream()) }
            .map_err(|e| dev_err("cuStreamSynchronize after the empty kernel", &e))
    };
    for _ in 0..iters.min(100) {
        launch(stream, f)?;
    }
    sync()?;
    let t = Instant::now();
    for _ in 0..iters {
        launch(stream, f)?;
    }
    let launch_us = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    sync()?;
    let mut trips = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        launch(stream, f)?;
        sync()?;
        trips.push(t.elapsed().as_secs_f64() * 1e6);
    }
    Ok(LaunchTiming {
        launch_us,
        round_trip_us: median(&trips),
        round_trip_best_us: trips.iter().copied().fold(f64::INFINITY, f64::min),
    })
}
