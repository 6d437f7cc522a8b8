//! Products with fused epilogues on cuBLASLt: the bias and GELU applied by the
//! product's own kernel as it stores its tile, so that the layer's output is written once, in
//! bf16, instead of written in f32 and then read and rewritten by an elementwise pass.
//!
//! Every product here reads bf16 operands, accumulates in f32 and writes a bf16 result (the
//! twin of its output buffer, see [`super::twins`]): the epilogues the GPT's MLP and QKV
//! projection need. The bias and its gradient are f32 where this cuBLASLt takes them so with
//! bf16 results, else bf16 (probed once). A plan (the
//! descriptors and the algorithm cuBLASLt's heuristic picked) is made once per shape and kept;
//! the operand addresses are set on it at each call, so a call records into a CUDA graph as it
//! runs.

use std::collections::HashMap;
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Arc;

use cudarc::cublaslt::{result as lt, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut};

use super::dev;
use crate::ops::Mm;
use crate::{ModelError, Result};

use sys::cublasLtMatmulDescAttributes_t as Attr;
use sys::cudaDataType_t::{CUDA_R_16BF, CUDA_R_32F};

/// The workspace cuBLASLt may use per product (its Hopper kernels ask for up to 32 MiB).
const WORKSPACE: usize = 32 << 20;

/// What a product's kernel does to its result before storing it (row-major terms: the bias
/// has one value per column of the result).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub(super) enum Epilogue {
    /// `D = A B + bias`.
    Bias,
    /// `D = GELU(A B + bias)` and `aux = A B + bias` (kept for the backward).
    GeluAuxBias,
    /// `D = A B` (a product whose bf16 result only products and kernels reading bf16 take).
    /// cuBLASLt's own GELU-gradient epilogue with the bias gradient (`DGELU_BGRAD`) ran as a
    /// separate kernel of 580 µs per call at megatron-gpt's MLP on an H200, 2.7 times the
    /// separate passes: the GELU's backward reads this bf16 result instead
    /// (`CudaOps::fused_dgelu`).
    Plain,
    /// `D = A B + bias + C` with C and D f32 (a projection's bias and the residual added by
    /// the product that writes the residual stream; the bias f32).
    BiasResidual,
}

impl Epilogue {
    fn raw(self) -> sys::cublasLtEpilogue_t {
        match self {
            Epilogue::Bias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Epilogue::GeluAuxBias => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
            Epilogue::Plain => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_DEFAULT,
            Epilogue::BiasResidual => sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
        }
    }
    /// Whether C and D are f32 (else bf16) and C is added (beta 1).
    pub(super) fn f32_out(self) -> bool {
        self == Epilogue::BiasResidual
    }
    pub(super) fn has_aux(self) -> bool {
        self == Epilogue::GeluAuxBias
    }
    pub(super) fn has_bias(self) -> bool {
        self != Epilogue::Plain
    }
}

/// The device addresses of one call's buffers: A and B (bf16, row-major as in [`Mm`]), D
/// (bf16, the result; f32 for [`Epilogue::BiasResidual`], which adds C, f32, else 0), the bias (f32 or bf16, [`Lt::bias_bf16`]; 0 for [`Epilogue::Plain`])
/// and, for [`Epilogue::GeluAuxBias`], aux (bf16, D's shape; else 0).
#[derive(Clone, Copy, Debug)]
pub(super) struct Ptrs {
    pub a: u64,
    pub b: u64,
    pub c: u64,
    pub d: u64,
    pub bias: u64,
    pub aux: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
struct Key {
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    lda: usize,
    ldb: usize,
    ldc: usize,
    epi: Epilogue,
}

/// One shape's descriptors and algorithm.
struct Plan {
    desc: sys::cublasLtMatmulDesc_t,
    /// cuBLASLt's A, B and D (C is D) in its column-major terms.
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: the descriptors were created by this plan and are destroyed once, here; no
        // call uses them after (plans are dropped with the Lt, after its stream's work was
        // queued, and cuBLASLt copies what a queued kernel needs).
        unsafe {
            for l in self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
            let _ = lt::destroy_matmul_desc(self.desc);
        }
    }
}

