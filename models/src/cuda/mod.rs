//! The CUDA backend of [`Ops`]: the main stream of the worker's one [`CudaDevice`] (shared with
//! the executor's backend: same context, stream and cuBLAS handle). Matrix products go through
//! cuBLAS (`cublasGemmStridedBatchedEx`): a product whose sides are all at least
//! [`BF16_MIN_SIDE`] runs on bf16 copies of its operands (made by a kernel just before it) with
//! fp32 accumulation and an fp32 result, the f32 tensors staying the master copy; thinner ones
//! run on the f32 tensors with `CUBLAS_COMPUTE_32F_FAST_16BF` (on an H200 cuBLAS picks TF32
//! kernels for those). The bf16 copies are kept and reused while their buffer is unchanged
//! ([`twins`]). The GPT's projections run with their bias, GELU or residual fused into
//! cuBLASLt epilogues (`lt.rs`, `fused.rs`), most of their results held in bf16 alone. The causal
//! attention is fused ([`attention`]: flash-style kernels on bf16
//! tensor cores). Every other op is a kernel of `kernels.cu`. Both are compiled at run time by
//! NVRTC (a library, so the node needs no compiler binary) for the device's own architecture.

mod args;
pub mod attention;
mod fused;
mod graphs;
mod grid;
mod launch;
mod lt;
#[cfg(test)]
mod tests;
pub mod twins;
mod vision;

use twins::{Twin, Twins};

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
    "to_bf16",
    "add2",
    "fill",
    "set1",
    "axpy",
    "add_bias",
    "add_bias_residual",
    "add_bias_gelu",
    "col_part",
    "col_finish",
    "embed_fwd",
    "embed_bwd_wte",
    "embed_bwd_wpe",
    "ln_fwd",
    "ln_bwd_dx",
    "ln_dgdb_part",
    "gelu_fwd",
    "gelu_bwd",
    "dgelu_h_part",
    "relu_fwd",
    "relu_bwd",
    "cross_entropy",
    "adamw",
    "im2col",
    "col2im",
    "bn_stats",
    "bn_apply",
    "bn_bwd_part",
    "bn_bwd_apply",
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
    compile(KERNELS, major, minor, "the model kernels")
}

/// `src` as PTX for compute capability `major.minor`, by NVRTC; `what` names it in errors.
fn compile(src: &str, major: i32, minor: i32, what: &str) -> Result<cudarc::nvrtc::Ptx> {
    // cudarc takes the architecture as &'static str: a few bytes leaked once per compilation.
    let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
    let opts = CompileOptions { arch: Some(arch), ..Default::default() };
    panic::catch_unwind(|| compile_ptx_with_opts(src, opts))
        .map_err(|p| ModelError::Device(format!("NVRTC: {}", panic_text(p.as_ref()))))?
        .map_err(|e| dev(&format!("NVRTC compiling {what}"), e))
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
    /// The partial sums of the two-pass reductions, grown on demand. Ops run in stream order,
    /// so one op's parts are consumed before the next op writes them.
    scratch: Option<CudaSlice<f32>>,
    /// The bf16 twins of the products' operands.
    twins: Twins,
    /// The fused attention's kernels for the head dimension in use, compiled on first use.
    attention: Option<attention::Kernels>,
    /// The recorded step graphs.
    graphs: graphs::Graphs,
    /// The products with fused epilogues; `None` where cuBLASLt lacks them (`lt_missing`
    /// says why), and the fused ops run as separate ones.
    lt: Option<lt::Lt>,
    lt_missing: Option<String>,
}

