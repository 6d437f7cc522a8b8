//! `memory-bandwidth`: per rank, a copy of one device buffer into another, large enough to
//! defeat the caches. A GPU copies twice over: through the driver's device-to-device copy (the
//! bandwidth figure, `gbps`: no copy kernel on the multiprocessors matches it; see
//! docs/micro-checks.md) and through the check's own kernel (16-byte loads and stores,
//! grid-stride: `kernel_gbps`); a CPU copies with memcpy of host memory. Bandwidth counts the bytes read plus the bytes written;
//! the headline is the median of timed copies after warm-up, timed on the device. The copy is
//! verified exactly: every 16-byte word of the source and of the destination against the fill
//! pattern (on the device for a GPU), so a wrong, partial or misplaced copy fails the rank.

use anyhow::{Context, Result};
use gpusanity_common::report::{CheckStatus, RankResult};
use gpusanity_common::stats::median;

use super::CheckCtx;
use crate::backend::mem::{pattern_byte, CopyPath, Verified, WORD_BYTES};

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::MemoryBandwidth;

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
    let cfg = ctx.configs.memory_bandwidth.clone();
    let rank = ctx.place.rank;
    let seed = SEED ^ rank as u32;
    ctx.progress.phase(NAME, "load", 0);
    ctx.backend.copy_load(cfg.size, seed, cfg.blocks_per_sm).context("allocating and filling the copy's buffers")?;
    let result = measure(ctx, &cfg, seed);
    ctx.backend.copy_free();
    result
}

/// What one copy path measured: its timed copies and its verification.
struct PathResult {
    path: CopyPath,
    times: Vec<f64>,
    /// CPU seconds of the timed copies, on CPU workers ([`super::cpu_time`]).
    cpu: Option<f64>,
    verified: Verified,
}

fn measure(
    ctx: &mut CheckCtx<'_>,
    cfg: &gpusanity_common::config::bandwidth::MemoryBandwidthConfig,
    seed: u32,
) -> Result<RankResult> {
    let rank = ctx.place.rank;
    // Injected slowness: the device copies eight times per timed copy (it really does the
    // work). Eight for the reason `gemm-slow` does: on CPU a rank whose peers have finished
    // copies faster, alone.
    let reps = if ctx.faults.has("memory-bandwidth-slow", rank) { 8 } else { 1 };
    let mut paths = Vec::new();
    for (i, &path) in ctx.backend.copy_paths().iter().enumerate() {
        if i > 0 {
            ctx.backend.copy_clear().context("zeroing the destination between copy paths")?;
        }
        ctx.progress.phase(NAME, "warmup", 0);
        ctx.backend.copy_run(path, cfg.warmup).with_context(|| format!("copy warm-up ({})", path.name()))?;
        ctx.progress.phase(NAME, "timed", 0);
        let cpu_before = ctx.backend.thread_cpu_seconds();
        let each =
            ctx.backend.copy_run(path, cfg.iters * reps).with_context(|| format!("timed copies ({})", path.name()))?;
        let cpu = super::cpu_time::since(&*ctx.backend, cpu_before);
        let times: Vec<f64> = each.chunks(reps).map(|c| c.iter().sum()).collect();
        ctx.progress.phase(NAME, "verify", 0);
        if i == 0 && ctx.faults.has("memory-bandwidth-wrong", rank) {
            let at = poke_offset(cfg.size, rank);
            ctx.backend.copy_poke(at, !pattern_byte(at, seed)).context("injecting a wrong byte")?;
        }
        let verified =
            ctx.backend.copy_verify(seed).with_context(|| format!("verifying the copy ({})", path.name()))?;
        paths.push(PathResult { path, times, cpu, verified });
    }
    let Some(head) = paths.first() else {
        anyhow::bail!("the backend offers no copy path");
    };
    let wrong: u64 = paths.iter().map(|p| p.verified.wrong).sum();
    let mut r = RankResult::new(rank, if wrong == 0 { CheckStatus::Passed } else { CheckStatus::Failed });
    let best = |times: &[f64]| times.iter().map(|t| copy_gbps(cfg.size, *t)).fold(0.0, f64::max);
    r.metrics.insert("gbps".into(), copy_gbps(cfg.size, median(&head.times)));
    r.metrics.insert("gbps_best".into(), best(&head.times));
    // On CPU workers, every timed copy's bytes over the CPU time the thread got (judged there
    // instead of `gbps`: a worker descheduled by other processes is not slow memory).
    let copied = cfg.size.saturating_mul(head.times.len() as u64);
    super::cpu_time::insert(&mut r, "gbps", head.times.iter().sum(), head.cpu, |s| copy_gbps(copied, s));
    r.metrics.insert("time_ms_median".into(), median(&head.times) * 1e3);
    r.metrics.insert("bytes".into(), cfg.size as f64);
    r.metrics.insert("wrong_words".into(), wrong as f64);
    if paths.len() > 1 {
        for p in &paths {
            r.metrics.insert(format!("{}_gbps", p.path.name()), copy_gbps(cfg.size, median(&p.times)));
            r.metrics.insert(format!("{}_gbps_best", p.path.name()), best(&p.times));
        }
    }
    r.notes.insert(
        "kernel".into(),
        match ctx.backend.kind() {
            gpusanity_common::report::DeviceKind::Cuda => {
                "gbps: the driver's device-to-device copy (cuMemcpyDtoDAsync, what \
                 dst.copy_(src) runs in PyTorch); kernel_gbps: the check's PTX copy kernel (16-byte loads and \
                 stores, grid-stride, 4 words in flight per thread); each verified on its own"
                    .into()
            }
            gpusanity_common::report::DeviceKind::Cpu => "memcpy of host memory on one thread".into(),
        },
    );
    r.notes.insert("counted".into(), "bytes read plus bytes written, median of the timed copies".into());
    if let Some(p) = paths.iter().find(|p| p.verified.wrong > 0) {
        let first = p.verified.first.unwrap_or(0);
        r.error = Some(format!(
            "{} of {} 16-byte words of the copy (source and destination) are wrong after the {} copy, the first at byte {}",
            p.verified.wrong,
            2 * (cfg.size / WORD_BYTES),
            p.path.name(),
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
