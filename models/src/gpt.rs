//! A GPT-2-style decoder (pre-norm blocks: causal self-attention and a GELU MLP, learned
//! position embeddings, untied LM head) with optional Megatron tensor parallelism: the QKV
//! and first MLP linears are column-parallel (each rank holds `heads / tp` heads and
//! `4 dim / tp` hidden units), the attention output and second MLP linears row-parallel with
//! a sum all-reduce over the tensor-parallel group after them in the forward, and one after
//! each column-parallel linear's input gradient in the backward. Embeddings, norms, biases
//! after a reduction and the LM head are replicated. With `tp = 1` it is mini-gpt.

use crate::comm::Comm;
use crate::data::{group_by_token, seed_of, TokenRows, TokenTask};
use crate::ops::{Heads, Mm, NormBwd, NormFwd, Ops};
use crate::train::{GradsReady, Model, Param};
use crate::{ModelError, Result};

mod init;

pub use gpusanity_common::config::models::GptShape;

#[derive(Debug, Clone, PartialEq)]
pub struct GptConfig {
    pub shape: GptShape,
    pub tp_size: usize,
    pub tp_rank: usize,
    /// Initial weights (the same on every rank).
    pub seed: u64,
    /// Data stream of this data-parallel replica (ranks of one tensor-parallel group share it).
    pub data_seed: u64,
}

/// Per-layer parameter indices, in the order of [`Gpt::new`].
#[rustfmt::skip]
mod lp {
    pub const LN1_G: usize = 0; pub const LN1_B: usize = 1; pub const QKV_W: usize = 2; pub const QKV_B: usize = 3;
    pub const O_W: usize = 4; pub const O_B: usize = 5; pub const LN2_G: usize = 6; pub const LN2_B: usize = 7;
    pub const FC_W: usize = 8; pub const FC_B: usize = 9; pub const PROJ_W: usize = 10; pub const PROJ_B: usize = 11;
    pub const PER_LAYER: usize = 12;
}
use lp::*;

/// What one block keeps for its backward.
struct LayerActs<B> {
    a1: B,
    mean1: B,
    rstd1: B,
    /// The QKV projection's output `[b t, 3, h, d]`: the heads' queries, keys and values are
    /// read in place by the fused attention.
    qkv: B,
    /// The attention's log-sum-exp of each row of scores `[b h, t]`.
    lse: B,
    y: B,
    x1: B,
    a2: B,
    mean2: B,
    rstd2: B,
    h: B,
    gl: B,
}

/// Scratch shared by all blocks.
struct Scratch<B> {
    z: B,
    dx: B,
    dtmp: B,
    dqkv: B,
    dy: B,
    dh: B,
    dgl: B,
    af: B,
    meanf: B,
    rstdf: B,
    logits: B,
    dlogits: B,
    losses: B,
}

pub struct Gpt<B> {
    pub cfg: GptConfig,
    params: Vec<Param<B>>,
    /// Block inputs: `xs[l]` enters block `l`; `xs[layers]` enters the final norm.
    xs: Vec<B>,
    acts: Vec<LayerActs<B>>,
    sc: Scratch<B>,
    tok: B,
    /// The batch's rows grouped by token, for the embedding's backward.
    by_token: TokenRows<B>,
    tgt: B,
    task: TokenTask,
}

impl GptConfig {
    fn check(&self) -> Result<()> {
        let bad = |why: &str| Err(ModelError::Config(format!("gpt: {why} ({self:?})")));
        if [
            self.shape.vocab,
            self.shape.ctx,
            self.shape.layers,
            self.shape.heads,
            self.shape.dim,
            self.shape.batch,
            self.tp_size,
        ]
        .contains(&0)
        {
            return bad("every size must be positive");
        }
        if self.shape.dim % self.shape.heads != 0 {
            return bad("dim must be a multiple of heads");
        }
        if self.shape.heads % self.tp_size != 0 {
            return bad("heads must be a multiple of the tensor-parallel size");
        }
        if self.tp_rank >= self.tp_size {
            return bad("tensor-parallel rank out of range");
        }
        Ok(())
    }
    /// Rows of every activation (`batch ctx`).
    pub fn rows(&self) -> usize {
        self.shape.batch * self.shape.ctx
    }
    /// Features of this rank's share of the attention (`dim / tp`).
    fn cl(&self) -> usize {
        self.shape.dim / self.tp_size
    }
    fn local_heads(&self) -> Heads {
        Heads {
            b: self.shape.batch,
            t: self.shape.ctx,
            h: self.shape.heads / self.tp_size,
            d: self.shape.dim / self.shape.heads,
        }
    }
}

