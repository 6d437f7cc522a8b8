//! `network-connectivity`: reachability between every pair of nodes on both networks.
//!
//! - Front end (the hosts' own network): local rank 0 of every node listens on a TCP port and
//!   connects to its partner nodes' addresses, says hello and waits for the echo.
//! - Back end (the GPU network): pairs of ranks on different nodes exchange a small buffer
//!   through the backend (NCCL send/recv, or the CPU transport), verified exactly. Pairs run in
//!   rounds (each rank in at most one pair per round, a barrier between rounds, so a slow pair
//!   cannot make the next round's partner time out).
//!
//! Which pairs: up to `full-matrix-nodes` nodes, every pair of nodes and every pair of ranks on
//! different nodes; beyond, the partners of [`super::probe_plan`] (distances 1, 2, 4, ... around
//! a ring of nodes, rail by rail on the back end, plus the next rail of the next node), so the
//! probes grow as n·log n and the rounds as log n.
//! - Where `/sys/class/infiniband` exists, each RDMA port's state and rate.
//!
//! Every probe has its own timeout: a dead pair fails its probe and the others go on. Rank 0
//! gathers every rank's probes into a node x node matrix per network (the cells, up to 64
//! nodes, and the failed probes in its detail).

mod front;

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpusanity_common::detail::GridCell;
use gpusanity_common::report::{CheckDetail, CheckStatus, DeviceKind, RankResult};
use serde::{Deserialize, Serialize};

use super::all_reduce::count_wrong;
use super::collective::{exchange_expected, exchange_period};
use super::probe_plan;
use super::{CheckCtx, BARRIER_WAIT};
use crate::backend::{CollCall, CollOp, GroupId, Work, WorkerPlace};
pub use front::{ib_ports, IbPort};
use front::{probe_front, EchoServer};

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::NetworkConnectivity;

/// One probe: `from` and `to` are node ranks on the front end, global ranks on the back end.
pub use gpusanity_common::detail::Probe;

