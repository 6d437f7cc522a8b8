//! `reduce-scatter`: nccl-tests' fifth collective. A sweep of message sizes; per size the mean
//! time of one call, algbw and busbw (nccl-tests' definitions: the size is the send buffer of
//! one block per rank, busbw = algbw (n-1)/n) and an exact check on every rank of its block of
//! the sum. Finds communication errors, hangs and low bus bandwidth.

use anyhow::Result;
use gpusanity_common::report::RankResult;
use gpusanity_common::CheckId;

use super::all_reduce::{count_wrong, Pattern};
use super::collective::{run_sweep, sweep_result, Sweep};
use super::CheckCtx;
use crate::backend::{CollOp, GroupId};

pub const NAME: CheckId = CheckId::ReduceScatter;

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let (rank, world) = (ctx.place.rank, ctx.place.world);
    let dtype = ctx.backend.coll_dtype();
    let pattern = Pattern::new(world);
    let expected = pattern.expected_bytes(dtype);
    let cfg = ctx.configs.reduce_scatter.clone();
    let sweep = Sweep {
        check: NAME,
        op: CollOp::ReduceScatter,
        group: GroupId::WORLD,
        cfg: &cfg,
    };
    let verify = |out: &[u8], elems: usize| verify(out, elems / world.max(1), rank, &expected, dtype.size());
    let points = run_sweep(ctx, &sweep, &pattern.input(rank), verify)?;
    Ok(sweep_result(rank, points, dtype, "reduced"))
}

/// Wrong elements of this rank's block of `block` elements: block `rank` of the sum, which
/// starts `rank * block` elements into the periodic `expected` sum (`elem` bytes each).
pub fn verify(out: &[u8], block: usize, rank: usize, expected: &[u8], elem: usize) -> u64 {
    let period = expected.len() / elem.max(1);
    if out.len() != block * elem || period == 0 {
        return block as u64;
    }
    let phase = (rank * block % period) * elem;
    let rotated = [&expected[phase..], &expected[..phase]].concat();
    count_wrong(out, &rotated, elem)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Dtype;

    #[test]
    fn verifier_takes_the_rank_s_block_of_the_sum() {
        let (world, block) = (3, 700);
        let pattern = Pattern::new(world);
        let expected = pattern.expected_bytes(Dtype::F32);
        // The whole sum, as an all-reduce would give it; rank r keeps block r.
        let whole: Vec<u8> = expected.iter().copied().cycle().take(world * block * 4).collect();
        for rank in 0..world {
            let mine = &whole[rank * block * 4..(rank + 1) * block * 4];
            assert_eq!(verify(mine, block, rank, &expected, 4), 0, "rank {rank}");
            let other = &whole[((rank + 1) % world) * block * 4..][..block * 4];
            assert!(verify(other, block, rank, &expected, 4) > 0, "rank {rank} given another block");
            let mut one = mine.to_vec();
            one[8] ^= 0x40;
            assert_eq!(verify(&one, block, rank, &expected, 4), 1);
        }
        assert_eq!(verify(&whole[..8], block, 0, &expected, 4), block as u64, "a short result is all wrong");
    }
}