impl<B> Gpt<B> {
    pub fn new<O: Ops<Buf = B>>(ops: &mut O, cfg: GptConfig) -> Result<Gpt<B>> {
        cfg.check()?;
        let (v, c, l) = (cfg.shape.vocab, cfg.shape.dim, cfg.shape.layers);
        let (cl, n) = (cfg.cl(), cfg.rows());
        let mut params = Vec::new();
        for w in init::weights(&cfg) {
            params.push(Param::new(ops, w.name, &w.values, w.decay)?);
        }

        let hs = cfg.local_heads();
        let att = hs.b * hs.h * hs.t;
        let xs = (0..=l).map(|_| ops.zeros(n * c)).collect::<Result<Vec<_>>>()?;
        let mut acts = Vec::with_capacity(l);
        for _ in 0..l {
            acts.push(LayerActs {
                a1: ops.zeros(n * c)?,
                mean1: ops.zeros(n)?,
                rstd1: ops.zeros(n)?,
                qkv: ops.zeros(n * 3 * cl)?,
                lse: ops.zeros(att)?,
                y: ops.zeros(n * cl)?,
                x1: ops.zeros(n * c)?,
                a2: ops.zeros(n * c)?,
                mean2: ops.zeros(n)?,
                rstd2: ops.zeros(n)?,
                h: ops.zeros(n * 4 * cl)?,
                gl: ops.zeros(n * 4 * cl)?,
            });
        }
        let sc = Scratch {
            z: ops.zeros(n * c)?,
            dx: ops.zeros(n * c)?,
            dtmp: ops.zeros(n * c)?,
            dqkv: ops.zeros(n * 3 * cl)?,
            dy: ops.zeros(n * cl)?,
            dh: ops.zeros(n * 4 * cl)?,
            dgl: ops.zeros(n * 4 * cl)?,
            af: ops.zeros(n * c)?,
            meanf: ops.zeros(n)?,
            rstdf: ops.zeros(n)?,
            logits: ops.zeros(n * v)?,
            dlogits: ops.zeros(n * v)?,
            losses: ops.zeros(n)?,
        };
        let task = TokenTask::new(v, seed_of(cfg.seed, "task"));
        let by_token = TokenRows { rows: ops.zeros(n)?, starts: ops.zeros(v + 1)? };
        Ok(Gpt { tok: ops.zeros(n)?, by_token, tgt: ops.zeros(n)?, task, params, xs, acts, sc, cfg })
    }
}

impl<O: Ops> Model<O> for Gpt<O::Buf> {
    fn params_mut(&mut self) -> &mut [Param<O::Buf>] {
        &mut self.params
    }

    fn load_batch(&mut self, ops: &mut O, step: usize) -> Result<()> {
        let (x, y) = self.task.batch(
            self.cfg.shape.batch,
            self.cfg.shape.ctx,
            seed_of(self.cfg.data_seed, &format!("step{step}")),
        );
        // Into the same buffers every step: a step graph reads them where it was recorded.
        let (rows, starts) = group_by_token(&x, self.cfg.shape.vocab)?;
        ops.write(&mut self.tok, &x)?;
        ops.write(&mut self.by_token.rows, &rows)?;
        ops.write(&mut self.by_token.starts, &starts)?;
        ops.write(&mut self.tgt, &y)?;
        Ok(())
    }