/// A product runs on bf16 copies of its operands when each of its sides is at least this
/// long: then it is bound by the tensor cores, and bf16 runs at twice TF32's rate, which pays
/// for the copies. Thinner products (the attention's, k or n of a head's 64) are bound by
/// memory, where the copies would cost more than they save: they stay on f32 (TF32 kernels).
pub const BF16_MIN_SIDE: usize = 256;

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
        let (lt, lt_missing) = match lt::Lt::new(device.stream()) {
            Ok(lt) => (Some(lt), None),
            Err(why) => (None, Some(why)),
        };
        Ok(CudaOps {
            lt,
            lt_missing,
            funcs,
            device,
            scratch: None,
            twins: Twins::default(),
            attention: None,
            graphs: Default::default(),
        })
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

    /// Runs `f` with the scratch buffer, grown to hold at least `n` floats: it is taken out of
    /// `self` so that `f` can launch kernels on it beside the op's buffers, and put back after.
    fn with_scratch(&mut self, n: usize, f: impl FnOnce(&mut Self, &mut CudaSlice<f32>) -> Result<()>) -> Result<()> {
        let mut part = match self.scratch.take() {
            Some(s) if s.len() >= n => s,
            old => {
                if let Err(e) = self.graphs.refuse("growing the scratch buffer") {
                    self.scratch = old;
                    return Err(e);
                }
                self.stream().alloc_zeros(n.max(1)).map_err(|e| dev(&format!("allocating {n} f32 of scratch"), e))?
            }
        };
        let done = f(self, &mut part);
        self.scratch = Some(part);
        done
    }

    fn func(&self, name: &str) -> Result<&CudaFunction> {
        self.funcs.get(name).ok_or_else(|| ModelError::Device(format!("kernel {name} not loaded")))
    }

    /// A new bf16 buffer of `n` elements for the twin of the buffer at `at`; while a step graph
    /// is recorded an error instead, with `old` (the twin taken out, too short) put back.
    fn alloc_twin(&mut self, at: u64, old: Option<Twin>, n: usize) -> Result<CudaSlice<u16>> {
        if let Err(e) = self.graphs.refuse("a new bf16 twin") {
            if let Some(t) = old {
                self.twins.put(at, t);
            }
            return Err(e);
        }
        let n = n.max(1);
        self.stream().alloc_zeros(n).map_err(|e| dev(&format!("allocating {n} bf16"), e))
    }

    /// The twin of the f32 buffer at `at` (of `len` elements) for a kernel to write, taken out
    /// of the twins (the caller puts it back): the one held if it is long enough, else a new
    /// one; its value is not yet valid.
    fn twin_for(&mut self, at: u64, len: usize) -> Result<Twin> {
        match self.twins.take(at) {
            Some(t) if t.half.len() >= len => Ok(t),
            other => Ok(Twin::empty(self.alloc_twin(at, other, len)?)),
        }
    }

    /// The valid bf16 twin of `x`, made or brought up to date now (taken out of the twins:
    /// the caller puts it back).
    fn twin_of(&mut self, x: &CudaSlice<f32>) -> Result<Twin> {
        let at = twins::address(x);
        match self.twins.take(at) {
            Some(t) if t.valid && t.half.len() >= x.len() => Ok(t),
            Some(mut t) if t.half.len() >= x.len() => {
                self.convert(x, &mut t.half)?;
                t.valid = true;
                Ok(t)
            }
            other => {
                let mut half = self.alloc_twin(at, other, x.len())?;
                self.convert(x, &mut half)?;
                Ok(Twin { half, valid: true, only: false })
            }
        }
    }

    /// Runs `f` with the bf16 twin of the f32 buffer at `at` (of `len` elements) for a kernel
    /// that writes the buffer and its twin together (rounded as `to_bf16` rounds), so that no
    /// product converts it again: the twin is made where there is none, and valid once `f`
    /// succeeded.
    fn with_twin_out(
        &mut self,
        at: u64,
        len: usize,
        f: impl FnOnce(&mut Self, &mut CudaSlice<u16>) -> Result<()>,
    ) -> Result<()> {
        let mut t = self.twin_for(at, len)?;
        let done = f(self, &mut t.half);
        t.valid = done.is_ok();
        self.twins.put(at, t);
        done
    }

    /// The handle through which writers outside the ops mark a buffer's twin stale.
    pub fn twins(&self) -> &Twins {
        &self.twins
    }

    /// The batched product on cuBLAS. Row-major C = op(A) op(B) is column-major
    /// C^T = op(B)^T op(A)^T: B goes first. Products whose sides are all at least
    /// [`BF16_MIN_SIDE`] run on bf16 copies of A and B (fp32 accumulation and output); the
    /// others on the f32 tensors (cuBLAS picks TF32 kernels).
    fn gemm(
        &mut self,
        mm: crate::ops::Mm,
        a: &CudaSlice<f32>,
        b: &CudaSlice<f32>,
        c: &mut CudaSlice<f32>,
    ) -> Result<()> {
        let (ea, eb, ec) = mm.extents();
        if !mm.rows_fit() || a.len() < ea || b.len() < eb || c.len() < ec {
            return Err(ModelError::Config(format!("matmul {mm:?}: buffers of {}, {}, {}", a.len(), b.len(), c.len())));
        }
        if mm.m.min(mm.n).min(mm.k) >= BF16_MIN_SIDE {
            let (pa, pb) = (twins::address(a), twins::address(b));
            let ha = self.twin_of(a)?;
            if pa == pb {
                let done = self.gemm_raw(mm, &ha.half, &ha.half, c, true);
                self.twins.put(pa, ha);
                return done;
            }
            let hb = match self.twin_of(b) {
                Ok(hb) => hb,
                Err(e) => {
                    self.twins.put(pa, ha);
                    return Err(e);
                }
            };
            let done = self.gemm_raw(mm, &ha.half, &hb.half, c, true);
            self.twins.put(pa, ha);
            self.twins.put(pb, hb);
            return done;
        }
        // The f32 path reads the buffers themselves: refused where one is held only in bf16.
        self.twins.readable(a)?;
        self.twins.readable(b)?;
        self.gemm_raw(mm, a, b, c, false)
    }

    /// [`CudaOps::gemm`] on operands of `T` (f32, or bf16 as u16 when `bf16`), sizes checked.
    fn gemm_raw<T>(
        &mut self,
        mm: crate::ops::Mm,
        a: &CudaSlice<T>,
        b: &CudaSlice<T>,
        c: &mut CudaSlice<f32>,
        bf16: bool,
    ) -> Result<()> {
        use blas_sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        use blas_sys::cudaDataType_t::{CUDA_R_16BF, CUDA_R_32F};
        let i = args::int;
        let (m, n, k) = (i(mm.m)?, i(mm.n)?, i(mm.k)?);
        let (op_b, ldb) = (if mm.tb { CUBLAS_OP_T } else { CUBLAS_OP_N }, i(mm.ldb)?);
        let (op_a, lda) = (if mm.ta { CUBLAS_OP_T } else { CUBLAS_OP_N }, i(mm.lda)?);
        let ldc = i(mm.ldc)?;
        // The operands' element size: 2 for bf16, 4 for f32 (C is always f32).
        let size = if bf16 { 2 } else { 4 };
        let (alpha, beta) = (mm.alpha, mm.beta);
        let (ab_type, compute) = if bf16 {
            (CUDA_R_16BF, blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F)
        } else {
            (CUDA_R_32F, blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_16BF)
        };
        let stream = self.device.stream().clone();
        let (pa, _ra) = a.device_ptr(&stream);
        let (pb, _rb) = b.device_ptr(&stream);
        let (pc, _rc) = c.device_ptr_mut(&stream);
        let (pa, pb, pc) = (pa + (mm.off_a * size) as u64, pb + (mm.off_b * size) as u64, pc + (mm.off_c * 4) as u64);
        // SAFETY: the extents and row checks of `gemm` keep every batch's operands, from their
        // offsets on, inside a, b and c (the bf16 copies hold the same element counts;
        // `ab_type` names their type); the leading dimensions and strides describe exactly
        // those row-major matrices (row-major C = A B is column-major C^T = B^T A^T with the
        // same leading dimensions); alpha and beta are host f32 values alive for the call
        // (cuBLAS's default host pointer mode); the handle runs on the device's stream, where
        // the buffers live.
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
                ab_type,
                ldb,
                mm.stride_b as i64,
                pa as *const _,
                ab_type,
                lda,
                mm.stride_a as i64,
                (&beta) as *const f32 as *const _,
                pc as *mut _,
                CUDA_R_32F,
                ldc,
                mm.stride_c as i64,
                i(mm.batch)?,
                compute,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| dev(&format!("cublasGemmStridedBatchedEx {mm:?}"), e))
    }
}
