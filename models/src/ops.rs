//! The operations the models need, forward and backward, on flat f32 buffers.
//!
//! Conventions: matrices are row-major; GPT activations are `[rows = batch * time, features]`;
//! the QKV projection's output is `[batch * time, 3, heads, head_dim]`, which the fused
//! attention reads in place, and its saved log-sum-exps `[batch, heads, time]`; ResNet
//! activations are channel-major
//! `[channels, batch * height * width]` (so a convolution is one matrix product with the
//! im2col matrix and batch norm reduces contiguous rows). Token ids and class labels travel as
//! f32 (exact below 2^24). "acc" in a doc means the result is added to the output buffer;
//! otherwise it is overwritten.

use crate::data::TokenRows;
use crate::Result;

mod norm;
pub mod separate;
mod shapes;

pub use norm::{NormBwd, NormFwd};
pub(crate) use shapes::whole;
pub use shapes::{Adam, Conv, GraphRun, Heads, Mm};

/// The operations, on buffers of f32 that live on the backend's device.
pub trait Ops {
    type Buf;

    /// Where the work runs, in words.
    fn describe(&self) -> String;
    fn upload(&mut self, x: &[f32]) -> Result<Self::Buf>;
    fn zeros(&mut self, n: usize) -> Result<Self::Buf>;
    fn download(&mut self, b: &Self::Buf) -> Result<Vec<f32>>;
    fn len(b: &Self::Buf) -> usize;
    /// Waits for all queued work.
    fn sync(&mut self) -> Result<()>;
    /// Sets every element to `v`.
    fn fill(&mut self, b: &mut Self::Buf, v: f32) -> Result<()>;
    /// Sets element `i` to `v` (fault injection).
    fn set(&mut self, b: &mut Self::Buf, i: usize, v: f32) -> Result<()>;
    /// Overwrites `b` with `x`, of the same length (a new batch into the buffer a step reads).
    fn write(&mut self, b: &mut Self::Buf, x: &[f32]) -> Result<()>;

    /// Runs `body`, which enqueues one step's forward and backward, as step graph `key`: a
    /// backend that can record the work once and replay it (CUDA graphs: one launch instead
    /// of a thousand) does so; the default runs `body` as it is. `body` must enqueue the same
    /// work on the same buffers every time it is called with the same key, and must not read
    /// results back.
    fn graph_step(&mut self, _key: usize, body: &mut dyn FnMut(&mut Self) -> Result<()>) -> Result<GraphRun>
    where
        Self: Sized,
    {
        body(self)?;
        Ok(GraphRun::Eager)
    }
    /// Drops the recorded step graphs (they hold the addresses of the model's buffers).
    fn drop_graphs(&mut self) {}

