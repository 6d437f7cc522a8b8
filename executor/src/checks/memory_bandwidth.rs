//! `memory-bandwidth`: per rank, a copy of one device buffer into another (on GPU with the
//! backend's own kernel: 16-byte loads and stores, grid-stride; on CPU memcpy of host memory),
//! large enough to defeat the caches. Bandwidth counts the bytes read plus the bytes written;
//! the headline is the median of timed copies after warm-up, timed on the device. The copy is
//! verified exactly: every 16-byte word of the source and of the destination against the fill
//! pattern (on the device for a GPU), so a wrong, partial or misplaced copy fails the rank.

use anyhow::{Context, Result};
use gpusanity_common::report::{CheckStatus, RankResult};
use gpusanity_common::stats::median;

use super::CheckCtx;
use crate::backend::mem::{pattern_byte, WORD_BYTES};

pub const NAME: &str = gpusanity_common::CheckId::MemoryBandwidth.as_str();

/// The pattern's seed: any value; the rank is mixed in so that ranks hold different data.
const SEED: u32 = 0x6d65_6d00;

/// Read plus written bytes per second of one copy of `bytes`, in GB/s.
pub fn copy_gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        2.0 * bytes as f64 / seconds / 1e9
    } else {
        0.0
    }
}

/// The byte the `memory-bandwidth-wrong` fault overwrites: inside the buffer, away from its
/// start, different on every rank.
pub fn poke_offset(bytes: u64, rank: usize) -> u64 {
    (bytes / 2 + 4096 * rank as u64 + 5) % bytes.max(1)
}

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let cfg = ctx.configs.micro.memory_bandwidth.clone();
    let rank = ctx.place.rank;
    let seed = SEED ^ rank as u32;
    ctx.progress.phase(NAME, "load", 0);
    ctx.backend.copy_load(cfg.size, seed, cfg.blocks_per_sm).context("allocating and filling the copy's buffers")?;
    let result = measure(ctx, &cfg, seed);
    ctx.backend.copy_free();
    result
}

fn measure(
    ctx: &mut CheckCtx<'_>,
    cfg: &gpusanity_common::config::bandwidth::MemoryBandwidthConfig,
    seed: u32,
) -> Result<RankResult> {
    let rank = ctx.place.rank;
    ctx.progress.phase(NAME, "warmup", 0);
    ctx.backend.copy_run(cfg.warmup).context("copy warm-up")?;
    // Injected slowness: the device copies four times per timed copy (it really does the work).
    let reps = if ctx.faults.has("memory-bandwidth-slow", rank) { 4 } else { 1 };
    ctx.progress.phase(NAME, "timed", 0);
    let each = ctx.backend.copy_run(cfg.iters * reps).context("timed copies")?;
    let times: Vec<f64> = each.chunks(reps).map(|c| c.iter().sum()).collect();

    ctx.progress.phase(NAME, "verify", 0);
    if ctx.faults.has("memory-bandwidth-wrong", rank) {
        let at = poke_offset(cfg.size, rank);
        ctx.backend.copy_poke(at, !pattern_byte(at, seed)).context("injecting a wrong byte")?;
    }
    let v = ctx.backend.copy_verify(seed).context("verifying the copy")?;

    let gbps: Vec<f64> = times.iter().map(|t| copy_gbps(cfg.size, *t)).collect();
    let mut r = RankResult::new(rank, if v.wrong == 0 { CheckStatus::Passed } else { CheckStatus::Failed });
    r.metrics.insert("gbps".into(), copy_gbps(cfg.size, median(&times)));
    r.metrics.insert("gbps_best".into(), gbps.iter().copied().fold(0.0, f64::max));
    r.metrics.insert("time_ms_median".into(), median(&times) * 1e3);
    r.metrics.insert("bytes".into(), cfg.size as f64);
    r.metrics.insert("wrong_words".into(), v.wrong as f64);
    r.notes.insert(
        "kernel".into(),
        match ctx.backend.kind() {
            gpusanity_common::report::DeviceKind::Cuda => {
                "PTX copy kernel, 16-byte loads and stores, grid-stride, 4 words in flight per thread".into()
            }
            gpusanity_common::report::DeviceKind::Cpu => "memcpy of host memory on one thread".into(),
        },
    );
    r.notes.insert("counted".into(), "bytes read plus bytes written, median of the timed copies".into());
    if let Some(first) = v.first {
        r.error = Some(format!(
            "{} of {} 16-byte words of the copy (source and destination) are wrong, the first at byte {}",
            v.wrong,
            2 * (cfg.size / WORD_BYTES),
            first.saturating_mul(WORD_BYTES)
        ));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_counts_read_and_written_bytes_and_the_poke_stays_inside() {
        assert_eq!(copy_gbps(1_000_000_000, 1.0), 2.0);
        assert_eq!(copy_gbps(1 << 20, 0.0), 0.0);
        for (bytes, rank) in [(64u64 << 20, 0), (64 << 20, 7), (16, 3), (4 << 30, 1)] {
            assert!(poke_offset(bytes, rank) < bytes);
        }
        assert_ne!(poke_offset(64 << 20, 0), poke_offset(64 << 20, 1));
    }
}
