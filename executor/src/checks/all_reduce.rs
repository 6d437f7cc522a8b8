//! `all-reduce`: a sweep of message sizes up to the bandwidth plateau; per size the mean time of
//! one call, algbw and busbw (nccl-tests' definitions) and an exact check of every reduced
//! element on every rank. Finds communication errors, hangs and low bus bandwidth.
//!
//! Each rank's input is a periodic pattern of small integers that depends on its rank, so the
//! sum is exact in bf16 and fp32 and a lost, doubled or misplaced contribution shows.

use anyhow::{Context, Result};
use gpusanity_common::bandwidth::{algbw_gbps, busbw_gbps, Collective};
use gpusanity_common::report::{CheckStatus, RankResult, SweepPoint};

use super::CheckCtx;
use crate::backend::Dtype;

pub const NAME: &str = "all-reduce";

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let cfg = &ctx.configs.all_reduce;
    let (rank, world) = (ctx.place.rank, ctx.place.world);
    let dtype = ctx.backend.coll_dtype();
    let pattern = Pattern::new(world);
    let sizes = ctx.configs.all_reduce_sizes();
    let max_elems = sizes.iter().map(|b| *b as usize / dtype.size()).max().unwrap_or(0);
    ctx.progress.phase(NAME, "prepare", 0);
    ctx.backend
        .all_reduce_prepare(max_elems, &pattern.input(rank))
        .context("allocating all-reduce buffers")?;
    let expected = pattern.expected_bytes(dtype);

    let mut sweep = Vec::with_capacity(sizes.len());
    for bytes in sizes {
        let elems = bytes as usize / dtype.size();
        ctx.progress.phase(NAME, "size", bytes);
        let secs = ctx
            .backend
            .all_reduce_run(elems, cfg.warmup, cfg.iters)
            .with_context(|| format!("all-reduce of {bytes} bytes"))?;
        let mut out = ctx.backend.all_reduce_output(elems).context("reading the result back")?;
        if ctx.faults.has("all-reduce-wrong", rank) && !out.is_empty() {
            out[0] ^= 0x40;
        }
        let bytes = (elems * dtype.size()) as u64;
        sweep.push(SweepPoint {
            bytes,
            time_us: secs * 1e6,
            algbw_gbps: algbw_gbps(bytes, secs),
            busbw_gbps: busbw_gbps(Collective::AllReduce, world, bytes, secs),
            wrong: count_wrong(&out, &expected, dtype.size()),
        });
    }
    ctx.backend.all_reduce_free();

    let wrong: u64 = sweep.iter().map(|p| p.wrong).sum();
    let mut r = RankResult::new(rank, if wrong == 0 { CheckStatus::Passed } else { CheckStatus::Failed });
    if let (Some(first), Some(last)) = (sweep.first(), sweep.last()) {
        r.metrics.insert("busbw_gbps".into(), last.busbw_gbps);
        r.metrics.insert("algbw_gbps".into(), last.algbw_gbps);
        r.metrics.insert("max_bytes".into(), last.bytes as f64);
        r.metrics.insert("small_time_us".into(), first.time_us);
    }
    let peak = sweep.iter().map(|p| p.busbw_gbps).fold(0.0, f64::max);
    r.metrics.insert("busbw_gbps_peak".into(), peak);
    r.metrics.insert("wrong_elements".into(), wrong as f64);
    r.notes.insert("dtype".into(), dtype.name().into());
    if wrong > 0 {
        let sizes: Vec<String> = sweep.iter().filter(|p| p.wrong > 0).map(|p| format!("{} B: {}", p.bytes, p.wrong)).collect();
        r.error = Some(format!("{wrong} reduced elements are wrong ({})", sizes.join(", ")));
    }
    r.sweep = sweep;
    Ok(r)
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
