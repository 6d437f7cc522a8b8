//! The CPU backend of [`Ops`]: matrix products through the `gemm` crate on one thread (the
//! workers of a node share its cores) and plain loops for the rest.

use crate::data::TokenRows;
use crate::ops::{Adam, Conv, Heads, Mm, NormBwd, NormFwd, Ops};
use crate::{ModelError, Result};

pub struct CpuOps;

fn check(what: &str, ok: bool) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(ModelError::Config(format!("{what}: buffer sizes do not match")))
    }
}

const LN_EPS: f32 = 1e-5;
const GELU_K: f32 = 0.797_884_6; // sqrt(2 / pi)

fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + (GELU_K * (x + 0.044715 * x * x * x)).tanh())
}

fn gelu_grad(x: f32) -> f32 {
    let u = GELU_K * (x + 0.044715 * x * x * x);
    let th = u.tanh();
    0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * GELU_K * (1.0 + 3.0 * 0.044715 * x * x)
}

impl Ops for CpuOps {
    type Buf = Vec<f32>;

    fn describe(&self) -> String {
        "cpu (fp32, gemm crate, one thread)".into()
    }
    fn upload(&mut self, x: &[f32]) -> Result<Vec<f32>> {
        Ok(x.to_vec())
    }
    fn zeros(&mut self, n: usize) -> Result<Vec<f32>> {
        Ok(vec![0.0; n])
    }
    fn download(&mut self, b: &Vec<f32>) -> Result<Vec<f32>> {
        Ok(b.clone())
    }
    fn len(b: &Vec<f32>) -> usize {
        b.len()
    }
    fn sync(&mut self) -> Result<()> {
        Ok(())
    }
    fn fill(&mut self, b: &mut Vec<f32>, v: f32) -> Result<()> {
        b.fill(v);
        Ok(())
    }
    fn set(&mut self, b: &mut Vec<f32>, i: usize, v: f32) -> Result<()> {
        let len = b.len();
        *b.get_mut(i).ok_or_else(|| ModelError::Config(format!("element {i} of {len}")))? = v;
        Ok(())
    }
    fn write(&mut self, b: &mut Vec<f32>, x: &[f32]) -> Result<()> {
        check("write", b.len() == x.len())?;
        b.copy_from_slice(x);
        Ok(())
    }

