//! The convolution, batch-norm and pooling ops of [`Ops`](crate::ops::Ops) on CUDA (the
//! ResNet's): im2col and its adjoint, batch norm, max and average pooling, forward and backward.

use cudarc::driver::PushKernelArg;

use super::args::{check, int, launch, ConvArgs};
use super::grid::{channel_chunks, chunking, elems};
use super::CudaOps;
use crate::ops::{whole, Conv, NormBwd, NormFwd};
use crate::Result;

type Buf = cudarc::driver::CudaSlice<f32>;

pub(super) fn im2col(ops: &mut CudaOps, x: &Buf, cols: &mut Buf, cv: Conv) -> Result<()> {
    ops.twins.wrote(cols);
    check("im2col", x.len() == cv.c * cv.n * cv.h * cv.w && cols.len() == cv.col_rows() * cv.col_cols())?;
    let a = ConvArgs::new(cv)?;
    launch!(ops, "im2col", elems(cols.len()); x, cols, &a.c, &a.n, &a.h, &a.w, &a.k, &a.stride, &a.pad, &a.oh, &a.ow)
}

pub(super) fn col2im(ops: &mut CudaOps, dcols: &Buf, dx: &mut Buf, cv: Conv) -> Result<()> {
    ops.twins.wrote(dx);
    check("col2im", dx.len() == cv.c * cv.n * cv.h * cv.w && dcols.len() == cv.col_rows() * cv.col_cols())?;
    let a = ConvArgs::new(cv)?;
    launch!(ops, "col2im", elems(dx.len()); dcols, dx, &a.c, &a.n, &a.h, &a.w, &a.k, &a.stride, &a.pad, &a.oh, &a.ow)
}

pub(super) fn maxpool_fwd(ops: &mut CudaOps, x: &Buf, out: &mut Buf, arg: &mut Buf, cv: Conv) -> Result<()> {
    ops.twins.wrote(out);
    ops.twins.wrote(arg);
    check(
        "maxpool_fwd",
        x.len() == cv.c * cv.n * cv.h * cv.w && out.len() == cv.c * cv.col_cols() && arg.len() == out.len(),
    )?;
    let a = ConvArgs::new(cv)?;
    let cn = int(cv.c * cv.n)?;
    launch!(ops, "maxpool_fwd", elems(out.len()); x, out, arg, &cn, &a.h, &a.w, &a.k, &a.stride, &a.pad, &a.oh, &a.ow)
}

pub(super) fn maxpool_bwd(ops: &mut CudaOps, dout: &Buf, arg: &Buf, dx: &mut Buf, cv: Conv) -> Result<()> {
    ops.twins.wrote(dx);
    check(
        "maxpool_bwd",
        dout.len() == cv.c * cv.col_cols() && arg.len() == dout.len() && dx.len() == cv.c * cv.n * cv.h * cv.w,
    )?;
    let a = ConvArgs::new(cv)?;
    let cn = int(cv.c * cv.n)?;
    launch!(ops, "maxpool_bwd", elems(dx.len()); dout, arg, dx, &cn, &a.h, &a.w, &a.k, &a.stride, &a.pad, &a.oh, &a.ow)
}

pub(super) fn avgpool_fwd(ops: &mut CudaOps, x: &Buf, out: &mut Buf, c: usize, n: usize) -> Result<()> {
    ops.twins.wrote(out);
    check("avgpool_fwd", out.len() == n * c && whole(x.len(), n * c))?;
    let (cc, nn, hw) = (int(c)?, int(n)?, int(x.len() / (n * c))?);
    launch!(ops, "avgpool_fwd", elems(out.len()); x, out, &cc, &nn, &hw)
}

pub(super) fn avgpool_bwd(ops: &mut CudaOps, dout: &Buf, dx: &mut Buf, c: usize, n: usize) -> Result<()> {
    ops.twins.wrote(dx);
    check("avgpool_bwd", dout.len() == n * c && whole(dx.len(), n * c))?;
    let (cc, nn, hw) = (int(c)?, int(n)?, int(dx.len() / (n * c))?);
    launch!(ops, "avgpool_bwd", elems(dx.len()); dout, dx, &cc, &nn, &hw)
}

pub(super) fn batchnorm_fwd(ops: &mut CudaOps, n: NormFwd<'_, Buf>, m: usize) -> Result<()> {
    let NormFwd { x, g, b, out, mean, rstd } = n;
    ops.twins.wrote(out);
    ops.twins.wrote(mean);
    ops.twins.wrote(rstd);
    let c = g.len();
    check(
        "batchnorm_fwd",
        c > 0 && m > 0 && x.len() == c * m && out.len() == x.len() && mean.len() == c && rstd.len() == c,
    )?;
    let (chunks, per) = chunking(m, c, 2048);
    let (mm, pp) = (int(m)?, int(per)?);
    let cfg = channel_chunks(chunks, c);
    ops.with_scratch(2 * chunks * c, |ops, part| {
        launch!(ops, "bn_stats", cfg; x, &mut *part, &mm, &pp)?;
        launch!(ops, "bn_apply", cfg; x, g, b, &*part, out, mean, rstd, &mm, &pp)
    })
}

pub(super) fn batchnorm_bwd(ops: &mut CudaOps, n: NormBwd<'_, Buf>, m: usize) -> Result<()> {
    let NormBwd { x, g, mean, rstd, dout, dx, dg, db } = n;
    ops.twins.wrote(dx);
    ops.twins.wrote(dg);
    ops.twins.wrote(db);
    let c = g.len();
    check(
        "batchnorm_bwd",
        c > 0
            && m > 0
            && x.len() == c * m
            && dout.len() == x.len()
            && dx.len() == x.len()
            && dg.len() == c
            && db.len() == c,
    )?;
    let (chunks, per) = chunking(m, c, 2048);
    let (mm, pp) = (int(m)?, int(per)?);
    let cfg = channel_chunks(chunks, c);
    ops.with_scratch(2 * chunks * c, |ops, part| {
        launch!(ops, "bn_bwd_part", cfg; x, mean, rstd, dout, &mut *part, &mm, &pp)?;
        launch!(ops, "bn_bwd_apply", cfg; x, g, mean, rstd, dout, &*part, dx, dg, db, &mm, &pp)
    })
}
