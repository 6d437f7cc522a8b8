//! The CPU's layer norm, causal attention and cross-entropy (the GPT ops with the longest loops),
//! as plain loops over row-major tensors.

use super::{check, LN_EPS};
use crate::ops::{Heads, NormBwd, NormFwd};
use crate::Result;

pub(super) fn layernorm_fwd(n: NormFwd<'_, Vec<f32>>, c: usize) -> Result<()> {
    let NormFwd { x, g, b, out, mean, rstd } = n;
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

pub(super) fn layernorm_bwd(n: NormBwd<'_, Vec<f32>>, c: usize) -> Result<()> {
    let NormBwd { x, g, mean, rstd, dout, dx, dg, db } = n;
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

/// Where row `i` of sequence `b`, head `hh`, part `part` (0 queries, 1 keys, 2 values) starts
/// in the packed QKV rows `[b t, 3, h, d]`.
fn qkv_at(hs: Heads, b: usize, hh: usize, i: usize, part: usize) -> usize {
    ((b * hs.t + i) * 3 + part) * hs.h * hs.d + hh * hs.d
}

/// Where row `i` of sequence `b`, head `hh` starts in `[b t, h, d]`.
fn out_at(hs: Heads, b: usize, hh: usize, i: usize) -> usize {
    ((b * hs.t + i) * hs.h + hh) * hs.d
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn check_heads(what: &str, hs: Heads, qkv: usize, outs: &[usize], lse: usize) -> Result<()> {
    let rows = hs.b.checked_mul(hs.t).and_then(|r| r.checked_mul(hs.h)).and_then(|r| r.checked_mul(hs.d));
    let ok = rows.is_some_and(|n| qkv == 3 * n && outs.iter().all(|o| *o == n)) && lse == hs.b * hs.h * hs.t;
    check(what, ok)
}

/// Row by row: the scaled scores of the keys it sees, their log-sum-exp, the weighted values.
pub(super) fn attention_fwd(qkv: &[f32], y: &mut [f32], lse: &mut [f32], hs: Heads, scale: f32) -> Result<()> {
    check_heads("attention_fwd", hs, qkv.len(), &[y.len()], lse.len())?;
    let d = hs.d;
    let mut s = vec![0f32; hs.t];
    for b in 0..hs.b {
        for hh in 0..hs.h {
            for i in 0..hs.t {
                let q = &qkv[qkv_at(hs, b, hh, i, 0)..][..d];
                for (j, sj) in s[..=i].iter_mut().enumerate() {
                    *sj = scale * dot(q, &qkv[qkv_at(hs, b, hh, j, 1)..][..d]);
                }
                let max = s[..=i].iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
                let l = max + s[..=i].iter().map(|v| (v - max).exp()).sum::<f32>().ln();
                lse[(b * hs.h + hh) * hs.t + i] = l;
                let out = &mut y[out_at(hs, b, hh, i)..][..d];
                out.fill(0.0);
                for (j, sj) in s[..=i].iter().enumerate() {
                    let p = (sj - l).exp();
                    let v = &qkv[qkv_at(hs, b, hh, j, 2)..][..d];
                    out.iter_mut().zip(v).for_each(|(o, v)| *o += p * v);
                }
            }
        }
    }
    Ok(())
}

/// With `P` from the saved log-sum-exp, `dP = dy V^T` and `dS = P (dP - dy . y)`:
/// `dq = scale dS K`, `dk = scale dS^T Q`, `dv = P^T dy`.
pub(super) fn attention_bwd(
    qkv: &[f32],
    y: &[f32],
    lse: &[f32],
    dy: &[f32],
    dqkv: &mut [f32],
    hs: Heads,
    scale: f32,
) -> Result<()> {
    check_heads("attention_bwd", hs, qkv.len(), &[y.len(), dy.len()], lse.len())?;
    check("attention_bwd", dqkv.len() == qkv.len())?;
    let d = hs.d;
    dqkv.fill(0.0);
    for b in 0..hs.b {
        for hh in 0..hs.h {
            for i in 0..hs.t {
                let (o, qi) = (out_at(hs, b, hh, i), qkv_at(hs, b, hh, i, 0));
                let (dyi, q) = (&dy[o..][..d], &qkv[qi..][..d]);
                let delta = dot(dyi, &y[o..][..d]);
                let l = lse[(b * hs.h + hh) * hs.t + i];
                for j in 0..=i {
                    let (kj, vj) = (qkv_at(hs, b, hh, j, 1), qkv_at(hs, b, hh, j, 2));
                    let p = (scale * dot(q, &qkv[kj..][..d]) - l).exp();
                    let ds = scale * p * (dot(dyi, &qkv[vj..][..d]) - delta);
                    for e in 0..d {
                        dqkv[qi + e] += ds * qkv[kj + e];
                        dqkv[kj + e] += ds * q[e];
                        dqkv[vj + e] += p * dyi[e];
                    }
                }
            }
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
