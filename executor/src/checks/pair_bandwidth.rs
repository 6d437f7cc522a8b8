//! `pair-bandwidth` (hidden, added by the launcher on multi-node CPU runs): the pairwise link
//! test. In rounds of disjoint node pairs, the suspects alone, (schedule: [`super::pair_schedule`]), every rail
//! of a pair (local rank i of both nodes) runs a 2-member all-reduce over its own ring; a
//! pair's figure is its slowest rail's bus bandwidth. Every rank publishes its rail's figure in
//! the store and reads all of the round's, so every rank computes the same next round. The
//! reduced values are checked exactly, so a link that corrupts data shows too.

use std::time::Instant;

use anyhow::{Context, Result};
use gpusanity_common::bandwidth::{busbw_gbps, Collective};
use gpusanity_common::report::{CheckDetail, CheckStatus, PairBandwidth, RankResult};

use super::pair_schedule;
use super::{CheckCtx, BARRIER_WAIT};
use crate::backend::cpu::ring::Ring;

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::PairBandwidth;

/// Bytes of one all-reduce: large enough that a healthy link's figure is not a scheduler
/// hiccup, small enough that a throttled one still ends in seconds.
const BYTES: usize = 4 << 20;
const WARMUP: usize = 1;
/// Timed calls in the shared rounds; a suspect measured alone gets more ([`pair_schedule::calls`]).
const ITERS: usize = 5;

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let place = ctx.place.clone();
    let nnodes = place.node_sizes.len();
    let rails = place.node_sizes.iter().copied().min().unwrap_or(0);
    let mut measured: Vec<PairBandwidth> = Vec::new();
    let mut wrong = 0u64;
    let mut round = 0;
    loop {
        let pairs = pair_schedule::next_round(nnodes, &measured);
        if pairs.is_empty() {
            break;
        }
        round += 1;
        ctx.progress.phase(NAME, "round", round as u64);
        let mine = pairs.iter().find(|p| p.contains(&place.node_rank)).filter(|_| place.local_rank < rails);
        if let Some(p) = mine {
            let rail = place.local_rank;
            let members = [place.node_ranks(p[0]).start + rail, place.node_ranks(p[1]).start + rail];
            let key = format!("r{round}/{}-{}/{rail}", p[0], p[1]);
            let calls = pair_schedule::calls(&measured, &pairs, BYTES, ITERS);
            let (gbps, bad) = measure(ctx, &key, &members, calls)
                .with_context(|| format!("link test between nodes {} and {}", p[0], p[1]))?;
            wrong += bad;
            // Both members time the same calls; each publishes its own figure (one key written
            // by both would give readers whichever came last, and ranks different schedules).
            let side = usize::from(place.node_rank == p[1]);
            ctx.store.set(&format!("pairbw/{key}/{side}"), &gbps.to_string())?;
        }
        for p in &pairs {
            // A rail's figure is the better of its two sides' (scheduling only slows a side);
            // the pair's is its slowest rail's.
            let mut worst = f64::INFINITY;
            for rail in 0..rails {
                let mut rail_best = 0.0f64;
                for side in 0..2 {
                    let v = ctx.store.get(&format!("pairbw/r{round}/{}-{}/{rail}/{side}", p[0], p[1]), BARRIER_WAIT)?;
                    // A figure that is not one is a broken peer, not a slow link: say so
                    // rather than count it as 0 GB/s and name a healthy pair.
                    let gbps = v.parse::<f64>().ok().filter(|g| g.is_finite() && *g >= 0.0).with_context(|| {
                        format!("a malformed link figure `{}` from nodes {} and {}", v.escape_debug(), p[0], p[1])
                    })?;
                    rail_best = rail_best.max(gbps);
                }
                worst = worst.min(rail_best);
            }
            measured.push(PairBandwidth { nodes: *p, busbw_gbps: worst, round });
        }
    }
    let mut r = RankResult::new(place.rank, if wrong == 0 { CheckStatus::Passed } else { CheckStatus::Failed });
    r.metrics.insert("rounds".into(), round as f64);
    r.metrics.insert("pairs".into(), measured.len() as f64);
    r.metrics.insert("wrong_elements".into(), wrong as f64);
    if let Some(min) = measured.iter().map(|p| p.busbw_gbps).reduce(f64::min) {
        r.metrics.insert("busbw_gbps_min".into(), min);
    }
    r.detail = Some(CheckDetail::PairBandwidth { pairs: measured });
    if wrong > 0 {
        r.error = Some(format!("{wrong} reduced elements are wrong in the link test"));
    }
    Ok(r)
}

/// One rail's 2-member all-reduce of `calls` timed calls: bus bandwidth of the fastest (what the link
/// carries, not how the hosts happened to be scheduled), and the wrong elements.
fn measure(ctx: &mut CheckCtx<'_>, key: &str, members: &[usize; 2], calls: usize) -> Result<(f64, u64)> {
    let mut ring = Ring::connect_group(ctx.place, ctx.store, &format!("pair/{key}"), members)?;
    let elems = BYTES / 4;
    let me = ring.rank();
    // Small integers: sums are exact; element i of member m is (i + 3 m) % 64.
    let send: Vec<f32> = (0..elems).map(|i| ((i + 3 * me) % 64) as f32).collect();
    let mut recv = vec![0f32; elems];
    let mut times = Vec::with_capacity(calls);
    for i in 0..WARMUP + calls {
        let t = Instant::now();
        ring.all_reduce_sum(&send, &mut recv)?;
        if i >= WARMUP {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let wrong = recv.iter().enumerate().filter(|(i, v)| **v != ((i % 64) + ((i + 3) % 64)) as f32).count() as u64;
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    Ok((busbw_gbps(Collective::AllReduce, 2, BYTES as u64, best), wrong))
}
