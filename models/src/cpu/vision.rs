//! The CPU's batch norm and max pooling (the ResNet ops with the longest loops), as plain
//! loops over channel-major tensors.

use super::{check, LN_EPS};
use crate::ops::Conv;
use crate::Result;

pub(super) fn batchnorm_fwd(
    x: &[f32],
    g: &[f32],
    b: &[f32],
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    m: usize,
) -> Result<()> {
    let c = g.len();
    check("batchnorm_fwd", x.len() == c * m && out.len() == x.len() && mean.len() == c && rstd.len() == c)?;
    for ch in 0..c {
        let row = &x[ch * m..(ch + 1) * m];
        let mu = row.iter().sum::<f32>() / m as f32;
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f32>() / m as f32;
        let rs = 1.0 / (var + LN_EPS).sqrt();
        for j in 0..m {
            out[ch * m + j] = (row[j] - mu) * rs * g[ch] + b[ch];
        }
        mean[ch] = mu;
        rstd[ch] = rs;
    }
    Ok(())
}
// The arguments of the `Ops` method it implements.
#[allow(clippy::too_many_arguments)]
pub(super) fn batchnorm_bwd(
    x: &[f32],
    g: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dout: &[f32],
    dx: &mut [f32],
    dg: &mut [f32],
    db: &mut [f32],
    m: usize,
) -> Result<()> {
    let c = g.len();
    check(
        "batchnorm_bwd",
        x.len() == c * m && dout.len() == x.len() && dx.len() == x.len() && dg.len() == c && db.len() == c,
    )?;
    for ch in 0..c {
        let (mu, rs) = (mean[ch], rstd[ch]);
        let (mut sdy, mut sdyx) = (0f32, 0f32);
        for j in 0..m {
            let xh = (x[ch * m + j] - mu) * rs;
            sdy += dout[ch * m + j];
            sdyx += dout[ch * m + j] * xh;
        }
        dg[ch] = sdyx;
        db[ch] = sdy;
        let (a, b) = (sdy / m as f32, sdyx / m as f32);
        for j in 0..m {
            let xh = (x[ch * m + j] - mu) * rs;
            dx[ch * m + j] = g[ch] * rs * (dout[ch * m + j] - a - xh * b);
        }
    }
    Ok(())
}
pub(super) fn maxpool_fwd(x: &[f32], out: &mut [f32], arg: &mut [f32], cv: Conv) -> Result<()> {
    let (oh, ow, hw) = (cv.oh(), cv.ow(), cv.h * cv.w);
    check("maxpool_fwd", x.len() == cv.c * cv.n * hw && out.len() == cv.c * cv.col_cols() && arg.len() == out.len())?;
    for cn in 0..cv.c * cv.n {
        for oy in 0..oh {
            for ox in 0..ow {
                let (mut best, mut at) = (f32::NEG_INFINITY, 0usize);
                for ky in 0..cv.k {
                    for kx in 0..cv.k {
                        let iy = (oy * cv.stride + ky) as isize - cv.pad as isize;
                        let ix = (ox * cv.stride + kx) as isize - cv.pad as isize;
                        if iy >= 0 && ix >= 0 && (iy as usize) < cv.h && (ix as usize) < cv.w {
                            let j = iy as usize * cv.w + ix as usize;
                            if x[cn * hw + j] > best || x[cn * hw + j].is_nan() {
                                best = x[cn * hw + j];
                                at = j;
                            }
                        }
                    }
                }
                let o = (cn * oh + oy) * ow + ox;
                out[o] = best;
                arg[o] = at as f32;
            }
        }
    }
    Ok(())
}
