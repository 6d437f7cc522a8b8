//! The CPU's convolution (im2col and its adjoint), batch norm and pooling: the ResNet's ops,
//! as plain loops over channel-major tensors.

use super::{check, LN_EPS};
use crate::ops::{whole, Conv, NormBwd, NormFwd};
use crate::Result;

pub(super) fn batchnorm_fwd(n: NormFwd<'_, Vec<f32>>, m: usize) -> Result<()> {
    let NormFwd { x, g, b, out, mean, rstd } = n;
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
pub(super) fn batchnorm_bwd(n: NormBwd<'_, Vec<f32>>, m: usize) -> Result<()> {
    let NormBwd { x, g, mean, rstd, dout, dx, dg, db } = n;
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

/// Every element of the im2col matrix of `cv`, with the index of the input element it copies
/// (`None` in the zero padding).
fn conv_taps(cv: Conv) -> impl Iterator<Item = (usize, Option<usize>)> {
    let (oh, ow, hw) = (cv.oh(), cv.ow(), cv.h * cv.w);
    let ncols = cv.col_cols();
    (0..cv.col_rows() * ncols).map(move |e| {
        let (row, col) = (e / ncols, e % ncols);
        let (c, ky, kx) = (row / (cv.k * cv.k), row / cv.k % cv.k, row % cv.k);
        let (n, oy, ox) = (col / (oh * ow), col / ow % oh, col % ow);
        let iy = (oy * cv.stride + ky) as isize - cv.pad as isize;
        let ix = (ox * cv.stride + kx) as isize - cv.pad as isize;
        let inside = iy >= 0 && ix >= 0 && (iy as usize) < cv.h && (ix as usize) < cv.w;
        (e, inside.then(|| (c * cv.n + n) * hw + iy as usize * cv.w + ix as usize))
    })
}

pub(super) fn im2col(x: &[f32], cols: &mut [f32], cv: Conv) -> Result<()> {
    check("im2col", x.len() == cv.c * cv.n * cv.h * cv.w && cols.len() == cv.col_rows() * cv.col_cols())?;
    for (col, src) in conv_taps(cv) {
        cols[col] = src.map_or(0.0, |i| x[i]);
    }
    Ok(())
}

pub(super) fn col2im(dcols: &[f32], dx: &mut [f32], cv: Conv) -> Result<()> {
    check("col2im", dx.len() == cv.c * cv.n * cv.h * cv.w && dcols.len() == cv.col_rows() * cv.col_cols())?;
    dx.fill(0.0);
    for (col, src) in conv_taps(cv) {
        if let Some(i) = src {
            dx[i] += dcols[col];
        }
    }
    Ok(())
}

pub(super) fn maxpool_bwd(dout: &[f32], arg: &[f32], dx: &mut [f32], cv: Conv) -> Result<()> {
    check("maxpool_bwd", dout.len() == arg.len() && dx.len() == cv.c * cv.n * cv.h * cv.w)?;
    dx.fill(0.0);
    let (hw, ohw) = (cv.h * cv.w, cv.oh() * cv.ow());
    for (i, (d, a)) in dout.iter().zip(arg).enumerate() {
        dx[i / ohw * hw + *a as usize] += d;
    }
    Ok(())
}

pub(super) fn avgpool_fwd(x: &[f32], out: &mut [f32], c: usize, n: usize) -> Result<()> {
    check("avgpool_fwd", out.len() == n * c && whole(x.len(), n * c))?;
    let hw = x.len() / (n * c);
    for ch in 0..c {
        for b in 0..n {
            let s: f32 = x[(ch * n + b) * hw..(ch * n + b + 1) * hw].iter().sum();
            out[b * c + ch] = s / hw as f32;
        }
    }
    Ok(())
}

pub(super) fn avgpool_bwd(dout: &[f32], dx: &mut [f32], c: usize, n: usize) -> Result<()> {
    check("avgpool_bwd", dout.len() == n * c && whole(dx.len(), n * c))?;
    let hw = dx.len() / (n * c);
    for ch in 0..c {
        for b in 0..n {
            let v = dout[b * c + ch] / hw as f32;
            dx[(ch * n + b) * hw..(ch * n + b + 1) * hw].fill(v);
        }
    }
    Ok(())
}
