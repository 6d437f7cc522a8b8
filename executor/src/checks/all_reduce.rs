//! `all-reduce`: a sweep of message sizes up to the bandwidth plateau; per size the mean time of
//! one call, algbw and busbw (nccl-tests' definitions) and an exact check of every reduced
//! element on every rank. Finds communication errors, hangs and low bus bandwidth.
//!
//! Each rank's input is a periodic pattern of small integers that depends on its rank, so the
//! sum is exact in bf16 and fp32 and a lost, doubled or misplaced contribution shows.

use anyhow::Result;
use gpusanity_common::report::RankResult;

use super::collective::{run_sweep, sweep_result, Sweep};
use super::CheckCtx;
use crate::backend::{CollOp, Dtype, GroupId};

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::AllReduce;

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let (rank, world) = (ctx.place.rank, ctx.place.world);
    let dtype = ctx.backend.coll_dtype();
    let pattern = Pattern::new(world);
    let expected = pattern.expected_bytes(dtype);
    let cfg = ctx.configs.all_reduce.clone();
    let sweep = Sweep {
        check: NAME,
        op: CollOp::AllReduce,
        group: GroupId::WORLD,
        cfg: &cfg,
    };
    let points = run_sweep(ctx, &sweep, &pattern.input(rank), |out, _| count_wrong(out, &expected, dtype.size()))?;
    Ok(sweep_result(rank, points, dtype, "reduced"))
}

/// The periodic input of every rank and the exact sum.
#[derive(Debug, Clone)]
pub struct Pattern {
    world: usize,
    period: usize,
}

impl Pattern {
    /// The period keeps every partial sum an integer <= 256, exact in bf16.
    pub fn new(world: usize) -> Pattern {
        let period = (256 / world.max(1)).clamp(2, 251);
        Pattern { world, period }
    }

    fn value(&self, j: usize, rank: usize) -> u8 {
        // Rank-dependent offset; values stay below the period.
        ((j + 7 * rank) % self.period) as u8
    }

    /// One period of `rank`'s input.
    pub fn input(&self, rank: usize) -> Vec<u8> {
        (0..self.period).map(|j| self.value(j, rank)).collect()
    }

    /// One period of the exact sum, encoded as `dtype`.
    pub fn expected_bytes(&self, dtype: Dtype) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.period * dtype.size());
        for j in 0..self.period {
            let s: u32 = (0..self.world).map(|r| self.value(j, r) as u32).sum();
            dtype.encode(s as f32, &mut out);
        }
        out
    }
}

/// Elements of `out` that differ from the periodic `expected` (both raw bytes, `elem` bytes
/// per element). Whole periods are compared as byte slices first, so a clean result costs
/// one memcmp per period.
pub fn count_wrong(out: &[u8], expected: &[u8], elem: usize) -> u64 {
    let mut wrong = 0u64;
    for chunk in out.chunks(expected.len()) {
        let exp = &expected[..chunk.len()];
        if chunk != exp {
            wrong += chunk.chunks(elem).zip(exp.chunks(elem)).filter(|(a, b)| a != b).count() as u64;
        }
    }
    wrong
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expected_sum_is_exact_and_verifier_counts_errors() {
        for world in [1, 2, 3, 8, 64] {
            let p = Pattern::new(world);
            for dtype in [Dtype::F32, Dtype::Bf16] {
                // Build the true sum element by element, through the dtype.
                let n = 3 * p.period + 5;
                let inputs: Vec<Vec<u8>> = (0..world).map(|r| p.input(r)).collect();
                let mut out = Vec::new();
                for i in 0..n {
                    let s: f32 = inputs.iter().map(|v| v[i % p.period] as f32).sum();
                    assert_eq!(dtype.round(s), s, "sum not exact for world {world}");
                    dtype.encode(s, &mut out);
                }
                let exp = p.expected_bytes(dtype);
                assert_eq!(count_wrong(&out, &exp, dtype.size()), 0);
                // One missing contribution of rank 0 at an element where it is non-zero.
                let i = (1..n).find(|i| inputs[0][i % p.period] != 0).unwrap();
                let wrong = dtype.decode(&out, i) - inputs[0][i % p.period] as f32;
                let mut enc = Vec::new();
                dtype.encode(wrong, &mut enc);
                out[i * dtype.size()..(i + 1) * dtype.size()].copy_from_slice(&enc);
                assert_eq!(count_wrong(&out, &exp, dtype.size()), 1);
                // Stale NaN fill is wrong everywhere.
                let mut nan = Vec::new();
                for _ in 0..n {
                    dtype.encode(f32::NAN, &mut nan);
                }
                assert_eq!(count_wrong(&nan, &exp, dtype.size()), n as u64);
            }
        }
    }

    #[test]
    fn inputs_differ_between_ranks() {
        let p = Pattern::new(4);
        assert_ne!(p.input(0), p.input(1));
    }
}