/// What one rank found, published for rank 0.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Row {
    front: Vec<Probe>,
    back: Vec<Probe>,
}

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let cfg = ctx.configs.network_connectivity.clone();
    let timeout = Duration::from_millis(cfg.timeout_ms);
    let place = ctx.place.clone();
    let (rank, world, node, nnodes) = (place.rank, place.world, place.node_rank, place.node_sizes.len());
    let mut row = Row::default();
    let mut r = RankResult::new(rank, CheckStatus::Passed);

    // Front end, by local rank 0 of every node.
    ctx.progress.phase(NAME, "front-end", 0);
    let server = if place.local_rank == 0 {
        let closed = ctx.faults.has("net-closed", rank);
        let server = EchoServer::start(timeout, closed).context("opening the front-end listener")?;
        ctx.store.set(&format!("net/front/{node}"), &format!("{}:{}", place.node_addr, server.port))?;
        ctx.store.barrier("net/front/up", node, nnodes, BARRIER_WAIT)?;
        let node_pairs = probe_plan::pairs(nnodes, cfg.full_matrix_nodes);
        for to in probe_plan::partners_of(&node_pairs, node) {
            let addr = ctx.store.get(&format!("net/front/{to}"), BARRIER_WAIT)?;
            let (ms, error) = match probe_front(&addr, node, timeout) {
                Ok(ms) => (ms, None),
                Err(e) => (0.0, Some(format!("{addr}: {e}"))),
            };
            row.front.push(Probe { from: node, to, ms, error });
        }
        Some(server)
    } else {
        None
    };
    ctx.store.barrier_all("net/front/done", BARRIER_WAIT)?;

    // Back end: pairs of ranks on different nodes, in rounds.
    let elems = (cfg.bytes as usize / ctx.backend.coll_dtype().size()).max(1);
    // Room for the all-to-all that sets up every connection first (see `back_end`).
    let send = ctx.backend.buf_alloc(elems * world).context("allocating the probe buffer")?;
    let recv = ctx.backend.buf_alloc(elems * world).context("allocating the probe buffer")?;
    let back = back_end(ctx, &place, send, recv, elems, timeout, cfg.full_matrix_nodes);
    ctx.backend.buf_free(send);
    ctx.backend.buf_free(recv);
    row.back = back?;

    if place.local_rank == 0 {
        let ports = ib_ports(Path::new("/sys/class/infiniband"));
        let down: Vec<String> = ports
            .iter()
            .filter(|p| p.state != "ACTIVE")
            .map(|p| format!("{} port {}: {}", p.device, p.port, p.state))
            .collect();
        r.metrics.insert("ib_ports".into(), ports.len() as f64);
        r.metrics.insert("ib_ports_not_active".into(), down.len() as f64);
        if !ports.is_empty() {
            r.notes.insert("ib_ports".into(), serde_json::to_string(&ports)?);
        }
        if !down.is_empty() {
            r.detail = Some(CheckDetail::Connectivity {
                front_end: None,
                back_end: None,
                front_end_failed: Vec::new(),
                back_end_failed: Vec::new(),
                front_end_probers: None,
                back_end_peers: None,
                ib_ports_not_active: down,
            });
        }
    }

    // Every rank's row, one value per node in node 0's store (a node's rows stay far below
    // the store's value limit beyond the full matrix: about 2·log2(nodes) probes per rank).
    let rows = ctx.store.gather("net/row", &serde_json::to_string(&row)?, BARRIER_WAIT)?;
    ctx.store.barrier_all("net/done", BARRIER_WAIT)?;
    drop(server);
    if let Some(rows) = rows {
        let rows = rows.iter().map(|v| serde_json::from_str::<Row>(v)).collect::<Result<Vec<_>, _>>()?;
        summarize(&mut r, &rows, &place);
    }

    let failed: Vec<String> = row
        .front
        .iter()
        .map(|p| (p, "front end, node"))
        .chain(row.back.iter().map(|p| (p, "back end, rank")))
        .filter_map(|(p, net)| p.error.as_ref().map(|e| format!("{net} {} -> {}: {e}", p.from, p.to)))
        .collect();
    let max_ms = |v: &[Probe]| v.iter().map(|p| p.ms).fold(0.0, f64::max);
    r.metrics.insert("front_probes".into(), row.front.len() as f64);
    r.metrics.insert("front_failed".into(), row.front.iter().filter(|p| p.error.is_some()).count() as f64);
    r.metrics.insert("front_ms_max".into(), max_ms(&row.front));
    r.metrics.insert("back_probes".into(), row.back.len() as f64);
    r.metrics.insert("back_failed".into(), row.back.iter().filter(|p| p.error.is_some()).count() as f64);
    r.metrics.insert("back_ms_max".into(), max_ms(&row.back));
    if !failed.is_empty() {
        r.status = CheckStatus::Failed;
        r.error = Some(format!("{} probe(s) failed: {}", failed.len(), failed.join("; ")));
    }
    Ok(r)
}

