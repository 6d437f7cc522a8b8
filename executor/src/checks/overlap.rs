//! `matmul-all-reduce-overlap`: GEMM on the main stream and an all-reduce on a communicator of
//! its own (its own stream) at the same time, as data-parallel training overlaps its backward
//! GEMMs with gradient all-reduces. Per rank: GEMM alone, all-reduce alone, both together,
//! overlap efficiency and the slowdown of each under contention. Both results are verified
//! (a tile of the product against an f64 reference, every reduced element exactly).
//!
//! Overlap efficiency = (GEMM alone + all-reduce alone - together) / min(GEMM, all-reduce):
//! 1 when the shorter one hides entirely behind the longer one, 0 when they serialize.

use anyhow::{Context, Result};
use gpusanity_common::report::{CheckStatus, RankResult};

use super::all_reduce::{count_wrong, Pattern};
use super::gemm::{random_inputs, verify_tile, Tile};
use super::{CheckCtx, BARRIER_WAIT};
use crate::backend::{BufId, CollCall, CollOp, Work};

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::MatmulAllReduceOverlap;

/// Figures of the three phases, seconds per step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Phases {
    pub gemm_alone: f64,
    pub ar_alone: f64,
    pub gemm_together: f64,
    pub ar_together: f64,
    pub together: f64,
}

impl Phases {
    pub fn efficiency(&self) -> f64 {
        let shorter = self.gemm_alone.min(self.ar_alone);
        if shorter <= 0.0 {
            return 0.0;
        }
        (self.gemm_alone + self.ar_alone - self.together) / shorter
    }
}

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let cfg = ctx.configs.overlap.clone();
    let (rank, world) = (ctx.place.rank, ctx.place.world);
    let n = cfg.gemm_size;
    let gdt = ctx.backend.gemm_dtype();
    let cdt = ctx.backend.coll_dtype();
    ctx.progress.phase(NAME, "prepare", 0);
    let (a, b) = random_inputs(n, gdt);
    ctx.backend.gemm_load(n, &a, &b).context("loading GEMM inputs")?;
    let all: Vec<usize> = (0..world).collect();
    let group = ctx.backend.group(ctx.store, "overlap/world", &all).context("the all-reduce communicator")?;
    let elems = (cfg.bytes as usize / cdt.size()).max(1);
    let pattern = Pattern::new(world);
    let mut bufs: Vec<BufId> = Vec::new();
    let outcome = (|| -> Result<(Phases, Vec<u8>)> {
        let send = ctx.backend.buf_alloc(elems)?;
        bufs.push(send);
        let recv = ctx.backend.buf_alloc(elems)?;
        bufs.push(recv);
        ctx.backend.buf_fill(send, &pattern.input(rank))?;
        let ar = Work::Coll(CollCall::new(CollOp::AllReduce, group, send, recv, elems));
        let g = phase(ctx, "gemm-alone", &[Work::Gemm], cfg.warmup, cfg.iters)?;
        let r = phase(ctx, "all-reduce-alone", &[ar], cfg.warmup, cfg.iters)?;
        ctx.backend.buf_poison(recv, elems)?;
        let both = phase(ctx, "together", &[Work::Gemm, ar], cfg.warmup, cfg.iters)?;
        let phases = Phases {
            gemm_alone: g[0],
            ar_alone: r[0],
            gemm_together: both[0],
            ar_together: both[1],
            together: both[2],
        };
        let out = ctx.backend.buf_read(recv, elems)?;
        Ok((phases, out))
    })();
    for b in bufs {
        ctx.backend.buf_free(b);
    }
    let (p, mut out) = outcome?;
    ctx.progress.phase(NAME, "verify", 0);
    let c = ctx.backend.gemm_output().context("reading the product back")?;
    ctx.backend.gemm_free();
    if ctx.faults.has("overlap-wrong", rank) && !out.is_empty() {
        out[0] ^= 0x40;
    }
    let wrong_ar = count_wrong(&out, &pattern.expected_bytes(cdt), cdt.size());
    let tile = Tile::pick(n, 16, rank);
    let wrong_gemm = verify_tile(&a, &b, &c, n, gdt, &tile).bad as u64;

    let mut r = RankResult::new(rank, CheckStatus::Passed);
    let ms = |s: f64| s * 1e3;
    r.metrics.insert("gemm_ms_alone".into(), ms(p.gemm_alone));
    r.metrics.insert("allreduce_ms_alone".into(), ms(p.ar_alone));
    r.metrics.insert("gemm_ms_overlapped".into(), ms(p.gemm_together));
    r.metrics.insert("allreduce_ms_overlapped".into(), ms(p.ar_together));
    r.metrics.insert("overlapped_step_ms".into(), ms(p.together));
    r.metrics.insert("serial_step_ms".into(), ms(p.gemm_alone + p.ar_alone));
    r.metrics.insert("overlap_efficiency".into(), p.efficiency());
    r.metrics.insert("gemm_slowdown".into(), p.gemm_together / p.gemm_alone.max(f64::MIN_POSITIVE));
    r.metrics.insert("allreduce_slowdown".into(), p.ar_together / p.ar_alone.max(f64::MIN_POSITIVE));
    r.metrics.insert("overlapped_steps_per_s".into(), if p.together > 0.0 { 1.0 / p.together } else { 0.0 });
    r.metrics.insert("wrong_elements".into(), (wrong_ar + wrong_gemm) as f64);
    r.notes.insert("gemm".into(), format!("{n}x{n}x{n} {}", gdt.name()));
    r.notes.insert("all_reduce".into(), format!("{} bytes {}", elems * cdt.size(), cdt.name()));
    if wrong_ar + wrong_gemm > 0 {
        r.status = CheckStatus::Failed;
        r.error = Some(format!(
            "wrong results under overlap: {wrong_ar} reduced elements, {wrong_gemm} of {} verified GEMM elements",
            tile.t * tile.t
        ));
    }
    Ok(r)
}

/// One timed phase, all ranks starting together: per item then the whole, seconds per step.
fn phase(ctx: &mut CheckCtx<'_>, name: &str, work: &[Work], warmup: usize, iters: usize) -> Result<Vec<f64>> {
    ctx.store.barrier_all(&format!("overlap/{name}"), BARRIER_WAIT)?;
    ctx.progress.phase(NAME, name, 0);
    let t = ctx.backend.run(work, warmup, iters).with_context(|| format!("{name} phase"))?;
    Ok(t.each.into_iter().chain([t.total]).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn efficiency_is_one_when_hidden_and_zero_when_serial() {
        let p = |together| Phases { gemm_alone: 4.0, ar_alone: 2.0, gemm_together: 4.0, ar_together: 2.0, together };
        assert_eq!(p(4.0).efficiency(), 1.0);
        assert_eq!(p(6.0).efficiency(), 0.0);
        assert_eq!(p(5.0).efficiency(), 0.5);
        assert!(p(7.0).efficiency() < 0.0, "worse than serial shows as negative");
    }
}