    fn matmul(&mut self, mm: Mm, a: &Self::Buf, b: &Self::Buf, c: &mut Self::Buf) -> Result<()>;
    /// `y += alpha x`.
    fn axpy(&mut self, alpha: f32, x: &Self::Buf, y: &mut Self::Buf) -> Result<()>;
    /// `out = a + b`.
    fn add(&mut self, a: &Self::Buf, b: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    /// `out = ReLU(a + b)` (a residual block's output; NaN passes through).
    fn add_relu(&mut self, a: &Self::Buf, b: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    /// `y[r, j] += bias[j]` for `y` of `rows x bias.len()`.
    fn add_bias(&mut self, y: &mut Self::Buf, bias: &Self::Buf, rows: usize) -> Result<()>;
    /// `out[r, j] = x[r, j] + z[r, j] + bias[j]` (a projection's bias and the residual in one
    /// pass), all of `rows x bias.len()`.
    fn add_bias_residual(
        &mut self,
        z: &Self::Buf,
        bias: &Self::Buf,
        x: &Self::Buf,
        out: &mut Self::Buf,
        rows: usize,
    ) -> Result<()>;
    /// `y[r, j] += bias[j]`, then `out = GELU(y)` (the MLP's first projection: `y` is kept for
    /// the backward).
    fn add_bias_gelu(&mut self, y: &mut Self::Buf, bias: &Self::Buf, out: &mut Self::Buf, rows: usize) -> Result<()>;
    /// `out[j] = sum_r x[r, j]` for `x` of `rows x out.len()`.
    fn col_sum(&mut self, x: &Self::Buf, out: &mut Self::Buf, rows: usize) -> Result<()>;

    // The products with their bias and activation fused. A backend may write their results
    // (`out`, `pre`, `dpre`) only at the products' operand precision (bf16 on CUDA): read them
    // only as operands of products, of the fused attention and of these ops; the default
    // runs the separate ops, exact in f32.

    /// `out = a w + bias` for `mm` (a projection with its bias; `bias` of `mm.n`).
    fn matmul_bias(
        &mut self,
        mm: Mm,
        a: &Self::Buf,
        w: &Self::Buf,
        bias: &Self::Buf,
        out: &mut Self::Buf,
    ) -> Result<()> {
        separate::matmul_bias(self, mm, [a, w, bias], out)
    }
    /// `out = x + a w + bias` for `mm` (a projection into the residual stream; `out` stays f32
    /// and readable as any buffer); `tmp`, of `out`'s size, is scratch.
    #[allow(clippy::too_many_arguments)]
    fn matmul_bias_residual(
        &mut self,
        mm: Mm,
        a: &Self::Buf,
        w: &Self::Buf,
        bias: &Self::Buf,
        x: &Self::Buf,
        tmp: &mut Self::Buf,
        out: &mut Self::Buf,
    ) -> Result<()> {
        separate::matmul_bias_residual(self, mm, [a, w, bias, x], tmp, out)
    }
    /// `pre = a w + bias`, `out = GELU(pre)` (the MLP's first projection; `pre` is kept for
    /// [`Ops::matmul_dgelu`]).
    fn matmul_bias_gelu(
        &mut self,
        mm: Mm,
        a: &Self::Buf,
        w: &Self::Buf,
        bias: &Self::Buf,
        pre: &mut Self::Buf,
        out: &mut Self::Buf,
    ) -> Result<()> {
        separate::matmul_bias_gelu(self, mm, [a, w, bias], pre, out)
    }
    /// `dpre = GELU'(pre) * (dout w)` for `mm` and `dbias` = the column sums of `dpre` (the
    /// gradients of [`Ops::matmul_bias_gelu`]'s `pre` and bias from its output's); `tmp`, of
    /// `dpre`'s size, is scratch.
    #[allow(clippy::too_many_arguments)]
    fn matmul_dgelu(
        &mut self,
        mm: Mm,
        dout: &Self::Buf,
        w: &Self::Buf,
        pre: &Self::Buf,
        tmp: &mut Self::Buf,
        dpre: &mut Self::Buf,
        dbias: &mut Self::Buf,
    ) -> Result<()> {
        separate::matmul_dgelu(self, mm, [dout, w, pre], tmp, dpre, dbias)
    }

    /// `out[b t, :] = wte[tok[b t], :] + wpe[t, :]`, `c` features.
    fn embed_fwd(
        &mut self,
        tok: &Self::Buf,
        wte: &Self::Buf,
        wpe: &Self::Buf,
        out: &mut Self::Buf,
        t: usize,
        c: usize,
    ) -> Result<()>;
    /// acc: the gradients of [`Ops::embed_fwd`] into `dwte` and `dwpe`, each element's rows
    /// summed in row order (`by_token`: the same batch's rows grouped by token, which lets a
    /// device sum a token's rows without atomic adds).
    #[allow(clippy::too_many_arguments)]
    fn embed_bwd(
        &mut self,
        tok: &Self::Buf,
        by_token: &TokenRows<Self::Buf>,
        dout: &Self::Buf,
        dwte: &mut Self::Buf,
        dwpe: &mut Self::Buf,
        t: usize,
        c: usize,
    ) -> Result<()>;
    /// Layer norm of each row of `c` features; saves each row's mean and 1/std.
    fn layernorm_fwd(&mut self, n: NormFwd<'_, Self::Buf>, c: usize) -> Result<()>;
    /// `dx` acc, `dg` and `db` overwritten.
    fn layernorm_bwd(&mut self, n: NormBwd<'_, Self::Buf>, c: usize) -> Result<()>;
    /// GELU (tanh approximation).
    fn gelu_fwd(&mut self, x: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    fn gelu_bwd(&mut self, x: &Self::Buf, dout: &Self::Buf, dx: &mut Self::Buf) -> Result<()>;
    fn relu_fwd(&mut self, x: &Self::Buf, out: &mut Self::Buf) -> Result<()>;
    /// From the forward's output `y`.
    fn relu_bwd(&mut self, y: &Self::Buf, dout: &Self::Buf, dx: &mut Self::Buf) -> Result<()>;

    /// Causal self-attention of every sequence and head, fused: `y` `[b t, h, d]` =
    /// softmax(scale Q K^T, row i seeing keys 0..=i) V from the packed QKV rows
    /// `[b t, 3, h, d]`, with no t x t matrix kept; `lse` `[b h, t]` gets each row's
    /// log-sum-exp of its scaled scores, for the backward.
    fn attention_fwd(
        &mut self,
        qkv: &Self::Buf,
        y: &mut Self::Buf,
        lse: &mut Self::Buf,
        hs: Heads,
        scale: f32,
    ) -> Result<()>;
    /// The gradient of [`Ops::attention_fwd`] into `dqkv` (overwritten, the QKV layout) from the
    /// output's gradient `dy` and the forward's `y` and `lse`.
    #[allow(clippy::too_many_arguments)]
    fn attention_bwd(
        &mut self,
        qkv: &Self::Buf,
        y: &Self::Buf,
        lse: &Self::Buf,
        dy: &Self::Buf,
        dqkv: &mut Self::Buf,
        hs: Heads,
        scale: f32,
    ) -> Result<()>;
    /// Mean cross-entropy over the rows of `logits` `[rows, v]`: `losses[r] = -log softmax[r,
    /// target_r]` and `dlogits = (softmax - onehot) / rows`.
    fn cross_entropy(
        &mut self,
        logits: &Self::Buf,
        targets: &Self::Buf,
        dlogits: &mut Self::Buf,
        losses: &mut Self::Buf,
        v: usize,
    ) -> Result<()>;
    fn adamw(&mut self, p: &mut Self::Buf, g: &Self::Buf, m: &mut Self::Buf, v: &mut Self::Buf, a: Adam) -> Result<()>;

    /// `x` `[c, n h w]` into `cols` `[c k k, n oh ow]` (zero padding).
    fn im2col(&mut self, x: &Self::Buf, cols: &mut Self::Buf, cv: Conv) -> Result<()>;
    /// The adjoint: `dx` (overwritten) from `dcols`.
    fn col2im(&mut self, dcols: &Self::Buf, dx: &mut Self::Buf, cv: Conv) -> Result<()>;
    /// Batch norm over rows of `x` `[c, m]` with the batch's statistics.
    fn batchnorm_fwd(&mut self, n: NormFwd<'_, Self::Buf>, m: usize) -> Result<()>;
    /// `dx`, `dg`, `db` overwritten.
    fn batchnorm_bwd(&mut self, n: NormBwd<'_, Self::Buf>, m: usize) -> Result<()>;
    /// Max pooling with window `cv.k`, stride and padding of `cv`; `arg` holds each output's
    /// source place in its `h x w` plane (exact in f32 for any image size used).
    fn maxpool_fwd(&mut self, x: &Self::Buf, out: &mut Self::Buf, arg: &mut Self::Buf, cv: Conv) -> Result<()>;
    /// `dx` overwritten.
    fn maxpool_bwd(&mut self, dout: &Self::Buf, arg: &Self::Buf, dx: &mut Self::Buf, cv: Conv) -> Result<()>;
    /// Global average pool of `x` `[c, n hw]` into `out` `[n, c]`.
    fn avgpool_fwd(&mut self, x: &Self::Buf, out: &mut Self::Buf, c: usize, n: usize) -> Result<()>;
    /// `dx` `[c, n hw]` overwritten from `dout` `[n, c]`.
    fn avgpool_bwd(&mut self, dout: &Self::Buf, dx: &mut Self::Buf, c: usize, n: usize) -> Result<()>;
}
