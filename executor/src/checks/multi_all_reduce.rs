//! `multi-all-reduce`: several all-reduces at the same time on independent communicators — one
//! per rail (local rank i of every node), one per node, and `world_streams` on the world group,
//! each on its own stream — with each group's busbw, so that one bad rail, NIC or node stands
//! out against the groups of its kind. Every group's sum is verified exactly.
//!
//! Per rank: the detail `multi_all_reduce` with every group it belongs to (`rail0`, `node1`,
//! `world0`...), its ranks and busbw, which the diagnosis compares; the same figures as the
//! metrics `busbw_gbps.GROUP` for people.

use anyhow::{Context, Result};
use gpusanity_common::bandwidth::{busbw_gbps, Collective};
use gpusanity_common::detail::{CheckDetail, GroupBusbw, GroupKind, ReduceGroup};
use gpusanity_common::report::{CheckStatus, RankResult};

use super::all_reduce::{count_wrong, Pattern};
use super::CheckCtx;
use crate::backend::{BufId, CollCall, CollOp, Work, WorkerPlace};

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::MultiAllReduce;

/// One group of the check: which it is and its global ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupSpec {
    pub group: ReduceGroup,
    pub members: Vec<usize>,
}

/// Every group of the job with two or more ranks, in the order every rank creates them.
pub fn groups(place: &WorkerPlace, world_streams: usize) -> Vec<GroupSpec> {
    let nnodes = place.node_sizes.len();
    let widest = place.node_sizes.iter().copied().max().unwrap_or(0);
    let mut out = Vec::new();
    for i in 0..widest {
        let members: Vec<usize> =
            (0..nnodes).filter(|&n| place.node_sizes[n] > i).map(|n| place.node_ranks(n).start + i).collect();
        out.push(GroupSpec { group: ReduceGroup { kind: GroupKind::Rail, index: i }, members });
    }
    for n in 0..nnodes {
        out.push(GroupSpec {
            group: ReduceGroup { kind: GroupKind::Node, index: n },
            members: place.node_ranks(n).collect(),
        });
    }
    for k in 0..world_streams {
        out.push(GroupSpec { group: ReduceGroup { kind: GroupKind::World, index: k }, members: (0..place.world).collect() });
    }
    out.retain(|g| g.members.len() >= 2);
    out
}

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let cfg = ctx.configs.multi_all_reduce.clone();
    let place = ctx.place.clone();
    let rank = place.rank;
    let dtype = ctx.backend.coll_dtype();
    let all = groups(&place, cfg.world_streams);
    let mine: Vec<&GroupSpec> = all.iter().filter(|g| g.members.contains(&rank)).collect();
    let mut r = RankResult::new(rank, CheckStatus::Passed);
    r.notes.insert("dtype".into(), dtype.name().into());
    if mine.is_empty() {
        return Ok(super::not_applicable(rank, "this rank is in no group of two or more ranks".into()));
    }

    ctx.progress.phase(NAME, "communicators", 0);
    let elems = (cfg.bytes as usize / dtype.size()).max(1);
    let mut calls = Vec::with_capacity(mine.len());
    let mut expected = Vec::with_capacity(mine.len());
    let mut bufs: Vec<BufId> = Vec::new();
    let outcome = (|| -> Result<()> {
        for g in &mine {
            let id = ctx.backend.group(ctx.store, &format!("multi-all-reduce/{}", g.group), &g.members)?;
            let index = g.members.iter().position(|&m| m == rank).unwrap_or(0);
            let pattern = Pattern::new(g.members.len());
            let send = ctx.backend.buf_alloc(elems)?;
            bufs.push(send);
            let recv = ctx.backend.buf_alloc(elems)?;
            bufs.push(recv);
            ctx.backend.buf_fill(send, &pattern.input(index))?;
            ctx.backend.buf_poison(recv, elems)?;
            calls.push(CollCall::new(CollOp::AllReduce, id, send, recv, elems));
            expected.push(pattern.expected_bytes(dtype));
        }
        Ok(())
    })();
    let result = outcome.and_then(|_| {
        ctx.progress.phase(NAME, "concurrent all-reduces", 0);
        let work: Vec<Work> = calls.iter().copied().map(Work::Coll).collect();
        let t = ctx.backend.run(&work, cfg.warmup, cfg.iters).context("concurrent all-reduces")?;
        let mut wrong_total = 0u64;
        let mut min_bw = f64::INFINITY;
        let mut figures = Vec::with_capacity(mine.len());
        for (i, g) in mine.iter().enumerate() {
            let mut out = ctx.backend.buf_read(calls[i].recv, elems)?;
            if ctx.faults.has("multi-all-reduce-wrong", rank) && i == 0 && !out.is_empty() {
                out[0] ^= 0x40;
            }
            let wrong = count_wrong(&out, &expected[i], dtype.size());
            let secs = t.each.get(i).copied().unwrap_or(t.total);
            let bw = busbw_gbps(Collective::AllReduce, g.members.len(), (elems * dtype.size()) as u64, secs);
            min_bw = min_bw.min(bw);
            figures.push(GroupBusbw { group: g.group, ranks: g.members.clone(), busbw_gbps: bw });
            r.metrics.insert(format!("busbw_gbps.{}", g.group), bw);
            r.metrics.insert(format!("time_us.{}", g.group), secs * 1e6);
            if wrong > 0 {
                r.metrics.insert(format!("wrong_elements.{}", g.group), wrong as f64);
            }
            wrong_total += wrong;
        }
        r.detail = Some(CheckDetail::MultiAllReduce { groups: figures });
        r.metrics.insert("busbw_gbps_min".into(), min_bw);
        r.metrics.insert("wrong_elements".into(), wrong_total as f64);
        r.metrics.insert("bytes".into(), (elems * dtype.size()) as f64);
        if wrong_total > 0 {
            r.status = CheckStatus::Failed;
            let bad: Vec<String> = mine
                .iter()
                .filter_map(|g| {
                    r.metrics.get(&format!("wrong_elements.{}", g.group)).map(|w| format!("{}: {w}", g.group))
                })
                .collect();
            r.error = Some(format!("{wrong_total} reduced elements are wrong ({})", bad.join(", ")));
        }
        Ok(())
    });
    for b in bufs {
        ctx.backend.buf_free(b);
    }
    result?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_of_two_nodes_of_two() {
        let place = WorkerPlace { node_sizes: vec![2, 2], ..WorkerPlace::single_node(0, 4) };
        let g = groups(&place, 2);
        let names: Vec<String> = g.iter().map(|g| g.group.to_string()).collect();
        assert_eq!(names, ["rail0", "rail1", "node0", "node1", "world0", "world1"]);
        assert_eq!(g[1].members, [1, 3]);
        assert_eq!(g[3].members, [2, 3]);
        // One node of one worker: nothing to reduce with; uneven nodes keep partial rails.
        assert!(groups(&WorkerPlace::single_node(0, 1), 2).is_empty());
        let uneven = WorkerPlace { node_sizes: vec![3, 1], ..WorkerPlace::single_node(0, 4) };
        let g = groups(&uneven, 0);
        assert_eq!(g.iter().map(|g| g.group.to_string()).collect::<Vec<_>>(), ["rail0", "node0"]);
        assert_eq!(g[0].members, [0, 3]);
    }
}