    fn matmul(&mut self, mm: Mm, a: &Vec<f32>, b: &Vec<f32>, c: &mut Vec<f32>) -> Result<()> {
        let (ea, eb, ec) = mm.extents();
        check("matmul", mm.rows_fit() && a.len() >= ea && b.len() >= eb && c.len() >= ec)?;
        let (m, n, k) = (mm.m, mm.n, mm.k);
        // Element (i, l) of op(A): A[i lda + l] untransposed, A[l lda + i] transposed.
        let (lda, ldb, ldc) = (mm.lda as isize, mm.ldb as isize, mm.ldc as isize);
        let (a_cs, a_rs) = if mm.ta { (lda, 1) } else { (1, lda) };
        let (b_cs, b_rs) = if mm.tb { (ldb, 1) } else { (1, ldb) };
        for i in 0..mm.batch {
            let (pa, pb, pc) = mm.offsets(i);
            // SAFETY: `extents` checked above that batch i's operands (offsets pa, pb, pc, then
            // rows of their leading dimension) lie inside a, b and c, and `rows_fit` that no
            // row is longer than its stride; the strides address exactly those elements; c is
            // a distinct Vec from a and b (the borrow checker ensures it).
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr().add(pc),
                    1,
                    ldc,
                    mm.beta != 0.0,
                    a.as_ptr().add(pa),
                    a_cs,
                    a_rs,
                    b.as_ptr().add(pb),
                    b_cs,
                    b_rs,
                    mm.beta,
                    mm.alpha,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
        Ok(())
    }

    fn axpy(&mut self, alpha: f32, x: &Vec<f32>, y: &mut Vec<f32>) -> Result<()> {
        check("axpy", x.len() == y.len())?;
        y.iter_mut().zip(x).for_each(|(y, x)| *y += alpha * x);
        Ok(())
    }
    fn add(&mut self, a: &Vec<f32>, b: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        check("add", a.len() == b.len() && a.len() == out.len())?;
        out.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (a, b))| *o = a + b);
        Ok(())
    }
    fn add_relu(&mut self, a: &Vec<f32>, b: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        check("add_relu", a.len() == b.len() && a.len() == out.len())?;
        out.iter_mut().zip(a.iter().zip(b)).for_each(|(o, (a, b))| {
            let s = a + b;
            *o = if s < 0.0 { 0.0 } else { s };
        });
        Ok(())
    }
    fn add_bias(&mut self, y: &mut Vec<f32>, bias: &Vec<f32>, rows: usize) -> Result<()> {
        check("add_bias", y.len() == rows * bias.len())?;
        for row in y.chunks_mut(bias.len()) {
            row.iter_mut().zip(bias).for_each(|(y, b)| *y += b);
        }
        Ok(())
    }
    fn add_bias_residual(
        &mut self,
        z: &Vec<f32>,
        bias: &Vec<f32>,
        x: &Vec<f32>,
        out: &mut Vec<f32>,
        rows: usize,
    ) -> Result<()> {
        check(
            "add_bias_residual",
            !bias.is_empty() && z.len() == rows * bias.len() && x.len() == z.len() && out.len() == z.len(),
        )?;
        let c = bias.len();
        for ((o, z), x) in out.chunks_mut(c).zip(z.chunks(c)).zip(x.chunks(c)) {
            for (((o, z), x), b) in o.iter_mut().zip(z).zip(x).zip(bias) {
                *o = x + z + b;
            }
        }
        Ok(())
    }
    fn add_bias_gelu(&mut self, y: &mut Vec<f32>, bias: &Vec<f32>, out: &mut Vec<f32>, rows: usize) -> Result<()> {
        check("add_bias_gelu", y.len() == out.len())?;
        self.add_bias(y, bias, rows)?;
        self.gelu_fwd(y, out)
    }
    fn col_sum(&mut self, x: &Vec<f32>, out: &mut Vec<f32>, rows: usize) -> Result<()> {
        check("col_sum", x.len() == rows * out.len())?;
        out.fill(0.0);
        for row in x.chunks(out.len()) {
            out.iter_mut().zip(row).for_each(|(o, x)| *o += x);
        }
        Ok(())
    }

    fn embed_fwd(
        &mut self,
        tok: &Vec<f32>,
        wte: &Vec<f32>,
        wpe: &Vec<f32>,
        out: &mut Vec<f32>,
        t: usize,
        c: usize,
    ) -> Result<()> {
        check("embed_fwd", out.len() == tok.len() * c && wpe.len() >= t * c)?;
        for (r, row) in out.chunks_mut(c).enumerate() {
            let id = tok[r] as usize;
            check("embed_fwd token", (id + 1) * c <= wte.len())?;
            let (e, p) = (&wte[id * c..(id + 1) * c], &wpe[(r % t) * c..(r % t + 1) * c]);
            for j in 0..c {
                row[j] = e[j] + p[j];
            }
        }
        Ok(())
    }
    fn embed_bwd(
        &mut self,
        tok: &Vec<f32>,
        _by_token: &TokenRows<Vec<f32>>,
        dout: &Vec<f32>,
        dwte: &mut Vec<f32>,
        dwpe: &mut Vec<f32>,
        t: usize,
        c: usize,
    ) -> Result<()> {
        check("embed_bwd", dout.len() == tok.len() * c && dwpe.len() >= t * c)?;
        // Row by row: every element's rows are summed in row order without the grouping.
        for (r, row) in dout.chunks(c).enumerate() {
            let id = tok[r] as usize;
            check("embed_bwd token", (id + 1) * c <= dwte.len())?;
            for j in 0..c {
                dwte[id * c + j] += row[j];
                dwpe[(r % t) * c + j] += row[j];
            }
        }
        Ok(())
    }
    fn layernorm_fwd(&mut self, n: NormFwd<'_, Vec<f32>>, c: usize) -> Result<()> {
        gpt_ops::layernorm_fwd(n, c)
    }
    fn layernorm_bwd(&mut self, n: NormBwd<'_, Vec<f32>>, c: usize) -> Result<()> {
        gpt_ops::layernorm_bwd(n, c)
    }
    fn gelu_fwd(&mut self, x: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        check("gelu_fwd", x.len() == out.len())?;
        out.iter_mut().zip(x).for_each(|(o, x)| *o = gelu(*x));
        Ok(())
    }
    fn gelu_bwd(&mut self, x: &Vec<f32>, dout: &Vec<f32>, dx: &mut Vec<f32>) -> Result<()> {
        check("gelu_bwd", x.len() == dout.len() && x.len() == dx.len())?;
        for i in 0..x.len() {
            dx[i] = dout[i] * gelu_grad(x[i]);
        }
        Ok(())
    }
    fn relu_fwd(&mut self, x: &Vec<f32>, out: &mut Vec<f32>) -> Result<()> {
        check("relu_fwd", x.len() == out.len())?;
        // NaN passes through, as in the frameworks (f32::max would drop it).
        out.iter_mut().zip(x).for_each(|(o, x)| *o = if *x < 0.0 { 0.0 } else { *x });
        Ok(())
    }
    fn relu_bwd(&mut self, y: &Vec<f32>, dout: &Vec<f32>, dx: &mut Vec<f32>) -> Result<()> {
        check("relu_bwd", y.len() == dout.len() && y.len() == dx.len())?;
        for i in 0..y.len() {
            dx[i] = if y[i] > 0.0 { dout[i] } else { 0.0 };
        }
        Ok(())
    }

    fn attention_fwd(
        &mut self,
        qkv: &Vec<f32>,
        y: &mut Vec<f32>,
        lse: &mut Vec<f32>,
        hs: Heads,
        scale: f32,
    ) -> Result<()> {
        gpt_ops::attention_fwd(qkv, y, lse, hs, scale)
    }
    fn attention_bwd(
        &mut self,
        qkv: &Vec<f32>,
        y: &Vec<f32>,
        lse: &Vec<f32>,
        dy: &Vec<f32>,
        dqkv: &mut Vec<f32>,
        hs: Heads,
        scale: f32,
    ) -> Result<()> {
        gpt_ops::attention_bwd(qkv, y, lse, dy, dqkv, hs, scale)
    }
    fn cross_entropy(
        &mut self,
        logits: &Vec<f32>,
        targets: &Vec<f32>,
        dlogits: &mut Vec<f32>,
        losses: &mut Vec<f32>,
        v: usize,
    ) -> Result<()> {
        gpt_ops::cross_entropy(logits, targets, dlogits, losses, v)
    }
    fn adamw(&mut self, p: &mut Vec<f32>, g: &Vec<f32>, m: &mut Vec<f32>, v: &mut Vec<f32>, a: Adam) -> Result<()> {
        check("adamw", p.len() == g.len() && p.len() == m.len() && p.len() == v.len())?;
        let (c1, c2) = (1.0 - a.beta1.powi(a.step as i32), 1.0 - a.beta2.powi(a.step as i32));
        for i in 0..p.len() {
            let gi = g[i] * a.grad_scale;
            m[i] = a.beta1 * m[i] + (1.0 - a.beta1) * gi;
            v[i] = a.beta2 * v[i] + (1.0 - a.beta2) * gi * gi;
            p[i] -= a.lr * ((m[i] / c1) / ((v[i] / c2).sqrt() + a.eps) + a.weight_decay * p[i]);
        }
        Ok(())
    }

    fn im2col(&mut self, x: &Vec<f32>, cols: &mut Vec<f32>, cv: Conv) -> Result<()> {
        vision::im2col(x, cols, cv)
    }
    fn col2im(&mut self, dcols: &Vec<f32>, dx: &mut Vec<f32>, cv: Conv) -> Result<()> {
        vision::col2im(dcols, dx, cv)
    }
    fn batchnorm_fwd(&mut self, n: NormFwd<'_, Vec<f32>>, m: usize) -> Result<()> {
        vision::batchnorm_fwd(n, m)
    }
    fn batchnorm_bwd(&mut self, n: NormBwd<'_, Vec<f32>>, m: usize) -> Result<()> {
        vision::batchnorm_bwd(n, m)
    }
    fn maxpool_fwd(&mut self, x: &Vec<f32>, out: &mut Vec<f32>, arg: &mut Vec<f32>, cv: Conv) -> Result<()> {
        vision::maxpool_fwd(x, out, arg, cv)
    }
    fn maxpool_bwd(&mut self, dout: &Vec<f32>, arg: &Vec<f32>, dx: &mut Vec<f32>, cv: Conv) -> Result<()> {
        vision::maxpool_bwd(dout, arg, dx, cv)
    }
    fn avgpool_fwd(&mut self, x: &Vec<f32>, out: &mut Vec<f32>, c: usize, n: usize) -> Result<()> {
        vision::avgpool_fwd(x, out, c, n)
    }
    fn avgpool_bwd(&mut self, dout: &Vec<f32>, dx: &mut Vec<f32>, c: usize, n: usize) -> Result<()> {
        vision::avgpool_bwd(dout, dx, c, n)
    }
}

mod gpt_ops;
mod vision;

#[cfg(test)]
mod tests;