/// A cuBLASLt handle with its workspace and plans.
pub(super) struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: HashMap<Key, Plan>,
    /// The bias type this cuBLASLt takes with bf16 results (probed: f32 where it can).
    bias_bf16: bool,
}

// SAFETY: the handle and descriptors are plain cuBLASLt objects owned by this value; they are
// used only through `&mut self` (never from two threads at once), which is what cuBLASLt
// requires of a handle shared between threads.
unsafe impl Send for Lt {}

impl Drop for Lt {
    fn drop(&mut self) {
        self.plans.clear();
        // SAFETY: the handle was created by `Lt::new` and is destroyed once, after its plans.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

fn blas_err(what: &str, e: lt::CublasError) -> ModelError {
    dev(what, e)
}

/// Sets a descriptor attribute to `v`.
///
/// SAFETY (of the callers' blocks): `desc` is a live descriptor and `T` is the attribute's
/// documented type (i32 enums, u64 addresses and sizes, i64 leading dimensions).
unsafe fn set<T>(desc: sys::cublasLtMatmulDesc_t, attr: Attr, v: &T) -> Result<()> {
    lt::set_matmul_desc_attribute(desc, attr, v as *const T as *const c_void, size_of::<T>())
        .map_err(|e| blas_err(&format!("cublasLtMatmulDescSetAttribute {attr:?}"), e))
}

impl Lt {
    /// A handle and its workspace, and a probe of the epilogues at a small shape with
    /// the bias in f32, else in bf16: an error (the reasons) where this device's cuBLASLt
    /// takes neither, so the caller falls back to separate products and passes.
    pub(super) fn new(stream: &Arc<CudaStream>) -> std::result::Result<Lt, String> {
        let handle = lt::create_handle().map_err(|e| format!("cublasLtCreate: {e:?}"))?;
        let workspace = stream.alloc_zeros::<u8>(WORKSPACE);
        let mut me = match workspace {
            Ok(workspace) => Lt { handle, workspace, plans: HashMap::new(), bias_bf16: false },
            Err(e) => {
                // SAFETY: created just above, destroyed once.
                unsafe {
                    let _ = lt::destroy_handle(handle);
                }
                return Err(format!("allocating the cuBLASLt workspace: {e:?}"));
            }
        };
        let (m, n, k) = (256, 512, 256);
        let mut probe = stream.alloc_zeros::<u16>(2 * (m * k + k * n + 2 * m * n + n)).map_err(|e| format!("{e:?}"))?;
        let mut why = Vec::new();
        for bf16 in [false, true] {
            me.bias_bf16 = bf16;
            me.plans.clear();
            let at = probe.device_ptr_mut(stream).0;
            let p = Ptrs {
                a: at,
                c: at + 2 * (m * k + k * n) as u64,
                b: at + 2 * (m * k) as u64,
                d: at + 2 * (m * k + k * n) as u64,
                aux: at + 2 * (m * k + k * n + m * n) as u64,
                bias: at + 2 * (m * k + k * n + 2 * m * n) as u64,
            };
            let tried: Result<()> = [
                (Mm::new(m, n, k), Epilogue::Bias),
                (Mm::new(m, n, k), Epilogue::GeluAuxBias),
                (Mm::new(m, n, k).tb(), Epilogue::Plain),
                (Mm::new(m, n, k), Epilogue::BiasResidual),
            ]
            .into_iter()
            .try_for_each(|(mm, epi)| me.plan(&mm, epi, &p).map(|_| ()));
            match tried {
                Ok(()) => {
                    me.plans.clear();
                    return Ok(me);
                }
                Err(e) => why.push(format!("bias in {}: {e}", if bf16 { "bf16" } else { "f32" })),
            }
        }
        Err(why.join("; "))
    }

    /// Whether the bias (and the bias gradient) is bf16, else f32.
    pub(super) fn bias_bf16(&self) -> bool {
        self.bias_bf16
    }

    /// Whether `mm` is a product these epilogues take: one matrix, no offsets, `C = A B`.
    pub(super) fn fits(mm: &Mm) -> bool {
        mm.batch == 1
            && (mm.off_a, mm.off_b, mm.off_c) == (0, 0, 0)
            && mm.alpha == 1.0
            && mm.beta == 0.0
            && mm.rows_fit()
            // cuBLASLt's epilogue vectors and aux rows want lengths in whole 16-byte units.
            && mm.n % 8 == 0
    }

    /// Makes `mm`'s plan for `epi` unless it is kept already (the heuristic sees the call's
    /// addresses, `p`); its key.
    fn plan(&mut self, mm: &Mm, epi: Epilogue, p: &Ptrs) -> Result<Key> {
        let key = Key { m: mm.m, n: mm.n, k: mm.k, ta: mm.ta, tb: mm.tb, lda: mm.lda, ldb: mm.ldb, ldc: mm.ldc, epi };
        if !self.plans.contains_key(&key) {
            let plan = self.make_plan(mm, epi, p)?;
            self.plans.insert(key, plan);
        }
        Ok(key)
    }

    fn make_plan(&self, mm: &Mm, epi: Epilogue, p: &Ptrs) -> Result<Plan> {
        use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
        let what = |s: &str| format!("{s} for {epi:?} {mm:?}");
        let u = |x: usize| x as u64;
        let i = |x: usize| x as i64;
        // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLASLt's A is our
        // B, its B our A, its m our n. A stored matrix's layout is described before its op.
        let (op_a, op_b) =
            (if mm.tb { CUBLAS_OP_T } else { CUBLAS_OP_N }, if mm.ta { CUBLAS_OP_T } else { CUBLAS_OP_N });
        let (ra, ca) = if mm.tb { (mm.k, mm.n) } else { (mm.n, mm.k) };
        let (rb, cb) = if mm.ta { (mm.m, mm.k) } else { (mm.k, mm.m) };
        let desc = lt::create_matmul_desc(sys::cublasComputeType_t::CUBLAS_COMPUTE_32F, CUDA_R_32F)
            .map_err(|e| blas_err(&what("cublasLtMatmulDescCreate"), e))?;
        let mut plan =
            Plan { desc, layouts: [std::ptr::null_mut(); 3], algo: sys::cublasLtMatmulAlgo_t { data: [0; 8] } };
        for (slot, (r, c, ld)) in [(ra, ca, mm.ldb), (rb, cb, mm.lda), (mm.n, mm.m, mm.ldc)].into_iter().enumerate() {
            let ty = if slot == 2 && epi.f32_out() { CUDA_R_32F } else { CUDA_R_16BF };
            plan.layouts[slot] = lt::create_matrix_layout(ty, u(r), u(c), i(ld))
                .map_err(|e| blas_err(&what("cublasLtMatrixLayoutCreate"), e))?;
        }
        let bias_type = if self.bias_bf16 && !epi.f32_out() { CUDA_R_16BF } else { CUDA_R_32F };
        // SAFETY: `desc` is live (created above, owned by `plan`); each value has its
        // attribute's type: cublasOperation_t and the data types are i32 enums,
        // cublasLtEpilogue_t a u32, the aux leading dimension an i64.
        unsafe {
            set(desc, Attr::CUBLASLT_MATMUL_DESC_TRANSA, &(op_a as i32))?;
            set(desc, Attr::CUBLASLT_MATMUL_DESC_TRANSB, &(op_b as i32))?;
            set(desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE, &(epi.raw() as u32))?;
            if epi.has_bias() {
                set(desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &(bias_type as i32))?;
            }
            if epi.has_aux() {
                set(desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &(CUDA_R_16BF as i32))?;
                set(desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &i(mm.n))?;
            }
            set_pointers(desc, epi, p)?;
        }
        let pref = lt::create_matmul_pref().map_err(|e| blas_err(&what("cublasLtMatmulPreferenceCreate"), e))?;
        // SAFETY: `pref` is live until destroyed below; the descriptors and layouts are live
        // (owned by `plan`).
        let found = unsafe {
            let r = set_pref(pref).and_then(|_| {
                lt::get_matmul_algo_heuristic(
                    self.handle,
                    desc,
                    plan.layouts[0],
                    plan.layouts[1],
                    plan.layouts[2],
                    plan.layouts[2],
                    pref,
                )
                .map_err(|e| blas_err(&what("cublasLtMatmulAlgoGetHeuristic"), e))
            });
            let _ = lt::destroy_matmul_pref(pref);
            r
        }?;
        plan.algo = found.algo;
        Ok(plan)
    }

    /// Queues `D = epilogue(A B)` on `stream` for `mm` (which [`Lt::fits`]), at the addresses
    /// of `p`. The caller vouches for the buffers: A, B, D and aux holding `mm`'s extents in
    /// the types [`Ptrs`] names, the bias of `mm.n` in the type [`Lt::bias_bf16`] says, all
    /// alive until the stream has run the call.
    pub(super) fn matmul(&mut self, stream: &CudaStream, mm: &Mm, epi: Epilogue, p: Ptrs) -> Result<()> {
        if !Self::fits(mm) {
            return Err(ModelError::Config(format!("cuBLASLt epilogue {epi:?}: unsupported product {mm:?}")));
        }
        let handle = self.handle;
        let key = self.plan(mm, epi, &p)?;
        let plan = self.plans.get(&key).ok_or_else(|| ModelError::Device("cuBLASLt plan missing".into()))?;
        let (ws, _guard) = self.workspace.device_ptr_mut(stream);
        let ws = ws as *mut c_void;
        let (alpha, beta) = (1.0f32, if epi.f32_out() { 1.0f32 } else { 0.0 });
        // SAFETY: the plan's descriptors are live; the addresses are the caller's, vouched
        // for as above; alpha and beta are host f32 values alive for the call (the default
        // host pointer mode, f32 scale type); the workspace holds WORKSPACE bytes, which the
        // heuristic was told; the stream is the one the buffers live on.
        unsafe {
            set_pointers(plan.desc, epi, &p)?;
            lt::matmul(
                handle,
                plan.desc,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                p.b as *const c_void,
                plan.layouts[0],
                p.a as *const c_void,
                plan.layouts[1],
                if epi.f32_out() { p.c } else { p.d } as *const c_void,
                plan.layouts[2],
                p.d as *mut c_void,
                plan.layouts[2],
                &plan.algo,
                ws,
                WORKSPACE,
                stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| blas_err(&format!("cublasLtMatmul {epi:?} {mm:?}"), e))
    }
}

/// Sets the call's bias and aux addresses on `desc`.
///
/// SAFETY: `desc` is a live descriptor; the addresses are u64 device pointers (void*).
unsafe fn set_pointers(desc: sys::cublasLtMatmulDesc_t, epi: Epilogue, p: &Ptrs) -> Result<()> {
    if epi.has_bias() {
        set(desc, Attr::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p.bias)?;
    }
    if epi.has_aux() {
        set(desc, Attr::CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &p.aux)?;
    }
    Ok(())
}

/// Tells the heuristic how much workspace there is.
///
/// SAFETY: `pref` is a live preference descriptor.
unsafe fn set_pref(pref: sys::cublasLtMatmulPreference_t) -> Result<()> {
    let ws = WORKSPACE as u64;
    lt::set_matmul_pref_attribute(
        pref,
        sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
        (&ws) as *const u64 as *const c_void,
        size_of::<u64>(),
    )
    .map_err(|e| blas_err("cublasLtMatmulPreferenceSetAttribute", e))
}
