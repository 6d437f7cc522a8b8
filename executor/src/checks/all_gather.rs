//! `all-gather`: a sweep of message sizes; per size the mean time of one call, algbw and busbw
//! (nccl-tests' definitions: the size is the gathered buffer, busbw = algbw (n-1)/n) and an
//! exact check of every gathered element on every rank. Finds communication errors, hangs and
//! low bus bandwidth.

use anyhow::Result;
use gpusanity_common::report::RankResult;

use super::all_reduce::count_wrong;
use super::collective::{exchange_expected, exchange_period, run_sweep, sweep_result, Sweep};
use super::CheckCtx;
use crate::backend::{CollOp, Dtype, GroupId};

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::AllGather;

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let (rank, world) = (ctx.place.rank, ctx.place.world);
    let dtype = ctx.backend.coll_dtype();
    let expected: Vec<Vec<u8>> = (0..world).map(|r| exchange_expected(r, 0, dtype)).collect();
    let cfg = ctx.configs.all_gather.clone();
    let sweep = Sweep {
        check: NAME,
        op: CollOp::AllGather,
        group: GroupId::WORLD,
        cfg: &cfg,
    };
    let points = run_sweep(ctx, &sweep, &exchange_period(rank, 0), |out, elems| verify(out, elems, &expected, dtype))?;
    Ok(sweep_result(rank, points, dtype, "gathered"))
}

/// Wrong elements of a gathered buffer of `elems` elements: block `r` must be rank `r`'s input
/// (`expected[r]`, one period of it).
pub fn verify(out: &[u8], elems: usize, expected: &[Vec<u8>], dtype: Dtype) -> u64 {
    let n = expected.len();
    let b = elems / n.max(1) * dtype.size();
    if out.len() != elems * dtype.size() || b == 0 {
        return elems as u64;
    }
    out.chunks(b).zip(expected).map(|(block, exp)| count_wrong(block, exp, dtype.size())).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gathered(n: usize, c: usize, dtype: Dtype) -> Vec<u8> {
        let mut out = Vec::new();
        for r in 0..n {
            let p = exchange_period(r, 0);
            for k in 0..c {
                dtype.encode(p[k % p.len()] as f32, &mut out);
            }
        }
        out
    }

    #[test]
    fn verifier_accepts_a_right_gather_and_rejects_wrong_ones() {
        for dtype in [Dtype::F32, Dtype::Bf16] {
            let (n, c) = (3, 600);
            let exp: Vec<Vec<u8>> = (0..n).map(|r| exchange_expected(r, 0, dtype)).collect();
            let good = gathered(n, c, dtype);
            assert_eq!(verify(&good, n * c, &exp, dtype), 0);
            // Blocks 1 and 2 swapped: every element of both is wrong.
            let b = c * dtype.size();
            let mut swapped = good.clone();
            swapped[b..2 * b].copy_from_slice(&good[2 * b..3 * b]);
            swapped[2 * b..3 * b].copy_from_slice(&good[b..2 * b]);
            assert_eq!(verify(&swapped, n * c, &exp, dtype), 2 * c as u64);
            // One flipped element.
            let mut one = good.clone();
            one[b + 3 * dtype.size()] ^= 0x40;
            assert_eq!(verify(&one, n * c, &exp, dtype), 1);
            // A short result is all wrong.
            assert_eq!(verify(&good[..b], n * c, &exp, dtype), (n * c) as u64);
        }
    }
}
