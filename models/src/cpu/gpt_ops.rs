//! The CPU's layer norm, causal softmax and cross-entropy (the GPT ops with the longest loops),
//! as plain loops over row-major tensors.

use super::{check, LN_EPS};
use crate::ops::whole;
use crate::Result;

pub(super) fn layernorm_fwd(
    x: &[f32],
    g: &[f32],
    b: &[f32],
    out: &mut [f32],
    mean: &mut [f32],
    rstd: &mut [f32],
    c: usize,
) -> Result<()> {
    let rows = x.len() / c;
    check("layernorm_fwd", out.len() == x.len() && mean.len() == rows && rstd.len() == rows && g.len() == c)?;
    for r in 0..rows {
        let row = &x[r * c..(r + 1) * c];
        let mu = row.iter().sum::<f32>() / c as f32;
        let var = row.iter().map(|v| (v - mu) * (v - mu)).sum::<f32>() / c as f32;
        let rs = 1.0 / (var + LN_EPS).sqrt();
        for j in 0..c {
            out[r * c + j] = (row[j] - mu) * rs * g[j] + b[j];
        }
        mean[r] = mu;
        rstd[r] = rs;
    }
    Ok(())
}

// The arguments of the `Ops` method it implements.
#[allow(clippy::too_many_arguments)]
pub(super) fn layernorm_bwd(
    x: &[f32],
    g: &[f32],
    mean: &[f32],
    rstd: &[f32],
    dout: &[f32],
    dx: &mut [f32],
    dg: &mut [f32],
    db: &mut [f32],
    c: usize,
) -> Result<()> {
    let rows = x.len() / c;
    check(
        "layernorm_bwd",
        dout.len() == x.len() && dx.len() == x.len() && mean.len() == rows && dg.len() == c && db.len() == c,
    )?;
    dg.fill(0.0);
    db.fill(0.0);
    for r in 0..rows {
        let (mu, rs) = (mean[r], rstd[r]);
        let (mut s1, mut s2) = (0f32, 0f32);
        for j in 0..c {
            let xh = (x[r * c + j] - mu) * rs;
            let dxh = dout[r * c + j] * g[j];
            s1 += dxh;
            s2 += dxh * xh;
            dg[j] += dout[r * c + j] * xh;
            db[j] += dout[r * c + j];
        }
        let (s1, s2) = (s1 / c as f32, s2 / c as f32);
        for j in 0..c {
            let xh = (x[r * c + j] - mu) * rs;
            dx[r * c + j] += rs * (dout[r * c + j] * g[j] - s1 - xh * s2);
        }
    }
    Ok(())
}

pub(super) fn softmax_causal_fwd(s: &[f32], p: &mut [f32], t: usize, scale: f32) -> Result<()> {
    check("softmax_causal_fwd", s.len() == p.len() && whole(s.len(), t * t))?;
    for r in 0..s.len() / t {
        let i = r % t;
        let (srow, prow) = (&s[r * t..(r + 1) * t], &mut p[r * t..(r + 1) * t]);
        let max = srow[..=i].iter().fold(f32::NEG_INFINITY, |m, v| m.max(scale * v));
        let mut sum = 0.0;
        for j in 0..t {
            prow[j] = if j <= i { (scale * srow[j] - max).exp() } else { 0.0 };
            sum += prow[j];
        }
        prow.iter_mut().for_each(|v| *v /= sum);
    }
    Ok(())
}

pub(super) fn softmax_causal_bwd(p: &[f32], dp: &[f32], ds: &mut [f32], t: usize, scale: f32) -> Result<()> {
    check("softmax_causal_bwd", p.len() == dp.len() && p.len() == ds.len() && whole(p.len(), t * t))?;
    for r in 0..p.len() / t {
        let (p, dp) = (&p[r * t..(r + 1) * t], &dp[r * t..(r + 1) * t]);
        let dot: f32 = p.iter().zip(dp).map(|(a, b)| a * b).sum();
        for j in 0..t {
            ds[r * t + j] = scale * p[j] * (dp[j] - dot);
        }
    }
    Ok(())
}

pub(super) fn cross_entropy(
    logits: &[f32],
    targets: &[f32],
    dlogits: &mut [f32],
    losses: &mut [f32],
    v: usize,
) -> Result<()> {
    let rows = targets.len();
    check("cross_entropy", logits.len() == rows * v && dlogits.len() == rows * v && losses.len() == rows)?;
    for r in 0..rows {
        let row = &logits[r * v..(r + 1) * v];
        let max = row.iter().fold(f32::NEG_INFINITY, |m, x| m.max(*x));
        let sum: f32 = row.iter().map(|x| (x - max).exp()).sum();
        let tgt = targets[r] as usize;
        check("cross_entropy target", tgt < v)?;
        losses[r] = -(row[tgt] - max - sum.ln());
        for j in 0..v {
            let p = (row[j] - max).exp() / sum;
            dlogits[r * v + j] = (p - if j == tgt { 1.0 } else { 0.0 }) / rows as f32;
        }
    }
    Ok(())
}