/// The back-end probes of this rank, round by round.
fn back_end(
    ctx: &mut CheckCtx<'_>,
    place: &WorkerPlace,
    send: crate::backend::BufId,
    recv: crate::backend::BufId,
    elems: usize,
    timeout: Duration,
    full_matrix_nodes: usize,
) -> Result<Vec<Probe>> {
    let (rank, world) = (place.rank, place.world);
    let dtype = ctx.backend.coll_dtype();
    ctx.backend.buf_fill(send, &exchange_period(rank, 0)).context("filling the probe buffer")?;
    // NCCL sets up a point-to-point connection on its first use, in a host call that blocks
    // until the peer takes part and that no timeout can interrupt. One untimed all-to-all over
    // the world, with the probes' size per peer, sets up every connection while all ranks take
    // part (a peer unreachable already here is found by the per-test timeout); each probe then
    // only waits on the device, where its own timeout applies. The CPU transport connected
    // every pair when the backend opened: there every probe is timed from its first byte.
    if ctx.backend.kind() == DeviceKind::Cuda {
        ctx.progress.phase(NAME, "back-end connections", 0);
        let warm = CollCall::new(CollOp::AllToAll, GroupId::WORLD, send, recv, elems * world);
        ctx.backend.run(&[Work::Coll(warm)], 0, 1).context("setting up back-end connections (all-to-all)")?;
    }
    let silent = ctx.faults.has("net-backend-down", rank);
    let mut probes = Vec::new();
    let plan = back_pairs(place, full_matrix_nodes);
    for (round, pairs) in probe_plan::rounds(world, &plan).into_iter().enumerate() {
        ctx.progress.phase(NAME, "back-end round", round as u64);
        ctx.store.barrier_all(&format!("net/round/{round}"), BARRIER_WAIT)?;
        let Some(peer) = pairs.iter().find_map(|&(a, b)| {
            if a == rank {
                Some(b)
            } else if b == rank {
                Some(a)
            } else {
                None
            }
        }) else {
            continue;
        };
        if place.node_of(peer) == Some(place.node_rank) {
            continue;
        }
        if silent {
            // Injected: this rank's back end does not answer; its peers' probes time out.
            probes.push(Probe { from: rank, to: peer, ms: 0.0, error: Some("not answered (injected fault)".into()) });
            continue;
        }
        ctx.backend.buf_poison(recv, elems)?;
        let mut call = CollCall::new(CollOp::SendRecv { peer }, GroupId::WORLD, send, recv, elems);
        call.timeout = Some(timeout);
        let t = Instant::now();
        let outcome = ctx.backend.run(&[Work::Coll(call)], 0, 1).map_err(anyhow::Error::from).and_then(|_| {
            let out = ctx.backend.buf_read(recv, elems)?;
            let wrong = count_wrong(&out, &exchange_expected(peer, 0, dtype), dtype.size());
            if wrong > 0 {
                anyhow::bail!("{wrong} of {elems} received elements are wrong");
            }
            Ok(())
        });
        let ms = t.elapsed().as_secs_f64() * 1e3;
        probes.push(match outcome {
            Ok(()) => Probe { from: rank, to: peer, ms, error: None },
            Err(e) => Probe { from: rank, to: peer, ms: 0.0, error: Some(format!("{e:#}")) },
        });
    }
    Ok(probes)
}

/// The back-end pairs of ranks (a < b, on different nodes): every such pair up to
/// `full_matrix_nodes` nodes; beyond, for each pair of partner nodes of [`probe_plan::pairs`],
/// rail i of one with rail i of the other, and for ring neighbours also rail i with rail i + 1,
/// so paths between rails are crossed too.
pub fn back_pairs(place: &WorkerPlace, full_matrix_nodes: usize) -> Vec<(usize, usize)> {
    let nnodes = place.node_sizes.len();
    let starts: Vec<usize> = place
        .node_sizes
        .iter()
        .scan(0, |acc, &k| {
            let s = *acc;
            *acc += k;
            Some(s)
        })
        .collect();
    let mut out = std::collections::BTreeSet::new();
    for (i, j) in probe_plan::pairs(nnodes, full_matrix_nodes) {
        let (si, sj) = (starts[i], starts[j]);
        let (gi, gj) = (place.node_sizes[i], place.node_sizes[j]);
        if nnodes <= full_matrix_nodes {
            for a in si..si + gi {
                for b in sj..sj + gj {
                    out.insert((a.min(b), a.max(b)));
                }
            }
            continue;
        }
        let neighbours = (i + 1) % nnodes == j || (j + 1) % nnodes == i;
        for l in 0..gi.min(gj) {
            out.insert((si + l, sj + l));
            if neighbours && gj > 1 {
                let (a, b) = (si + l, sj + (l + 1) % gj);
                out.insert((a.min(b), a.max(b)));
            }
        }
    }
    out.into_iter().collect()
}

/// Matrices are drawn up to this many nodes (a report of 1,000 nodes would carry a million
/// cells); beyond, the failed probes and the partner counts carry the findings.
const MATRIX_MAX_NODES: usize = 64;

