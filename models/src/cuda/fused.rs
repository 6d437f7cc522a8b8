//! The fused products of [`Ops`](crate::ops::Ops) on CUDA: one cuBLASLt call ([`super::lt`])
//! per projection with its bias or GELU, the results written only as bf16 twins
//! ([`super::twins`]); the GELU's backward as one kernel over those bf16 values. A product the
//! epilogues do not take (too thin for bf16, batched, or no cuBLASLt) runs as the separate ops
//! instead.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::args::{int, launch};
use super::grid::{chunking, col_parts, elems};
use super::lt::{Epilogue, Lt, Ptrs};
use super::twins::{self, Twin};
use super::{CudaOps, BF16_MIN_SIDE};
use crate::ops::{separate, Mm};
use crate::{ModelError, Result};

type Buf = CudaSlice<f32>;

/// An error unless the buffers at `ats` are distinct.
fn distinct(what: &str, ats: &[u64]) -> Result<()> {
    if (1..ats.len()).any(|i| ats[..i].contains(&ats[i])) {
        return Err(ModelError::Config(format!("{what}: a buffer passed twice")));
    }
    Ok(())
}

impl CudaOps {
    /// Whether `mm` runs as one cuBLASLt product with its epilogue.
    fn fuses(&self, mm: &Mm) -> bool {
        self.lt.is_some() && Lt::fits(mm) && mm.m.min(mm.n).min(mm.k) >= BF16_MIN_SIDE
    }

    pub(super) fn fused_bias(&mut self, mm: Mm, a: &Buf, w: &Buf, bias: &Buf, out: &mut Buf) -> Result<()> {
        if !self.fuses(&mm) {
            return separate::matmul_bias(self, mm, [a, w, bias], out);
        }
        self.twins.wrote(out);
        self.epilogue(mm, Epilogue::Bias, [a, w], Some(bias), out, None, None)
    }

    pub(super) fn fused_bias_residual(
        &mut self,
        mm: Mm,
        [a, w, bias, x]: [&Buf; 4],
        tmp: &mut Buf,
        out: &mut Buf,
    ) -> Result<()> {
        if !self.fuses(&mm) {
            return separate::matmul_bias_residual(self, mm, [a, w, bias, x], tmp, out);
        }
        // cuBLASLt reads x's f32 as C (`epilogue` checks its size).
        self.twins.readable(x)?;
        self.twins.wrote(out);
        self.epilogue(mm, Epilogue::BiasResidual, [a, w], Some(bias), out, None, Some(x))
    }

    pub(super) fn fused_bias_gelu(
        &mut self,
        mm: Mm,
        [a, w, bias]: [&Buf; 3],
        pre: &mut Buf,
        out: &mut Buf,
    ) -> Result<()> {
        if !self.fuses(&mm) {
            return separate::matmul_bias_gelu(self, mm, [a, w, bias], pre, out);
        }
        self.twins.wrote(pre);
        self.twins.wrote(out);
        self.epilogue(mm, Epilogue::GeluAuxBias, [a, w], Some(bias), out, Some(pre), None)
    }

    /// The product into `tmp`'s twin alone, then one pass over bf16 values: `dpre`'s twin and
    /// the bias gradient's partial sums (summed in a fixed order, no atomics).
    pub(super) fn fused_dgelu(
        &mut self,
        mm: Mm,
        [dout, w, pre]: [&Buf; 3],
        tmp: &mut Buf,
        dpre: &mut Buf,
        dbias: &mut Buf,
    ) -> Result<()> {
        if !self.fuses(&mm) {
            // `pre` held only in bf16 (a fused forward at a shape this backward does not fuse)
            // is refused by gelu_bwd's argument check.
            return separate::matmul_dgelu(self, mm, [dout, w, pre], tmp, dpre, dbias);
        }
        let len = mm.m * mm.n;
        if [pre.len(), tmp.len(), dpre.len()] != [len; 3] || dbias.len() != mm.n {
            return Err(ModelError::Config(format!("fused GELU backward {mm:?}: buffer sizes do not match")));
        }
        let ats = [twins::address(pre), twins::address(tmp), twins::address(dpre)];
        distinct("fused GELU backward", &ats)?;
        self.twins.wrote(tmp);
        self.twins.wrote(dpre);
        self.twins.wrote(dbias);
        self.epilogue(mm, Epilogue::Plain, [dout, w], None, tmp, None, None)?;
        self.holding_twins(|ops, held| ops.dgelu_on_twins(&mm, [pre, tmp, dpre], dbias, held))
    }

    /// Runs `f` with a list for the twins it takes out, and puts every one back after,
    /// whatever `f` returned.
    fn holding_twins(&mut self, f: impl FnOnce(&mut Self, &mut Vec<(u64, Twin)>) -> Result<()>) -> Result<()> {
        let mut held = Vec::with_capacity(5);
        let done = f(self, &mut held);
        for (at, t) in held {
            self.twins.put(at, t);
        }
        done
    }

