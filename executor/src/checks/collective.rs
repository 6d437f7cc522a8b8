//! What the collective checks share: a size sweep of one operation on one group (buffers,
//! NaN-poisoned receive buffer, timing, read-back, verification, nccl-tests' figures), the
//! rank result of a sweep, and the exchange pattern of all-gather and all-to-all.
//!
//! Exchange pattern: element `i` of rank `r`'s input is `(i + 7 r) mod 251`. The values are small
//! integers (exact in bf16), differ between senders, and, 251 being prime, a block taken from
//! the wrong offset differs too: a misplaced, lost or duplicated block shows.

use anyhow::{Context, Result};
use gpusanity_common::bandwidth::{algbw_gbps, busbw_gbps};
use gpusanity_common::config::sweep::SweepConfig;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{CheckStatus, RankResult, SweepPoint};

use super::CheckCtx;
use crate::backend::{BufId, CollCall, CollOp, Dtype, GroupId, Work};

/// Period of the exchange pattern.
pub const EXCHANGE_PERIOD: usize = 251;

/// One period of rank `rank`'s exchange input, starting at element `offset`.
pub fn exchange_period(rank: usize, offset: usize) -> Vec<u8> {
    (0..EXCHANGE_PERIOD).map(|k| ((offset + k + 7 * rank) % EXCHANGE_PERIOD) as u8).collect()
}

/// [`exchange_period`] encoded as `dtype`, for [`super::all_reduce::count_wrong`].
pub fn exchange_expected(rank: usize, offset: usize, dtype: Dtype) -> Vec<u8> {
    let mut out = Vec::with_capacity(EXCHANGE_PERIOD * dtype.size());
    for v in exchange_period(rank, offset) {
        dtype.encode(v as f32, &mut out);
    }
    out
}

/// A sweep of one collective operation.
pub struct Sweep<'a> {
    /// The check's name, for progress and fault injection (`NAME-wrong@RANK` corrupts one
    /// received element before verification).
    pub check: CheckId,
    pub op: CollOp,
    pub group: GroupId,
    pub cfg: &'a SweepConfig,
}

/// The buffers of a sweep, freed on every path.
struct Bufs<'a, 'b> {
    ctx: &'a mut CheckCtx<'b>,
    ids: Vec<BufId>,
}

impl Drop for Bufs<'_, '_> {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            self.ctx.backend.buf_free(id);
        }
    }
}

/// Runs the sweep: per size, NaN-poisons the receive buffer, times `warmup` + `iters` calls,
/// reads the result and counts its wrong elements with `verify(result, elems)`. Sizes are
/// rounded down to a whole number of elements per rank for operations that split the buffer.
pub fn run_sweep(
    ctx: &mut CheckCtx<'_>,
    s: &Sweep<'_>,
    send_period: &[u8],
    verify: impl Fn(&[u8], usize) -> u64,
) -> Result<Vec<SweepPoint>> {
    let rank = ctx.place.rank;
    let dtype = ctx.backend.coll_dtype();
    let n = ctx.backend.group_size(s.group)?;
    let splits = s.op.splits();
    let received = |elems: usize| s.op.received(elems, n);
    let elems_of = |bytes: u64| {
        let e = bytes as usize / dtype.size();
        if splits {
            (e / n).max(1) * n
        } else {
            e
        }
    };
    let sizes = s.cfg.sizes();
    let max = sizes.iter().map(|b| elems_of(*b)).max().unwrap_or(0);
    let send_elems = s.op.sent(max, n);
    ctx.progress.phase(s.check, "prepare", 0);
    let mut bufs = Bufs { ctx, ids: Vec::new() };
    let send = bufs.ctx.backend.buf_alloc(send_elems).context("allocating the send buffer")?;
    bufs.ids.push(send);
    let recv = bufs.ctx.backend.buf_alloc(max).context("allocating the receive buffer")?;
    bufs.ids.push(recv);
    bufs.ctx.backend.buf_fill(send, send_period).context("filling the send buffer")?;
    let ctx = &mut *bufs.ctx;
    let wrong_fault = format!("{}-wrong", s.check);
    let mut sweep = Vec::with_capacity(sizes.len());
    for bytes in sizes {
        let elems = elems_of(bytes);
        ctx.progress.phase(s.check, "size", bytes);
        ctx.backend.buf_poison(recv, received(elems)).context("poisoning the receive buffer")?;
        let call = CollCall::new(s.op, s.group, send, recv, elems);
        let t = ctx
            .backend
            .run(&[Work::Coll(call)], s.cfg.warmup, s.cfg.iters)
            .with_context(|| format!("{} of {bytes} bytes", s.check))?;
        let secs = t.each.first().copied().unwrap_or(t.total);
        let mut out = ctx.backend.buf_read(recv, received(elems)).context("reading the result back")?;
        if ctx.faults.has(&wrong_fault, rank) && !out.is_empty() {
            out[0] ^= 0x40;
        }
        let bytes = (elems * dtype.size()) as u64;
        sweep.push(SweepPoint {
            bytes,
            time_us: secs * 1e6,
            algbw_gbps: algbw_gbps(bytes, secs),
            busbw_gbps: busbw_gbps(s.op.collective(), n, bytes, secs),
            wrong: verify(&out, elems),
        });
    }
    Ok(sweep)
}

/// The rank result of a sweep: headline figures at the largest size, the peak busbw, the
/// small-message time and the wrong elements (`what` names them in the error, e.g. "reduced").
pub fn sweep_result(rank: usize, sweep: Vec<SweepPoint>, dtype: Dtype, what: &str) -> RankResult {
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
        let sizes: Vec<String> =
            sweep.iter().filter(|p| p.wrong > 0).map(|p| format!("{} B: {}", p.bytes, p.wrong)).collect();
        r.error = Some(format!("{wrong} {what} elements are wrong ({})", sizes.join(", ")));
    }
    r.sweep = sweep;
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_blocks_differ_by_sender_and_offset() {
        assert_ne!(exchange_period(0, 0), exchange_period(1, 0));
        // Blocks of 2^k elements at different offsets never coincide.
        for k in 0..20 {
            let c = 1usize << k;
            assert_ne!(exchange_period(0, c), exchange_period(0, 2 * c), "block {c}");
        }
        assert!(exchange_period(3, 5).iter().all(|v| (*v as usize) < EXCHANGE_PERIOD));
    }
}