/// Rank 0's view: node x node matrices of both networks, the failed probes, and how many
/// partners probed each node (front end) and each rank (back end), as JSON for the diagnosis.
fn summarize(r: &mut RankResult, rows: &[Row], place: &WorkerPlace) {
    let nnodes = place.node_sizes.len();
    let node_of: Vec<usize> =
        place.node_sizes.iter().enumerate().flat_map(|(n, &k)| std::iter::repeat_n(n, k)).collect();
    let front: Vec<&Probe> = rows.iter().flat_map(|w| &w.front).collect();
    let back: Vec<&Probe> = rows.iter().flat_map(|w| &w.back).collect();
    let mut front_probers = vec![0usize; nnodes];
    for p in &front {
        if let Some(c) = front_probers.get_mut(p.to) {
            *c += 1;
        }
    }
    // A back-end probe is one exchange, recorded by both sides: count each peer once.
    let mut back_peers: Vec<std::collections::BTreeSet<usize>> = vec![Default::default(); place.world];
    for p in &back {
        if let (Some(a), Some(_)) = (back_peers.get_mut(p.from), node_of.get(p.to)) {
            a.insert(p.to);
        }
        if let (Some(b), Some(_)) = (back_peers.get_mut(p.to), node_of.get(p.from)) {
            b.insert(p.from);
        }
    }
    let mut grids = (None, None);
    if nnodes <= MATRIX_MAX_NODES {
        let mut front_cells = grid(nnodes, |_, _| GridCell::NotProbed);
        for p in &front {
            if let Some(c) = front_cells.get_mut(p.from).and_then(|row| row.get_mut(p.to)) {
                *c = match &p.error {
                    None => GridCell::Reached { ms: p.ms },
                    Some(_) => GridCell::Failed,
                };
            }
        }
        let mut tally = vec![vec![(0usize, 0usize); nnodes]; nnodes];
        for p in &back {
            if let (Some(&i), Some(&j)) = (node_of.get(p.from), node_of.get(p.to)) {
                let t = &mut tally[i][j];
                t.0 += 1;
                t.1 += usize::from(p.error.is_some());
            }
        }
        let count = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        let back_cells = grid(nnodes, |i, j| match tally[i][j] {
            (0, _) => GridCell::NotProbed,
            (n, b) => GridCell::Exchanges { n: count(n), failed: count(b) },
        });
        // The cells go into the detail once (the report draws them as heat maps; a copy as
        // text tables in the notes doubled the report's largest part).
        grids = (Some(front_cells), Some(back_cells));
    }
    let failed = |v: &[&Probe]| v.iter().filter(|p| p.error.is_some()).map(|p| (*p).clone()).collect();
    // Rank 0's own node's ports, found before the probes, stay in its detail.
    let ib_ports_not_active = match r.detail.take() {
        Some(CheckDetail::Connectivity { ib_ports_not_active, .. }) => ib_ports_not_active,
        _ => Vec::new(),
    };
    r.detail = Some(CheckDetail::Connectivity {
        front_end: grids.0,
        back_end: grids.1,
        front_end_failed: failed(&front),
        back_end_failed: failed(&back),
        front_end_probers: Some(front_probers),
        back_end_peers: Some(back_peers.iter().map(|s| s.len()).collect()),
        ib_ports_not_active,
    });
}

/// A node x node grid of cells, rows "from", columns "to" ("-" on the diagonal).
fn grid(n: usize, cell: impl Fn(usize, usize) -> GridCell) -> Vec<Vec<GridCell>> {
    (0..n).map(|i| (0..n).map(|j| if i == j { GridCell::NotProbed } else { cell(i, j) }).collect()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matrices_name_the_failed_cells() {
        let place = WorkerPlace { node_sizes: vec![1, 1], ..WorkerPlace::single_node(0, 2) };
        let rows = vec![
            Row {
                front: vec![Probe { from: 0, to: 1, ms: 0.0, error: Some("refused".into()) }],
                back: vec![Probe { from: 0, to: 1, ms: 0.5, error: None }],
            },
            Row {
                front: vec![Probe { from: 1, to: 0, ms: 0.2, error: None }],
                back: vec![Probe { from: 1, to: 0, ms: 0.5, error: None }],
            },
        ];
        let mut r = RankResult::new(0, CheckStatus::Passed);
        summarize(&mut r, &rows, &place);
        let Some(CheckDetail::Connectivity {
            front_end_failed: failed,
            front_end: Some(cells),
            back_end: Some(back),
            ..
        }) = &r.detail
        else {
            panic!("no connectivity detail: {:?}", r.detail);
        };
        assert_eq!(cells[0][1], GridCell::Failed);
        assert_eq!(cells[1][0].to_string(), "0.20ms");
        assert_eq!(back[0][1], GridCell::Exchanges { n: 1, failed: 0 });
        assert_eq!(back[0][1].to_string(), "ok 1/1");
        assert!(r.notes.is_empty(), "{:?}", r.notes);
        assert_eq!(failed.len(), 1);
        assert_eq!((failed[0].from, failed[0].to), (0, 1));
    }
}
