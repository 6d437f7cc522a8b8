//! The fused products of [`Ops`] as the separate ops they fuse, exact in f32: the trait's
//! defaults, and what a backend runs for a product it does not fuse.

use super::{Mm, Ops};
use crate::Result;

/// [`Ops::matmul_bias`] as a product and a bias pass.
pub fn matmul_bias<O: Ops + ?Sized>(ops: &mut O, mm: Mm, [a, w, bias]: [&O::Buf; 3], out: &mut O::Buf) -> Result<()> {
    ops.matmul(mm, a, w, out)?;
    ops.add_bias(out, bias, mm.m)
}

/// [`Ops::matmul_bias_residual`] as a product into `tmp` and a bias-and-residual pass.
pub fn matmul_bias_residual<O: Ops + ?Sized>(
    ops: &mut O,
    mm: Mm,
    [a, w, bias, x]: [&O::Buf; 4],
    tmp: &mut O::Buf,
    out: &mut O::Buf,
) -> Result<()> {
    ops.matmul(mm, a, w, tmp)?;
    ops.add_bias_residual(tmp, bias, x, out, mm.m)
}

/// [`Ops::matmul_bias_gelu`] as a product into `pre` and a bias-and-GELU pass.
pub fn matmul_bias_gelu<O: Ops + ?Sized>(
    ops: &mut O,
    mm: Mm,
    [a, w, bias]: [&O::Buf; 3],
    pre: &mut O::Buf,
    out: &mut O::Buf,
) -> Result<()> {
    ops.matmul(mm, a, w, pre)?;
    ops.add_bias_gelu(pre, bias, out, mm.m)
}

/// [`Ops::matmul_dgelu`] as a product into `tmp`, GELU's backward and the column sums.
pub fn matmul_dgelu<O: Ops + ?Sized>(
    ops: &mut O,
    mm: Mm,
    [dout, w, pre]: [&O::Buf; 3],
    tmp: &mut O::Buf,
    dpre: &mut O::Buf,
    dbias: &mut O::Buf,
) -> Result<()> {
    ops.matmul(mm, dout, w, tmp)?;
    ops.gelu_bwd(pre, tmp, dpre)?;
    ops.col_sum(dpre, dbias, mm.m)
}