    fn forward_backward(
        &mut self,
        ops: &mut O,
        tp: &mut dyn Comm<O::Buf>,
        grads: &mut dyn GradsReady<O::Buf>,
    ) -> Result<()> {
        let Gpt { cfg, params: ps, xs, acts, sc, tok, by_token, tgt, .. } = self;
        let (v, t, c, l) = (cfg.shape.vocab, cfg.shape.ctx, cfg.shape.dim, cfg.shape.layers);
        let (cl, n) = (cfg.cl(), cfg.rows());
        let hs = cfg.local_heads();
        let scale = 1.0 / (hs.d as f32).sqrt();
        let lp = |i: usize, j: usize| 2 + i * PER_LAYER + j;
        let fin = 2 + l * PER_LAYER;

        // ---- forward ----
        ops.embed_fwd(tok, &ps[0].w, &ps[1].w, &mut xs[0], t, c)?;
        for (i, a) in acts.iter_mut().enumerate() {
            let (before, after) = xs.split_at_mut(i + 1);
            let (x, x2) = (&before[i], &mut after[0]);
            let (g, b) = (&ps[lp(i, LN1_G)].w, &ps[lp(i, LN1_B)].w);
            ops.layernorm_fwd(NormFwd { x, g, b, out: &mut a.a1, mean: &mut a.mean1, rstd: &mut a.rstd1 }, c)?;
            ops.matmul_bias(Mm::new(n, 3 * cl, c), &a.a1, &ps[lp(i, QKV_W)].w, &ps[lp(i, QKV_B)].w, &mut a.qkv)?;
            ops.attention_fwd(&a.qkv, &mut a.y, &mut a.lse, hs, scale)?;
            let (o_w, o_b) = (&ps[lp(i, O_W)].w, &ps[lp(i, O_B)].w);
            project_residual(ops, tp, Mm::new(n, c, cl), [&a.y, o_w, o_b, x], &mut sc.z, &mut a.x1)?;
            let (g, b) = (&ps[lp(i, LN2_G)].w, &ps[lp(i, LN2_B)].w);
            ops.layernorm_fwd(NormFwd { x: &a.x1, g, b, out: &mut a.a2, mean: &mut a.mean2, rstd: &mut a.rstd2 }, c)?;
            let (fc_w, fc_b) = (&ps[lp(i, FC_W)].w, &ps[lp(i, FC_B)].w);
            ops.matmul_bias_gelu(Mm::new(n, 4 * cl, c), &a.a2, fc_w, fc_b, &mut a.h, &mut a.gl)?;
            let (p_w, p_b) = (&ps[lp(i, PROJ_W)].w, &ps[lp(i, PROJ_B)].w);
            project_residual(ops, tp, Mm::new(n, c, 4 * cl), [&a.gl, p_w, p_b, &a.x1], &mut sc.z, x2)?;
        }
        let (g, b) = (&ps[fin].w, &ps[fin + 1].w);
        ops.layernorm_fwd(NormFwd { x: &xs[l], g, b, out: &mut sc.af, mean: &mut sc.meanf, rstd: &mut sc.rstdf }, c)?;
        ops.matmul(Mm::new(n, v, c), &sc.af, &ps[fin + 2].w, &mut sc.logits)?;
        ops.cross_entropy(&sc.logits, tgt, &mut sc.dlogits, &mut sc.losses, v)?;

        // ---- backward ----
        {
            let p = &mut ps[fin + 2];
            ops.matmul(Mm::new(c, v, n).ta(), &sc.af, &sc.dlogits, &mut p.g)?;
            ops.matmul(Mm::new(n, c, v).tb(), &sc.dlogits, &p.w, &mut sc.dtmp)?;
        }
        ops.fill(&mut sc.dx, 0.0)?;
        layernorm_bwd(ops, &xs[l], [&sc.meanf, &sc.rstdf], &mut ps[fin..], &sc.dtmp, &mut sc.dx, c)?;
        grads.ready(ps, fin)?;
        for (i, a) in acts.iter().enumerate().rev() {
            let lps = &mut ps[lp(i, 0)..lp(i, PER_LAYER)];
            // MLP: dx is the gradient of the block's output.
            ops.col_sum(&sc.dx, &mut lps[PROJ_B].g, n)?;
            ops.matmul(Mm::new(4 * cl, c, n).ta(), &a.gl, &sc.dx, &mut lps[PROJ_W].g)?;
            {
                // FC_B's gradient and PROJ_W's weight: the split keeps both borrows apart.
                let (lo, hi) = lps.split_at_mut(PROJ_W);
                let (dgl, dh) = (&mut sc.dgl, &mut sc.dh);
                ops.matmul_dgelu(Mm::new(n, 4 * cl, c).tb(), &sc.dx, &hi[0].w, &a.h, dgl, dh, &mut lo[FC_B].g)?;
            }
            ops.matmul(Mm::new(c, 4 * cl, n).ta(), &a.a2, &sc.dh, &mut lps[FC_W].g)?;
            ops.matmul(Mm::new(n, c, 4 * cl).tb(), &sc.dh, &lps[FC_W].w, &mut sc.dtmp)?;
            tp.all_reduce_sum(&mut sc.dtmp)?;
            layernorm_bwd(ops, &a.x1, [&a.mean2, &a.rstd2], &mut lps[LN2_G..], &sc.dtmp, &mut sc.dx, c)?;
            // Attention: dx is now the gradient of x1.
            ops.col_sum(&sc.dx, &mut lps[O_B].g, n)?;
            ops.matmul(Mm::new(cl, c, n).ta(), &a.y, &sc.dx, &mut lps[O_W].g)?;
            ops.matmul(Mm::new(n, cl, c).tb(), &sc.dx, &lps[O_W].w, &mut sc.dy)?;
            ops.attention_bwd(&a.qkv, &a.y, &a.lse, &sc.dy, &mut sc.dqkv, hs, scale)?;
            ops.col_sum(&sc.dqkv, &mut lps[QKV_B].g, n)?;
            ops.matmul(Mm::new(c, 3 * cl, n).ta(), &a.a1, &sc.dqkv, &mut lps[QKV_W].g)?;
            ops.matmul(Mm::new(n, c, 3 * cl).tb(), &sc.dqkv, &lps[QKV_W].w, &mut sc.dtmp)?;
            tp.all_reduce_sum(&mut sc.dtmp)?;
            layernorm_bwd(ops, &xs[i], [&a.mean1, &a.rstd1], &mut lps[LN1_G..], &sc.dtmp, &mut sc.dx, c)?;
            grads.ready(ps, lp(i, 0))?;
        }
        let (wte, wpe) = ps.split_at_mut(1);
        ops.fill(&mut wte[0].g, 0.0)?;
        ops.fill(&mut wpe[0].g, 0.0)?;
        ops.embed_bwd(tok, by_token, &sc.dx, &mut wte[0].g, &mut wpe[0].g, t, c)?;
        grads.ready(ps, 0)
    }

