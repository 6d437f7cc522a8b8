//! bf16 GEMM through cuBLAS (`cublasGemmEx`, bf16 in and out, fp32 accumulation), each
//! product timed with a pair of CUDA events.

use std::sync::Arc;

use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{sys::CUevent_flags, CudaSlice, CudaStream};
use half::bf16;

use super::{blas_err, dev_err, BackendError};

/// Row-major `n x n` A, B and C on the device.
pub(super) struct GemmBufs {
    n: usize,
    a: CudaSlice<bf16>,
    b: CudaSlice<bf16>,
    c: CudaSlice<bf16>,
}

/// Uploads A and B (row-major f32 holding bf16-representable values) and allocates C.
pub(super) fn load(stream: &Arc<CudaStream>, n: usize, a: &[f32], b: &[f32]) -> Result<GemmBufs, BackendError> {
    let len = n.checked_mul(n).filter(|_| i32::try_from(n).is_ok() && n > 0);
    let len = len.ok_or_else(|| BackendError::Device(format!("unsupported GEMM size {n}")))?;
    if a.len() != len || b.len() != len {
        return Err(BackendError::Device(format!(
            "gemm_load: expected {len} elements, got {} and {}",
            a.len(),
            b.len()
        )));
    }
    let upload = |x: &[f32], what: &str| {
        let host: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        stream.clone_htod(&host).map_err(|e| dev_err(&format!("uploading {what}"), &e))
    };
    let a = upload(a, "A")?;
    let b = upload(b, "B")?;
    let c = stream.alloc_zeros::<bf16>(len).map_err(|e| dev_err("allocating C", &e))?;
    stream.synchronize().map_err(|e| dev_err("GEMM load", &e))?;
    Ok(GemmBufs { n, a, b, c })
}

/// Issues one product C = A B on the handle's stream, without waiting.
pub(super) fn launch(blas: &CudaBlas, g: &mut GemmBufs) -> Result<(), BackendError> {
    // `load` checked that n fits an i32.
    let n = g.n as i32;
    // cuBLAS is column-major, where row-major X reads as X^T. C^T = B^T A^T, so passing B
    // first and A second, untransposed, writes C^T column-major: exactly C row-major.
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: n,
        n,
        k: n,
        alpha: bf16::ONE,
        lda: n,
        ldb: n,
        beta: bf16::ZERO,
        ldc: n,
    };
    // SAFETY: a, b and c are n*n bf16 buffers allocated on this stream (checked in `load`);
    // with m = n = k = n and every leading dimension n, cuBLAS reads and writes only inside
    // them, and c aliases neither a nor b.
    unsafe { blas.gemm(cfg, &g.b, &g.a, &mut g.c) }.map_err(|e| blas_err("cublasGemmEx (bf16)", &e))
}

/// Runs C = A B `iters` times on the handle's stream; returns the seconds of each product,
/// from the events recorded before and after it (back to back).
pub(super) fn run(
    blas: &CudaBlas,
    stream: &Arc<CudaStream>,
    g: &mut GemmBufs,
    iters: usize,
) -> Result<Vec<f64>, BackendError> {
    let ctx = stream.context();
    let event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| dev_err("cuEventCreate", &e));
    // One event before the first product and one after each: product i takes the time from
    // event i to event i + 1. Back to back, so time the GPU gives to another process between
    // two products (a co-runner, time-sliced) counts against this device, as it would against
    // a training job; a start event of its own per product would hide it.
    let events = (0..=iters).map(|_| event()).collect::<Result<Vec<_>, BackendError>>()?;
    let record = |e: &cudarc::driver::CudaEvent| e.record(stream).map_err(|e| dev_err("cuEventRecord", &e));
    if let Some(first) = events.first() {
        record(first)?;
    }
    for end in events.iter().skip(1) {
        launch(blas, g)?;
        record(end)?;
    }
    stream.synchronize().map_err(|e| dev_err("waiting for the GEMMs", &e))?;
    events
        .windows(2)
        .map(|w| w[0].elapsed_ms(&w[1]).map(|ms| f64::from(ms) / 1e3).map_err(|e| dev_err("cuEventElapsedTime", &e)))
        .collect()
}

/// C, row-major, as little-endian bf16 bytes.
pub(super) fn output(stream: &Arc<CudaStream>, g: &GemmBufs) -> Result<Vec<u8>, BackendError> {
    let host = stream.clone_dtoh(&g.c).map_err(|e| dev_err("downloading C", &e))?;
    stream.synchronize().map_err(|e| dev_err("downloading C", &e))?;
    Ok(super::bf16_bytes(&host))
}
