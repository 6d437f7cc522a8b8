//! Diagnosis of the micro-benchmarks beyond gemm and all-reduce: their finding codes, the
//! figure by which a slow rank is named, and the findings that need more than one rank's
//! status (a failed connectivity pair, a slow group of concurrent all-reduces).

use std::collections::BTreeSet;

use gpusanity_common::report::{CheckReport, Finding, RankInfo, Severity};

use crate::checks::network_connectivity::Probe;

/// The code of a wrong result found by `check`'s own verifier (gemm has its own).
pub fn wrong_code(check: &str) -> &'static str {
    match check {
        "all-gather" => "ALLGATHER_WRONG_RESULT",
        "all-to-all" => "ALLTOALL_WRONG_RESULT",
        "multi-all-reduce" => "MULTI_ALLREDUCE_WRONG_RESULT",
        "matmul-all-reduce-overlap" => "OVERLAP_WRONG_RESULT",
        _ => "ALLREDUCE_WRONG_RESULT",
    }
}

/// Whether `check` names its failures itself in [`diagnose`] (a failed rank is not a wrong
/// result there).
pub fn own_findings(check: &str) -> bool {
    check == "network-connectivity"
}

/// The figure (higher is better) a rank is compared with its peers by, the code of a slow
/// rank and the unit.
pub fn slow_metric(check: &str) -> Option<(&'static str, &'static str, &'static str)> {
    match check {
        "all-gather" => Some(("busbw_gbps", "ALLGATHER_SLOW", "GB/s busbw")),
        "all-to-all" => Some(("busbw_gbps", "ALLTOALL_SLOW", "GB/s busbw")),
        "matmul-all-reduce-overlap" => Some(("overlapped_steps_per_s", "OVERLAP_SLOW", "overlapped steps/s")),
        "kernel-launch" => Some(("launches_per_s", "KERNEL_LAUNCH_SLOW", "round trips/s")),
        _ => None,
    }
}

/// Findings of `c` beyond per-rank statuses and figures.
pub fn diagnose(c: &CheckReport, ranks: &[RankInfo], slow_fraction: f64, findings: &mut Vec<Finding>) {
    match c.name.as_str() {
        "network-connectivity" => connectivity(c, ranks, findings),
        "multi-all-reduce" => multi_all_reduce(c, ranks, slow_fraction, findings),
        _ => {}
    }
}

fn place(f: &mut Finding, info: Option<&RankInfo>) {
    if let Some(i) = info {
        f.node_rank = Some(i.node_rank);
        f.host = Some(i.host.clone());
        f.rank = Some(i.rank);
    }
}

/// Front end: a node no other node reaches is named; other failed connections name the pair.
/// Back end: a rank whose every cross-node probe failed (with two or more peers) is named;
/// other failed exchanges name the pair. RDMA ports not ACTIVE are warned about.
fn connectivity(c: &CheckReport, ranks: &[RankInfo], findings: &mut Vec<Finding>) {
    let name = c.name.as_str();
    let info = |rank: usize| ranks.iter().find(|r| r.rank == rank);
    let first_of_node = |node: usize| ranks.iter().filter(|r| r.node_rank == node).min_by_key(|r| r.rank);
    let host = |node: usize| {
        first_of_node(node).map_or_else(|| format!("node {node}"), |r| format!("node {node} ({})", r.host))
    };
    let nodes: BTreeSet<usize> = ranks.iter().map(|r| r.node_rank).collect();
    let parse = |key: &str| -> Vec<Probe> {
        c.ranks
            .iter()
            .find(|r| r.rank == 0)
            .and_then(|r| r.notes.get(key))
            .and_then(|s| serde_json::from_str(s).ok())
            .unwrap_or_default()
    };
    let front = parse("front_end_failed");
    let mut named = BTreeSet::new();
    for &target in &nodes {
        let from: BTreeSet<usize> = front.iter().filter(|p| p.to == target).map(|p| p.from).collect();
        if nodes.len() >= 2 && from.len() == nodes.len() - 1 {
            let why: Vec<String> = front.iter().filter(|p| p.to == target).filter_map(|p| p.error.clone()).collect();
            let msg =
                format!("{} is unreachable on the front end from every other node: {}", host(target), why.join("; "));
            let mut f = Finding::new(Severity::Critical, "NET_FRONTEND_UNREACHABLE", name, msg);
            place(&mut f, first_of_node(target));
            findings.push(f);
            named.insert(target);
        }
    }
    for p in front.iter().filter(|p| !named.contains(&p.to)) {
        let msg = format!(
            "{} cannot reach {} on the front end: {}",
            host(p.from),
            host(p.to),
            p.error.clone().unwrap_or_default()
        );
        findings.push(Finding::new(Severity::Critical, "NET_FRONTEND_PAIR_FAILED", name, msg));
    }

    let back = parse("back_end_failed");
    let pair = |p: &Probe| (p.from.min(p.to), p.from.max(p.to));
    let failed: BTreeSet<(usize, usize)> = back.iter().map(pair).collect();
    let mut blamed = BTreeSet::new();
    for r in ranks {
        let peers: BTreeSet<usize> = ranks.iter().filter(|q| q.node_rank != r.node_rank).map(|q| q.rank).collect();
        let bad: BTreeSet<usize> = failed
            .iter()
            .filter_map(|&(a, b)| {
                if a == r.rank {
                    Some(b)
                } else if b == r.rank {
                    Some(a)
                } else {
                    None
                }
            })
            .collect();
        if peers.len() >= 2 && bad == peers {
            let msg = format!(
                "rank {} failed the back-end exchange with every rank on other nodes ({} peers)",
                r.rank,
                peers.len()
            );
            let mut f = Finding::new(Severity::Critical, "NET_BACKEND_RANK_UNREACHABLE", name, msg);
            place(&mut f, Some(r));
            findings.push(f);
            blamed.insert(r.rank);
        }
    }
    for &(a, b) in failed.iter().filter(|(a, b)| !blamed.contains(a) && !blamed.contains(b)) {
        let why: Vec<String> = back.iter().filter(|p| pair(p) == (a, b)).filter_map(|p| p.error.clone()).collect();
        let side = |r: usize| info(r).map_or(format!("rank {r}"), |i| format!("rank {r} ({})", host(i.node_rank)));
        let msg = format!("back-end exchange between {} and {} failed: {}", side(a), side(b), why.join("; "));
        findings.push(Finding::new(Severity::Critical, "NET_BACKEND_PAIR_FAILED", name, msg));
    }
    for r in &c.ranks {
        if let Some(down) = r.notes.get("ib_ports_not_active") {
            let mut f = Finding::new(
                Severity::Warning,
                "NET_IB_PORT_NOT_ACTIVE",
                name,
                format!("RDMA ports not ACTIVE: {down}"),
            );
            place(&mut f, info(r.rank));
            findings.push(f);
        }
    }
}

fn multi_all_reduce(c: &CheckReport, ranks: &[RankInfo], slow_fraction: f64, findings: &mut Vec<Finding>) {
    let _ = (c, ranks, slow_fraction, findings);
}
