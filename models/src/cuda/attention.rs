//! The fused causal attention on CUDA (`attention.cu`): flash-style kernels on bf16 tensor cores
//! (mma.sync), compiled by NVRTC for the head dimension in use the first time a model asks, and
//! kept for the next calls. The kernels read the bf16 twins of the QKV rows and of the output's
//! gradient ([`super::twins`]): QKV is converted once in the forward and its copy reused by the
//! backward.

use cudarc::driver::sys::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use super::args::int;
use super::{compile, dev, twins, CudaOps};
use crate::ops::Heads;
use crate::{ModelError, Result};

const SOURCE: &str = include_str!("attention.cu");
/// The largest head dimension the kernels hold in registers (a warp keeps a 16 x DP block of
/// the output, or of two gradients, as fp32 accumulators).
pub const MAX_HEAD_DIM: usize = 128;
/// Warps of every attention block (`WARPS` of attention.cu), 16 query or key rows each.
const WARPS: usize = 4;
/// Rows of a block: its queries (`BQ`), or its keys in the keys' gradient (`BKB`).
const BLOCK_ROWS: usize = 16 * WARPS;
/// Keys of a stage of the forward (`BK`), and rows of a stage of the two backward kernels
/// (`BK_DQ`, `BQ_DKV`).
const KEY_STAGE: usize = 64;
const STAGE: usize = 32;
const THREADS: u32 = 32 * WARPS as u32;

/// The kernels of one head dimension.
pub(super) struct Kernels {
    d: usize,
    fwd: CudaFunction,
    delta: CudaFunction,
    dq: CudaFunction,
    dkv: CudaFunction,
}

/// attention.cu for heads of `d` features.
fn source(d: usize) -> String {
    format!("#define D {d}\n#define WARPS {WARPS}\n{SOURCE}")
}

/// The padded head dimension of the kernels for heads of `d` features.
fn padded(d: usize) -> usize {
    d.div_ceil(16) * 16
}

/// Bytes of a shared bf16 tile of `rows` rows of DP features (rows of DP + 8).
fn tile(rows: usize, dp: usize) -> usize {
    rows * (dp + 8) * 2
}
/// Dynamic shared memory of `attn_fwd`: two stages of keys and values.
fn fwd_shared(dp: usize) -> usize {
    4 * tile(KEY_STAGE, dp)
}
/// Of `attn_bwd_dq`: two stages of keys and values.
fn dq_shared(dp: usize) -> usize {
    4 * tile(STAGE, dp)
}
/// Of `attn_bwd_dkv`: the block's keys and values, then two stages of queries and output
/// gradients, then two stages of their log-sum-exps and deltas.
fn dkv_shared(dp: usize) -> usize {
    2 * tile(BLOCK_ROWS, dp) + 4 * tile(STAGE, dp) + 4 * STAGE * 4
}

fn check(what: &str, ok: bool) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(ModelError::Config(format!("{what}: buffer sizes do not match the heads")))
    }
}

impl CudaOps {
    /// The kernels for heads of `d` features, compiled now if the last ones were for another
    /// size.
    fn attention_kernels(&mut self, d: usize) -> Result<&Kernels> {
        if self.attention.as_ref().is_none_or(|k| k.d != d) {
            self.attention = Some(self.load_attention(d)?);
        }
        self.attention.as_ref().ok_or_else(|| ModelError::Device("attention kernels not loaded".into()))
    }

