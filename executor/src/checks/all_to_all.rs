//! `all-to-all`: a sweep of message sizes; per size the mean time of one call, algbw and busbw
//! (nccl-tests' definitions: the size is each rank's send buffer, busbw = algbw (n-1)/n) and an
//! exact check of every received block on every rank: block `j` of rank `i` must be block `i`
//! of rank `j`'s input. Finds communication errors, hangs and low bus bandwidth.

use anyhow::Result;
use gpusanity_common::report::RankResult;

use super::all_reduce::count_wrong;
use super::collective::{exchange_expected, exchange_period, run_sweep, sweep_result, Sweep};
use super::CheckCtx;
use crate::backend::{CollOp, Dtype, GroupId};

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::AllToAll;

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let (rank, world) = (ctx.place.rank, ctx.place.world);
    let dtype = ctx.backend.coll_dtype();
    let cfg = ctx.configs.all_to_all.clone();
    let sweep =
        Sweep { check: NAME, op: CollOp::AllToAll, group: GroupId::WORLD, cfg: &cfg };
    let points =
        run_sweep(ctx, &sweep, &exchange_period(rank, 0), |out, elems| verify(out, elems, rank, world, dtype))?;
    Ok(sweep_result(rank, points, dtype, "exchanged"))
}

/// Wrong elements of rank `rank`'s all-to-all result of `elems` elements over `n` ranks.
pub fn verify(out: &[u8], elems: usize, rank: usize, n: usize, dtype: Dtype) -> u64 {
    let c = elems / n.max(1);
    if out.len() != elems * dtype.size() || c == 0 {
        return elems as u64;
    }
    out.chunks(c * dtype.size())
        .enumerate()
        .map(|(j, block)| count_wrong(block, &exchange_expected(j, rank * c, dtype), dtype.size()))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What rank `rank` receives from a correct all-to-all.
    fn received(rank: usize, n: usize, c: usize, dtype: Dtype) -> Vec<u8> {
        let mut out = Vec::new();
        for j in 0..n {
            let p = exchange_period(j, 0);
            for k in 0..c {
                dtype.encode(p[(rank * c + k) % p.len()] as f32, &mut out);
            }
        }
        out
    }

    #[test]
    fn verifier_accepts_a_right_exchange_and_rejects_wrong_ones() {
        for dtype in [Dtype::F32, Dtype::Bf16] {
            let (n, c) = (4, 512);
            for rank in 0..n {
                let good = received(rank, n, c, dtype);
                assert_eq!(verify(&good, n * c, rank, n, dtype), 0, "rank {rank}");
            }
            // Rank 1 got rank 2's blocks (a wrong destination): all wrong.
            let other = received(2, n, c, dtype);
            assert_eq!(verify(&other, n * c, 1, n, dtype), (n * c) as u64);
            // One element lost (NaN).
            let mut one = received(0, n, c, dtype);
            let mut nan = Vec::new();
            dtype.encode(f32::NAN, &mut nan);
            one[..dtype.size()].copy_from_slice(&nan);
            assert_eq!(verify(&one, n * c, 0, n, dtype), 1);
        }
    }
}