    /// [`CudaOps::fused_dgelu`]'s pass, with the twins of pre, tmp and dpre in `held`.
    fn dgelu_on_twins(
        &mut self,
        mm: &Mm,
        [pre, tmp, dpre]: [&Buf; 3],
        dbias: &mut Buf,
        held: &mut Vec<(u64, Twin)>,
    ) -> Result<()> {
        let t = self.twin_of(pre)?;
        held.push((twins::address(pre), t));
        let t = self.twin_of(tmp)?;
        held.push((twins::address(tmp), t));
        let t = self.twin_for(twins::address(dpre), dpre.len())?;
        held.push((twins::address(dpre), t));
        let (r, c) = (mm.m, mm.n);
        // Blocks of 256 columns (Lt::fits: c % 8 == 0, so rows start 16-byte aligned).
        let (chunks, per) = chunking(r, c.div_ceil(256), 64);
        let (rr, cc, pp, kk) = (int(r)?, int(c)?, int(per)?, int(chunks)?);
        let [(_, x), (_, d), (_, dx)] = &mut held[..] else {
            return Err(ModelError::Device("fused GELU backward: its three twins not held".into()));
        };
        let (xh, dh, dxh) = (&x.half, &d.half, &mut dx.half);
        self.with_scratch(chunks * c, |ops, part| {
            let grid = LaunchConfig { grid_dim: (c.div_ceil(256) as u32, chunks as u32, 1), ..col_parts(c, chunks) };
            launch!(ops, "dgelu_h_part", grid; xh, dh, &mut *dxh, &mut *part, &rr, &cc, &pp)?;
            launch!(ops, "col_finish", elems(c); &*part, dbias, &kk, &cc)
        })?;
        dx.valid = true;
        dx.only = true;
        Ok(())
    }

    /// `d = epi(a w)` on cuBLASLt: `a` and `w` through their twins, `d` (and `aux`, the
    /// pre-activation, for the forward GELU) written into their twins alone; for
    /// [`Epilogue::BiasResidual`] `d` is written as f32 and `c` (f32) added.
    #[allow(clippy::too_many_arguments)]
    fn epilogue(
        &mut self,
        mm: Mm,
        epi: Epilogue,
        [a, w]: [&Buf; 2],
        bias: Option<&Buf>,
        d: &Buf,
        aux: Option<&Buf>,
        c: Option<&Buf>,
    ) -> Result<()> {
        let (ea, ew, ed) = mm.extents();
        let ok = a.len() >= ea
            && w.len() >= ew
            && d.len() >= ed
            && bias.map_or(!epi.has_bias(), |b| epi.has_bias() && b.len() == mm.n)
            && aux.map_or(!epi.has_aux(), |x| epi.has_aux() && x.len() == d.len())
            && c.map_or(!epi.f32_out(), |x| epi.f32_out() && x.len() == d.len());
        if !ok {
            return Err(ModelError::Config(format!("fused product {epi:?} {mm:?}: buffer sizes do not match")));
        }
        let mut ats = vec![twins::address(a), twins::address(w), twins::address(d)];
        ats.extend(aux.map(twins::address));
        distinct(&format!("fused product {epi:?}"), &ats)?;
        self.holding_twins(|ops, held| ops.epilogue_on_twins(&mm, epi, [a, w], bias, (d, aux, c), held))
    }

    /// [`CudaOps::epilogue`] with its twins in `held`: a, w, then d's and aux's where they
    /// are written in bf16, then the bias's where cuBLASLt takes the bias in bf16.
    fn epilogue_on_twins(
        &mut self,
        mm: &Mm,
        epi: Epilogue,
        [a, w]: [&Buf; 2],
        bias: Option<&Buf>,
        (d, aux, c): (&Buf, Option<&Buf>, Option<&Buf>),
        held: &mut Vec<(u64, Twin)>,
    ) -> Result<()> {
        let bias_bf16 = bias.is_some() && !epi.f32_out() && self.lt.as_ref().is_some_and(Lt::bias_bf16);
        for x in [a, w] {
            let t = self.twin_of(x)?;
            held.push((twins::address(x), t));
        }
        let half_d = !epi.f32_out();
        let outs: Vec<&Buf> = std::iter::once(d).filter(|_| half_d).chain(aux).collect();
        for x in &outs {
            let t = self.twin_for(twins::address(x), x.len())?;
            held.push((twins::address(x), t));
        }
        if let (Some(b), true) = (bias, bias_bf16) {
            let t = self.twin_of(b)?;
            held.push((twins::address(b), t));
        }
        let stream = self.stream().clone();
        // The addresses alone: every access here is ordered by the one stream all the ops
        // run on, so the borrow guards (which order other streams) may end at once.
        let at: Vec<u64> = held.iter_mut().map(|(_, t)| t.half.device_ptr_mut(&stream).0).collect();
        let f32_at = |x: &Buf| x.device_ptr(&stream).0;
        let p = Ptrs {
            a: at[0],
            b: at[1],
            d: if half_d { at[2] } else { f32_at(d) },
            aux: if aux.is_some() { at[2 + usize::from(half_d)] } else { 0 },
            c: c.map_or(0, f32_at),
            bias: match bias {
                Some(_) if bias_bf16 => at[at.len() - 1],
                Some(b) => f32_at(b),
                None => 0,
            },
        };
        let lt = self.lt.as_mut().ok_or_else(|| ModelError::Device("cuBLASLt not loaded".into()))?;
        // The buffers hold at least the element counts `epilogue` checked against mm's
        // extents (twins at least their buffers'), the bias mm.n elements of the type cuBLASLt
        // was told, in the types Ptrs names.
        lt.matmul(&stream, mm, epi, p)?;
        for (_, t) in &mut held[2..2 + outs.len()] {
            // The results written in bf16: their values now live in their twins alone.
            t.valid = true;
            t.only = true;
        }
        Ok(())
    }
}
