//! [`Ops`] for [`CudaOps`]: each op checks its sizes and launches its kernel on the stream.

use cudarc::driver::{CudaSlice, PushKernelArg};

use super::args::{check, int, launch};
use super::grid::{bias_grid, chunking, col_parts, elems, quads, rows};
use super::{dev, twins, vision, CudaOps, BF16_MIN_SIDE};
use crate::data::TokenRows;
use crate::ops::{whole, Adam, Conv, GraphRun, Heads, Mm, NormBwd, NormFwd, Ops};
use crate::Result;

type Buf = CudaSlice<f32>;

impl Ops for CudaOps {
    type Buf = Buf;

    fn describe(&self) -> String {
        let fused = match &self.lt_missing {
            None => "projections with their bias, GELU and residual fused into cuBLASLt epilogues".to_string(),
            Some(why) => format!("no fused epilogues ({why})"),
        };
        format!(
            "cuda ({}; cuBLAS tensor-core products: bf16 copies of the operands where every side is at least {BF16_MIN_SIDE}, TF32 below, fp32 accumulation; {fused}; NVRTC kernels)",
            self.device.name()
        )
    }
    fn upload(&mut self, x: &[f32]) -> Result<Buf> {
        self.graphs.refuse("an upload")?;
        let b = self.stream().clone_htod(x).map_err(|e| dev("upload", e))?;
        self.twins.allocated(&b);
        Ok(b)
    }
    fn zeros(&mut self, n: usize) -> Result<Buf> {
        self.graphs.refuse("an allocation")?;
        let b = self.stream().alloc_zeros(n.max(1)).map_err(|e| dev(&format!("allocating {n} f32"), e))?;
        self.twins.allocated(&b);
        Ok(b)
    }
    fn download(&mut self, b: &Buf) -> Result<Vec<f32>> {
        self.graphs.refuse("a download")?;
        self.twins.readable(b)?;
        let v = self.stream().clone_dtoh(b).map_err(|e| dev("download", e))?;
        self.sync()?;
        Ok(v)
    }
    fn len(b: &Buf) -> usize {
        b.len()
    }
    fn sync(&mut self) -> Result<()> {
        self.graphs.refuse("a synchronization")?;
        self.stream().synchronize().map_err(|e| dev("synchronize", e))
    }
    fn fill(&mut self, b: &mut Buf, v: f32) -> Result<()> {
        self.twins.wrote(b);
        let n = int(b.len())?;
        launch!(self, "fill", elems(b.len()); b, &v, &n)
    }
    fn set(&mut self, b: &mut Buf, i: usize, v: f32) -> Result<()> {
        self.twins.wrote(b);
        check("set", i < b.len())?;
        let i = int(i)?;
        launch!(self, "set1", elems(1); b, &i, &v)
    }
    fn graph_step(&mut self, key: usize, body: &mut dyn FnMut(&mut Self) -> Result<()>) -> Result<GraphRun> {
        self.run_graph(key, body)
    }
    fn drop_graphs(&mut self) {
        self.forget_graphs();
    }
    fn write(&mut self, b: &mut Buf, x: &[f32]) -> Result<()> {
        self.graphs.refuse("a write from the host")?;
        self.twins.wrote(b);
        check("write", b.len() == x.len())?;
        self.stream().memcpy_htod(x, b).map_err(|e| dev("write", e))
    }
    fn matmul(&mut self, mm: Mm, a: &Buf, b: &Buf, c: &mut Buf) -> Result<()> {
        self.twins.wrote(c);
        self.gemm(mm, a, b, c)
    }
    fn matmul_bias(&mut self, mm: Mm, a: &Buf, w: &Buf, bias: &Buf, out: &mut Buf) -> Result<()> {
        self.fused_bias(mm, a, w, bias, out)
    }
    fn matmul_bias_residual(
        &mut self,
        mm: Mm,
        a: &Buf,
        w: &Buf,
        bias: &Buf,
        x: &Buf,
        tmp: &mut Buf,
        out: &mut Buf,
    ) -> Result<()> {
        self.fused_bias_residual(mm, [a, w, bias, x], tmp, out)
    }
    fn matmul_bias_gelu(&mut self, mm: Mm, a: &Buf, w: &Buf, bias: &Buf, pre: &mut Buf, out: &mut Buf) -> Result<()> {
        self.fused_bias_gelu(mm, [a, w, bias], pre, out)
    }
    fn matmul_dgelu(
        &mut self,
        mm: Mm,
        dout: &Buf,
        w: &Buf,
        pre: &Buf,
        tmp: &mut Buf,
        dpre: &mut Buf,
        dbias: &mut Buf,
    ) -> Result<()> {
        self.fused_dgelu(mm, [dout, w, pre], tmp, dpre, dbias)
    }
    fn axpy(&mut self, alpha: f32, x: &Buf, y: &mut Buf) -> Result<()> {
        self.twins.wrote(y);
        check("axpy", x.len() == y.len())?;
        let n = int(x.len())?;
        launch!(self, "axpy", elems(x.len()); &alpha, x, y, &n)
    }
    fn add(&mut self, a: &Buf, b: &Buf, out: &mut Buf) -> Result<()> {
        self.twins.wrote(out);
        check("add", a.len() == b.len() && a.len() == out.len())?;
        let (n, relu) = (int(a.len())?, 0i32);
        launch!(self, "add2", elems(a.len()); a, b, out, &n, &relu)
    }
    fn add_relu(&mut self, a: &Buf, b: &Buf, out: &mut Buf) -> Result<()> {
        self.twins.wrote(out);
        check("add_relu", a.len() == b.len() && a.len() == out.len())?;
        let (n, relu) = (int(a.len())?, 1i32);
        launch!(self, "add2", elems(a.len()); a, b, out, &n, &relu)
    }
    fn add_bias(&mut self, y: &mut Buf, bias: &Buf, r: usize) -> Result<()> {
        self.twins.wrote(y);
        check("add_bias", y.len() == r * bias.len())?;
        let (rr, c) = (int(r)?, int(bias.len())?);
        let at = twins::address(y);
        self.with_twin_out(
            at,
            y.len(),
            |ops, h| launch!(ops, "add_bias", bias_grid(r, bias.len()); y, h, bias, &rr, &c),
        )
    }
    fn add_bias_residual(&mut self, z: &Buf, bias: &Buf, x: &Buf, out: &mut Buf, r: usize) -> Result<()> {
        self.twins.wrote(out);
        check("add_bias_residual", z.len() == r * bias.len() && x.len() == z.len() && out.len() == z.len())?;
        let (rr, c) = (int(r)?, int(bias.len())?);
        launch!(self, "add_bias_residual", bias_grid(r, bias.len()); z, bias, x, out, &rr, &c)
    }
    fn add_bias_gelu(&mut self, y: &mut Buf, bias: &Buf, out: &mut Buf, r: usize) -> Result<()> {
        self.twins.wrote(y);
        self.twins.wrote(out);
        check("add_bias_gelu", y.len() == r * bias.len() && out.len() == y.len())?;
        let (rr, c) = (int(r)?, int(bias.len())?);
        let at = twins::address(out);
        self.with_twin_out(
            at,
            out.len(),
            |ops, h| launch!(ops, "add_bias_gelu", bias_grid(r, bias.len()); y, bias, out, h, &rr, &c),
        )
    }
    fn col_sum(&mut self, x: &Buf, out: &mut Buf, r: usize) -> Result<()> {
        self.twins.wrote(out);
        let c = out.len();
        check("col_sum", x.len() == r * c)?;
        let (chunks, per) = chunking(r, c.div_ceil(32), 64);
        let (rr, cc, pp, kk) = (int(r)?, int(c)?, int(per)?, int(chunks)?);
        self.with_scratch(chunks * c, |ops, part| {
            launch!(ops, "col_part", col_parts(c, chunks); x, &mut *part, &rr, &cc, &pp)?;
            launch!(ops, "col_finish", elems(c); &*part, out, &kk, &cc)
        })
    }
    fn embed_fwd(&mut self, tok: &Buf, wte: &Buf, wpe: &Buf, out: &mut Buf, t: usize, c: usize) -> Result<()> {
        self.twins.wrote(out);
        check("embed_fwd", out.len() == tok.len() * c && wpe.len() >= t * c)?;
        let (n, tt, cc) = (int(tok.len())?, int(t)?, int(c)?);
        launch!(self, "embed_fwd", elems(out.len()); tok, wte, wpe, out, &n, &tt, &cc)
    }
    fn embed_bwd(
        &mut self,
        tok: &Buf,
        by_token: &TokenRows<Buf>,
        dout: &Buf,
        dwte: &mut Buf,
        dwpe: &mut Buf,
        t: usize,
        c: usize,
    ) -> Result<()> {
        self.twins.wrote(dwte);
        self.twins.wrote(dwpe);
        let vocab = dwte.len().checked_div(c).unwrap_or(0);
        check(
            "embed_bwd",
            dout.len() == tok.len() * c
                && dwpe.len() >= t * c
                && t > 0
                && whole(dwte.len(), c)
                && by_token.rows.len() == tok.len()
                && by_token.starts.len() == vocab + 1,
        )?;
        let (n, tt, cc, vv) = (int(tok.len())?, int(t)?, int(c)?, int(vocab)?);
        launch!(self, "embed_bwd_wte", elems(dwte.len()); &by_token.rows, &by_token.starts, dout, dwte, &n, &vv, &cc)?;
        launch!(self, "embed_bwd_wpe", elems(t * c); dout, dwpe, &n, &tt, &cc)
    }
    fn layernorm_fwd(&mut self, n: NormFwd<'_, Buf>, c: usize) -> Result<()> {
        let NormFwd { x, g, b, out, mean, rstd } = n;
        self.twins.wrote(out);
        self.twins.wrote(mean);
        self.twins.wrote(rstd);
        let r = x.len() / c;
        check("layernorm_fwd", out.len() == x.len() && mean.len() == r && rstd.len() == r && g.len() == c)?;
        let (rr, cc) = (int(r)?, int(c)?);
        let at = twins::address(out);
        self.with_twin_out(
            at,
            out.len(),
            |ops, h| launch!(ops, "ln_fwd", rows(r); x, g, b, out, h, mean, rstd, &rr, &cc),
        )
    }
    fn layernorm_bwd(&mut self, n: NormBwd<'_, Buf>, c: usize) -> Result<()> {
        let NormBwd { x, g, mean, rstd, dout, dx, dg, db } = n;
        self.twins.wrote(dx);
        self.twins.wrote(dg);
        self.twins.wrote(db);
        let r = x.len() / c;
        check(
            "layernorm_bwd",
            dout.len() == x.len() && dx.len() == x.len() && mean.len() == r && dg.len() == c && db.len() == c,
        )?;
        let (rr, cc) = (int(r)?, int(c)?);
        let at = twins::address(dx);
        self.with_twin_out(
            at,
            dx.len(),
            |ops, h| launch!(ops, "ln_bwd_dx", rows(r); x, g, mean, rstd, dout, dx, h, &rr, &cc),
        )?;
        let (chunks, per) = chunking(r, c.div_ceil(32), 64);
        let (pp, kk) = (int(per)?, int(chunks)?);
        self.with_scratch(2 * chunks * c, |ops, part| {
            launch!(ops, "ln_dgdb_part", col_parts(c, chunks); x, mean, rstd, dout, &mut *part, &rr, &cc, &pp)?;
            launch!(ops, "col_finish", elems(c); &*part, dg, &kk, &cc)?;
            let second = part.slice(chunks * c..);
            launch!(ops, "col_finish", elems(c); &second, db, &kk, &cc)
        })
    }
    fn gelu_fwd(&mut self, x: &Buf, out: &mut Buf) -> Result<()> {
        self.twins.wrote(out);
        check("gelu_fwd", x.len() == out.len())?;
        let n = int(x.len())?;
        launch!(self, "gelu_fwd", elems(x.len()); x, out, &n)
    }
    fn gelu_bwd(&mut self, x: &Buf, dout: &Buf, dx: &mut Buf) -> Result<()> {
        self.twins.wrote(dx);
        check("gelu_bwd", x.len() == dout.len() && x.len() == dx.len())?;
        let n = int(x.len())?;
        let at = twins::address(dx);
        self.with_twin_out(at, dx.len(), |ops, h| launch!(ops, "gelu_bwd", quads(x.len()); x, dout, dx, h, &n))
    }
    fn relu_fwd(&mut self, x: &Buf, out: &mut Buf) -> Result<()> {
        self.twins.wrote(out);
        check("relu_fwd", x.len() == out.len())?;
        let n = int(x.len())?;
        launch!(self, "relu_fwd", elems(x.len()); x, out, &n)
    }
    fn relu_bwd(&mut self, y: &Buf, dout: &Buf, dx: &mut Buf) -> Result<()> {
        self.twins.wrote(dx);
        check("relu_bwd", y.len() == dout.len() && y.len() == dx.len())?;
        let n = int(y.len())?;
        launch!(self, "relu_bwd", elems(y.len()); y, dout, dx, &n)
    }
    fn attention_fwd(&mut self, qkv: &Buf, y: &mut Buf, lse: &mut Buf, hs: Heads, scale: f32) -> Result<()> {
        self.twins.wrote(y);
        self.twins.wrote(lse);
        self.attention_forward(qkv, y, lse, hs, scale)
    }
    fn attention_bwd(
        &mut self,
        qkv: &Buf,
        y: &Buf,
        lse: &Buf,
        dy: &Buf,
        dqkv: &mut Buf,
        hs: Heads,
        scale: f32,
    ) -> Result<()> {
        self.twins.wrote(dqkv);
        self.attention_backward([qkv, y, lse, dy], dqkv, hs, scale)
    }
    fn cross_entropy(
        &mut self,
        logits: &Buf,
        targets: &Buf,
        dlogits: &mut Buf,
        losses: &mut Buf,
        v: usize,
    ) -> Result<()> {
        self.twins.wrote(dlogits);
        self.twins.wrote(losses);
        let r = targets.len();
        check("cross_entropy", logits.len() == r * v && dlogits.len() == r * v && losses.len() == r)?;
        let (rr, vv) = (int(r)?, int(v)?);
        launch!(self, "cross_entropy", rows(r); logits, targets, dlogits, losses, &rr, &vv)
    }
    fn adamw(&mut self, p: &mut Buf, g: &Buf, m: &mut Buf, v: &mut Buf, a: Adam) -> Result<()> {
        self.twins.wrote(p);
        self.twins.wrote(m);
        self.twins.wrote(v);
        check("adamw", p.len() == g.len() && p.len() == m.len() && p.len() == v.len())?;
        let n = int(p.len())?;
        let (c1, c2) = (1.0 - a.beta1.powi(a.step as i32), 1.0 - a.beta2.powi(a.step as i32));
        let at = twins::address(p);
        self.with_twin_out(at, p.len(), |ops, h| {
            launch!(ops, "adamw", quads(p.len()); p, h, g, m, v, &n, &a.lr, &a.beta1, &a.beta2, &a.eps, &a.weight_decay, &c1, &c2, &a.grad_scale)
        })
    }
    fn im2col(&mut self, x: &Buf, cols: &mut Buf, cv: Conv) -> Result<()> {
        vision::im2col(self, x, cols, cv)
    }
    fn col2im(&mut self, dcols: &Buf, dx: &mut Buf, cv: Conv) -> Result<()> {
        vision::col2im(self, dcols, dx, cv)
    }
    fn batchnorm_fwd(&mut self, n: NormFwd<'_, Buf>, m: usize) -> Result<()> {
        vision::batchnorm_fwd(self, n, m)
    }
    fn batchnorm_bwd(&mut self, n: NormBwd<'_, Buf>, m: usize) -> Result<()> {
        vision::batchnorm_bwd(self, n, m)
    }
    fn maxpool_fwd(&mut self, x: &Buf, out: &mut Buf, arg: &mut Buf, cv: Conv) -> Result<()> {
        vision::maxpool_fwd(self, x, out, arg, cv)
    }
    fn maxpool_bwd(&mut self, dout: &Buf, arg: &Buf, dx: &mut Buf, cv: Conv) -> Result<()> {
        vision::maxpool_bwd(self, dout, arg, dx, cv)
    }
    fn avgpool_fwd(&mut self, x: &Buf, out: &mut Buf, c: usize, n: usize) -> Result<()> {
        vision::avgpool_fwd(self, x, out, c, n)
    }
    fn avgpool_bwd(&mut self, dout: &Buf, dx: &mut Buf, c: usize, n: usize) -> Result<()> {
        vision::avgpool_bwd(self, dout, dx, c, n)
    }
}
