//! `host-bandwidth`: per GPU, pinned host-to-device and device-to-host copies of one buffer,
//! timed with CUDA events (median of timed copies after warm-up): first each GPU alone (the
//! ranks of a node take turns), then every GPU of the node at once, so that a PCIe switch two
//! GPUs share or a GPU fed from the wrong NUMA node shows as a drop. Every transfer is
//! verified exactly: the device buffer (on the device) after host-to-device copies, the host
//! buffer after device-to-host copies, against the pattern the other side was filled with.
//! Not applicable on CPU workers (no device link), with the reason.

use anyhow::{Context, Result};
use gpusanity_common::config::bandwidth::HostBandwidthConfig;
use gpusanity_common::report::{CheckStatus, RankResult};
use gpusanity_common::stats::median;

use super::{CheckCtx, BARRIER_WAIT};
use crate::backend::{BackendError, HostDir, HostSide, Verified};

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::HostBandwidth;

/// Seeds of the pattern: one for what goes to the device, one for what comes back.
const TO_DEVICE_SEED: u32 = 0x6832_6400;
const TO_HOST_SEED: u32 = 0x6432_6800;

/// Bytes per second of one copy of `bytes`, in GB/s.
pub fn gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        bytes as f64 / seconds / 1e9
    } else {
        0.0
    }
}

/// One direction's figures.
#[derive(Debug, Clone, Copy, Default)]
struct Figures {
    alone: f64,
    together: Option<f64>,
}

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let cfg = ctx.configs.host_bandwidth.clone();
    let rank = ctx.place.rank;
    match ctx.backend.host_load(cfg.size) {
        Ok(()) => {}
        Err(BackendError::NotApplicable(why)) => return Ok(super::not_applicable(rank, why)),
        Err(e) => return Err(anyhow::Error::from(e).context("allocating the pinned host and device buffers")),
    }
    let result = measure(ctx, &cfg);
    ctx.backend.host_free();
    result
}

fn measure(ctx: &mut CheckCtx<'_>, cfg: &HostBandwidthConfig) -> Result<RankResult> {
    let place = ctx.place.clone();
    let (rank, local, node) = (place.rank, place.local_rank, place.node_rank);
    let local_n = place.node_sizes.get(node).copied().unwrap_or(1);
    let slow = ctx.faults.has("host-bandwidth-slow", rank);
    let mut wrong = Verified::default();
    let mut figures = [Figures::default(); 2];

    for (d, (dir, seed)) in
        [(HostDir::ToDevice, TO_DEVICE_SEED), (HostDir::ToHost, TO_HOST_SEED)].into_iter().enumerate()
    {
        let (src, dst) = match dir {
            HostDir::ToDevice => (HostSide::Host, HostSide::Device),
            HostDir::ToHost => (HostSide::Device, HostSide::Host),
        };
        ctx.backend.host_fill(src, Some(seed)).context("filling the source")?;
        // Alone: the node's ranks take turns, each copying while the others wait.
        for turn in 0..local_n {
            ctx.store.local().barrier(&format!("hostbw/{node}/{d}/alone/{turn}"), local, local_n, BARRIER_WAIT)?;
            if turn == local {
                ctx.progress.phase(NAME, phase(dir, false), turn as u64);
                ctx.backend.host_fill(dst, None).context("clearing the destination")?;
                figures[d].alone = timed(ctx, cfg, dir, slow)?;
                wrong = wrong.and(ctx.backend.host_verify(dst, seed).context("verifying the copies")?);
            }
        }
        // Together: every GPU of the node at once.
        if local_n > 1 {
            ctx.backend.host_fill(dst, None).context("clearing the destination")?;
            ctx.store.local().barrier(&format!("hostbw/{node}/{d}/together"), local, local_n, BARRIER_WAIT)?;
            ctx.progress.phase(NAME, phase(dir, true), 0);
            figures[d].together = Some(timed(ctx, cfg, dir, slow)?);
            wrong = wrong.and(ctx.backend.host_verify(dst, seed).context("verifying the concurrent copies")?);
        }
    }

    let [h2d, d2h] = figures;
    let mut r = RankResult::new(rank, if wrong.wrong == 0 { CheckStatus::Passed } else { CheckStatus::Failed });
    r.metrics.insert("gbps".into(), h2d.alone.min(d2h.alone));
    r.metrics.insert("h2d_gbps".into(), h2d.alone);
    r.metrics.insert("d2h_gbps".into(), d2h.alone);
    if let (Some(h), Some(d)) = (h2d.together, d2h.together) {
        r.metrics.insert("h2d_concurrent_gbps".into(), h);
        r.metrics.insert("d2h_concurrent_gbps".into(), d);
        r.metrics.insert("concurrent_gbps".into(), h.min(d));
    } else {
        r.notes.insert("concurrent".into(), "one GPU on this node: the concurrent figures are the single ones".into());
    }
    r.metrics.insert("bytes".into(), cfg.size as f64);
    r.metrics.insert("wrong_words".into(), wrong.wrong as f64);
    r.notes.insert(
        "copies".into(),
        format!(
            "pinned host memory (cuMemHostAlloc), cuMemcpyHtoDAsync/DtoHAsync of {} bytes, median of {} timed copies; alone, then the node's {local_n} GPU(s) at once",
            cfg.size, cfg.iters
        ),
    );
    if let Some(first) = wrong.first {
        r.error = Some(format!(
            "{} 16-byte words arrived wrong across the host link (the first at byte {})",
            wrong.wrong,
            first.saturating_mul(16)
        ));
    }
    Ok(r)
}

fn phase(dir: HostDir, together: bool) -> &'static str {
    match (dir, together) {
        (HostDir::ToDevice, false) => "h2d",
        (HostDir::ToDevice, true) => "h2d-all",
        (HostDir::ToHost, false) => "d2h",
        (HostDir::ToHost, true) => "d2h-all",
    }
}

/// Warm-up, then the timed copies; GB/s of the median. `slow`: every timed copy four times.
fn timed(ctx: &mut CheckCtx<'_>, cfg: &HostBandwidthConfig, dir: HostDir, slow: bool) -> Result<f64> {
    ctx.backend.host_copy(dir, cfg.warmup).context("warm-up copies")?;
    let reps = if slow { 4 } else { 1 };
    let each = ctx.backend.host_copy(dir, cfg.iters * reps).context("timed copies")?;
    let times: Vec<f64> = each.chunks(reps).map(|c| c.iter().sum()).collect();
    Ok(gbps(cfg.size, median(&times)))
}