    fn load_attention(&self, d: usize) -> Result<Kernels> {
        let (major, minor) = self.device.compute_capability()?;
        if major < 8 {
            return Err(ModelError::Config(format!(
                "the fused attention needs bf16 tensor cores (compute capability 8.0 or newer); {} is {major}.{minor}",
                self.device.name()
            )));
        }
        let (src, dp) = (source(d), padded(d));
        let ptx = compile(&src, major, minor, "the attention kernels")?;
        let module = self.device.context().load_module(ptx).map_err(|e| dev("loading the attention kernels", e))?;
        // Past the default 48 KiB of dynamic shared memory only on request (head dim 128: 68 KiB).
        let load = |n: &str, shared: usize| {
            let f = module.load_function(n).map_err(|e| dev(&format!("kernel {n}"), e))?;
            f.set_attribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared)?)
                .map_err(|e| dev(&format!("{n}: {shared} bytes of shared memory"), e))?;
            Ok::<_, ModelError>(f)
        };
        Ok(Kernels {
            d,
            fwd: load("attn_fwd", fwd_shared(dp))?,
            delta: load("attn_delta", 0)?,
            dq: load("attn_bwd_dq", dq_shared(dp))?,
            dkv: load("attn_bwd_dkv", dkv_shared(dp))?,
        })
    }

    /// Checks the shapes against the buffers; returns the grid of (row tiles, sequences x heads)
    /// and the kernels' int sizes t and h.
    fn attention_shape(hs: Heads, qkv: usize, outs: &[usize], lse: usize) -> Result<(LaunchConfig, [i32; 2])> {
        if hs.d == 0 || hs.d > MAX_HEAD_DIM {
            return Err(ModelError::Config(format!(
                "attention: heads of {} features (the fused kernels take 1 to {MAX_HEAD_DIM})",
                hs.d
            )));
        }
        let n = [hs.b, hs.t, hs.h, hs.d].iter().try_fold(1usize, |a, x| a.checked_mul(*x));
        let ok = n.is_some_and(|n| Some(qkv) == n.checked_mul(3) && outs.iter().all(|o| *o == n))
            && Some(lse) == hs.b.checked_mul(hs.h).and_then(|x| x.checked_mul(hs.t));
        check("attention", ok)?;
        let bh = u32::try_from(hs.b * hs.h).ok().filter(|x| *x <= 65_535);
        let bh = bh.ok_or_else(|| ModelError::Config(format!("attention: {} sequences x heads", hs.b * hs.h)))?;
        let tiles = u32::try_from(hs.t.div_ceil(BLOCK_ROWS)).map_err(|_| ModelError::Config("attention: t".into()))?;
        let grid = LaunchConfig { grid_dim: (tiles, bh, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 };
        Ok((grid, [int(hs.t)?, int(hs.h)?]))
    }

    pub(super) fn attention_forward(
        &mut self,
        qkv: &CudaSlice<f32>,
        y: &mut CudaSlice<f32>,
        lse: &mut CudaSlice<f32>,
        hs: Heads,
        scale: f32,
    ) -> Result<()> {
        let (grid, [t, h]) = Self::attention_shape(hs, qkv.len(), &[y.len()], lse.len())?;
        let sl2 = scale * std::f32::consts::LOG2_E;
        let stream = self.stream().clone();
        self.attention_kernels(hs.d)?;
        let (at, at_y, n_y) = (twins::address(qkv), twins::address(y), y.len());
        let half = self.twin_of(qkv)?;
        let done = self.with_twin_out(at_y, n_y, |ops, y_h| {
            let k = ops.attention.as_ref().ok_or_else(|| ModelError::Device("attention kernels not loaded".into()))?;
            let mut b = stream.launch_builder(&k.fwd);
            b.arg(&half.half).arg(&mut *y).arg(y_h).arg(&mut *lse).arg(&t).arg(&h).arg(&sl2);
            let cfg = LaunchConfig { shared_mem_bytes: fwd_shared(padded(hs.d)) as u32, ..grid };
            // SAFETY: the arguments follow attn_fwd's parameters in order and type (the bf16
            // twins hold as many elements as qkv and y); attention_shape checked that qkv holds b t
            // rows of 3 h d, y b t rows of h d and lse b h t elements, which is every element the
            // grid of (t / 64 tiles, b h) reads or writes; the shared memory is the size the
            // kernel lays out for this head dimension, allowed on the function at its load.
            unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| dev("kernel attn_fwd", e))
        });
        self.twins.put(at, half);
        done
    }

    /// `[qkv, y, lse, dy]` of the forward and the output's gradient into `dqkv`.
    pub(super) fn attention_backward(
        &mut self,
        [qkv, y, lse, dy]: [&CudaSlice<f32>; 4],
        dqkv: &mut CudaSlice<f32>,
        hs: Heads,
        scale: f32,
    ) -> Result<()> {
        let (grid, [t, h]) = Self::attention_shape(hs, qkv.len(), &[y.len(), dy.len()], lse.len())?;
        check("attention_bwd", dqkv.len() == qkv.len())?;
        let rows = int(hs.b * hs.t * hs.h)?;
        let sl2 = scale * std::f32::consts::LOG2_E;
        let dp = padded(hs.d);
        let stream = self.stream().clone();
        self.attention_kernels(hs.d)?;
        let (at_q, at_dy) = (twins::address(qkv), twins::address(dy));
        let hq = self.twin_of(qkv)?;
        let hdy = match self.twin_of(dy) {
            Ok(x) => x,
            Err(e) => {
                self.twins.put(at_q, hq);
                return Err(e);
            }
        };
        let (at_d, n_d) = (twins::address(dqkv), dqkv.len());
        let done = self.with_twin_out(at_d, n_d, |ops, dqkv_h| {
            ops.with_scratch(lse.len(), |ops, delta| {
                let k =
                    ops.attention.as_ref().ok_or_else(|| ModelError::Device("attention kernels not loaded".into()))?;
                // attn_delta: a warp per row, four per block.
                let warps = LaunchConfig {
                    grid_dim: ((rows as u32).div_ceil(4), 1, 1),
                    block_dim: (128, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = stream.launch_builder(&k.delta);
                b.arg(y).arg(dy).arg(&mut *delta).arg(&t).arg(&h).arg(&rows);
                // SAFETY: attn_delta's parameters in order and type; y and dy hold the b t h rows of
                // d floats that its warps read, delta (scratch of at least b h t) what they write.
                unsafe { b.launch(warps) }.map_err(|e| dev("kernel attn_delta", e))?;
                let mut b = stream.launch_builder(&k.dq);
                b.arg(&hq.half).arg(&hdy.half).arg(lse).arg(&*delta).arg(&mut *dqkv).arg(&mut *dqkv_h);
                b.arg(&t).arg(&h).arg(&sl2).arg(&scale);
                let cfg = LaunchConfig { shared_mem_bytes: dq_shared(dp) as u32, ..grid };
                // SAFETY: attn_bwd_dq's parameters in order and type; the buffers hold what
                // attention_shape checked (the twins as many elements as qkv and dy, dqkv as qkv),
                // the grid is the forward's, the shared memory as allowed at the load.
                unsafe { b.launch(cfg) }.map_err(|e| dev("kernel attn_bwd_dq", e))?;
                let mut b = stream.launch_builder(&k.dkv);
                b.arg(&hq.half).arg(&hdy.half).arg(lse).arg(&*delta).arg(&mut *dqkv).arg(&mut *dqkv_h);
                b.arg(&t).arg(&h).arg(&sl2).arg(&scale);
                let cfg = LaunchConfig { shared_mem_bytes: dkv_shared(dp) as u32, ..grid };
                // SAFETY: attn_bwd_dkv's parameters in order and type, the same buffers and grid;
                // its shared memory as allowed at the load.
                unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| dev("kernel attn_bwd_dkv", e))
            })
        });
        self.twins.put(at_q, hq);
        self.twins.put(at_dy, hdy);
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_dims_pad_to_sixteen_and_shared_memory_fits_an_a100() {
        assert_eq!((padded(16), padded(24), padded(64), padded(100), padded(128)), (16, 32, 64, 112, 128));
        assert_eq!((fwd_shared(128), dq_shared(128), dkv_shared(128)), (69_632, 34_816, 70_144));
        // An A100 grants a block at most 163 KiB of shared memory (an H100 227 KiB): a block of
        // each kernel fits at every head dimension.
        for f in [fwd_shared, dq_shared, dkv_shared] {
            assert!(f(padded(MAX_HEAD_DIM)) <= 163 * 1024);
        }
    }

    #[test]
    #[ignore = "needs libnvrtc (NVIDIA's pip package nvidia-cuda-nvrtc) on the library path"]
    fn attention_compiles_for_every_padded_head_dim() {
        // Whole tiles of 16, 16-byte rows that pad (24), rows that are not 16-byte aligned (100, 7).
        for d in [7, 16, 24, 64, 100, 128] {
            let ptx = compile(&source(d), 9, 0, "attention").unwrap();
            for n in ["attn_fwd", "attn_delta", "attn_bwd_dq", "attn_bwd_dkv"] {
                assert!(ptx.to_src().contains(&format!(".entry {n}(")), "{n} missing for head dim {d}");
            }
        }
    }
}