    fn loss(&mut self, ops: &mut O) -> Result<f32> {
        let losses = ops.download(&self.sc.losses)?;
        Ok(losses.iter().sum::<f32>() / losses.len() as f32)
    }

    fn graph_key(&self) -> usize {
        0
    }

    fn flops_per_step(&self) -> f64 {
        let cfg = &self.cfg;
        let (n, c, cl, v, t) = (cfg.rows(), cfg.shape.dim, cfg.cl(), cfg.shape.vocab, cfg.shape.ctx);
        let hs = cfg.local_heads();
        let per_layer = Mm::new(n, 3 * cl, c).flops()
            + 2.0 * Mm::new(t, t, hs.d).batched(hs.b * hs.h).flops()
            + Mm::new(n, c, cl).flops()
            + 2.0 * Mm::new(n, 4 * cl, c).flops();
        3.0 * (cfg.shape.layers as f64 * per_layer + Mm::new(n, v, c).flops())
    }
}

/// `out = x + (a w summed over the tensor-parallel ranks) + bias`: a projection into the
/// residual stream. On one rank the product adds the bias and the residual itself; across
/// ranks the partial products are summed (into `z`) before they are added.
/// [`Ops::layernorm_bwd`] of the layer norm whose scale and shift are `gb[0]` and `gb[1]`, with
/// its forward's saved mean and 1/std: `dx` acc, the two parameters' gradients overwritten.
fn layernorm_bwd<O: Ops>(
    ops: &mut O,
    x: &O::Buf,
    [mean, rstd]: [&O::Buf; 2],
    gb: &mut [Param<O::Buf>],
    dout: &O::Buf,
    dx: &mut O::Buf,
    c: usize,
) -> Result<()> {
    let (g, b) = gb.split_at_mut(1);
    ops.layernorm_bwd(NormBwd { x, g: &g[0].w, mean, rstd, dout, dx, dg: &mut g[0].g, db: &mut b[0].g }, c)
}

fn project_residual<O: Ops>(
    ops: &mut O,
    tp: &mut dyn Comm<O::Buf>,
    mm: Mm,
    [a, w, bias, x]: [&O::Buf; 4],
    z: &mut O::Buf,
    out: &mut O::Buf,
) -> Result<()> {
    if tp.size() == 1 {
        return ops.matmul_bias_residual(mm, a, w, bias, x, z, out);
    }
    ops.matmul(mm, a, w, z)?;
    tp.all_reduce_sum(z)?;
    ops.add_bias_residual(z, bias, x, out, mm.m)
}

#[cfg(test)]
mod tests;
