//! The CUDA backend of [`Ops`]: the main stream of the worker's one [`CudaDevice`] (shared with
//! the executor's backend: same context, stream and cuBLAS handle); matrix products through cuBLAS
//! (`cublasGemmStridedBatchedEx` on f32 tensors with `CUBLAS_COMPUTE_32F_FAST_16BF`, which
//! lets cuBLAS use any tensor-core precision at least as precise as bf16: on an H200 it runs
//! TF32 kernels (the kernel names in docs/benchmarks.md), fp32 accumulation, the f32 weights
//! staying the master copy); every
//! other op is a kernel of `kernels.cu`, compiled at run time by NVRTC (a library, so the node
//! needs no compiler binary) for the device's own architecture.

mod launch;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use gpusanity_cuda::{CudaDevice, CudaError};

use crate::{ModelError, Result};

const KERNELS: &str = include_str!("kernels.cu");
const NAMES: &[&str] = &[
    "fill",
    "set1",
    "axpy",
    "add_bias",
    "col_sum",
    "embed_fwd",
    "embed_bwd",
    "ln_fwd",
    "ln_bwd_dx",
    "ln_bwd_dgdb",
    "gelu_fwd",
    "gelu_bwd",
    "relu_fwd",
    "relu_bwd",
    "heads",
    "softmax_causal_fwd",
    "softmax_causal_bwd",
    "cross_entropy",
    "adamw",
    "im2col",
    "col2im",
    "bn_fwd",
    "bn_bwd",
    "maxpool_fwd",
    "maxpool_bwd",
    "avgpool_fwd",
    "avgpool_bwd",
];

pub(crate) fn dev(what: &str, e: impl std::fmt::Debug) -> ModelError {
    ModelError::Device(format!("{what}: {e:?}"))
}

/// A message from a caught panic.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// The kernels as PTX for compute capability `major.minor`, by NVRTC.
pub fn compile_kernels(major: i32, minor: i32) -> Result<cudarc::nvrtc::Ptx> {
    // cudarc takes the architecture as &'static str: a few bytes leaked once per model check.
    let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
    let opts = CompileOptions { arch: Some(arch), ..Default::default() };
    panic::catch_unwind(|| compile_ptx_with_opts(KERNELS, opts))
        .map_err(|p| ModelError::Device(format!("NVRTC: {}", panic_text(p.as_ref()))))?
        .map_err(|e| dev("NVRTC compiling the model kernels", e))
}

impl From<CudaError> for ModelError {
    fn from(e: CudaError) -> ModelError {
        ModelError::Device(e.to_string())
    }
}

pub struct CudaOps {
    funcs: HashMap<&'static str, CudaFunction>,
    /// Its stream runs every op; its cuBLAS handle every product.
    device: Arc<CudaDevice>,
}

impl CudaOps {
    /// The ops on `device` (the one the worker's backend opened): the kernels compiled for its
    /// architecture and loaded into its context. A missing library (NVRTC) is an error, not a
    /// panic.
    pub fn new(device: Arc<CudaDevice>) -> Result<CudaOps> {
        let what = format!("loading the model kernels on CUDA device {}", device.ordinal());
        panic::catch_unwind(AssertUnwindSafe(|| CudaOps::load(device)))
            .unwrap_or_else(|p| Err(ModelError::Device(format!("{what}: {}", panic_text(p.as_ref())))))
    }

    fn load(device: Arc<CudaDevice>) -> Result<CudaOps> {
        let (major, minor) = device.compute_capability()?;
        let ptx = compile_kernels(major, minor)?;
        let module = device.context().load_module(ptx).map_err(|e| dev("loading the model kernels", e))?;
        let mut funcs = HashMap::new();
        for n in NAMES {
            funcs.insert(*n, module.load_function(n).map_err(|e| dev(&format!("kernel {n}"), e))?);
        }
        Ok(CudaOps { funcs, device })
    }

    /// The stream every op runs on (NCCL groups of the model must use it too): the device's
    /// main stream.
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.device.stream()
    }

    /// The device the ops run on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    pub fn device_name(&self) -> &str {
        self.device.name()
    }

    fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs.get(name).ok_or_else(|| ModelError::Device(format!("kernel {name} not loaded")))
    }

    /// The batched product on cuBLAS. Row-major C = op(A) op(B) is column-major
    /// C^T = op(B)^T op(A)^T: B goes first.
    fn gemm(
        &mut self,
        mm: crate::ops::Mm,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) -> Result<()> {
        use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let (ea, eb, ec) = mm.extents();
        if a.len() < ea || b.len() < eb || c.len() < ec {
            return Err(ModelError::Config(format!("matmul {mm:?}: buffers of {}, {}, {}", a.len(), b.len(), c.len())));
        }
        let i = launch::int;
        let (m, n, k) = (i(mm.m)?, i(mm.n)?, i(mm.k)?);
        let (op_b, ldb) = if mm.tb { (CUBLAS_OP_T, k) } else { (CUBLAS_OP_N, n) };
        let (op_a, lda) = if mm.ta { (CUBLAS_OP_T, m) } else { (CUBLAS_OP_N, k) };
        let (alpha, beta) = (mm.alpha, mm.beta);
        let stream = self.device.stream();
        let (pa, _ra) = a.device_ptr(stream);
        let (pb, _rb) = b.device_ptr(stream);
        let (pc, _rc) = c.device_ptr_mut(stream);
        // SAFETY: the extents check above keeps every batch's operands inside a, b and c; the
        // leading dimensions and strides describe exactly those row-major matrices; alpha and
        // beta are host f32 values alive for the call (cuBLAS's default host pointer mode);
        // the handle runs on the device's stream, where the buffers live.
        unsafe {
            blas::gemm_strided_batched_ex(
                *self.device.blas().handle(),
                op_b,
                op_a,
                n,
                m,
                k,
                (&alpha) as *const f32 as *const _,
                pb as *const _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                ldb,
                mm.stride_b as i64,
                pa as *const _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                lda,
                mm.stride_a as i64,
                (&beta) as *const f32 as *const _,
                pc as *mut _,
                blas_sys::cudaDataType_t::CUDA_R_32F,
                n,
                mm.stride_c as i64,
                i(mm.batch)?,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| dev(&format!("cublasGemmStridedBatchedEx {mm:?}"), e))
    }
}
