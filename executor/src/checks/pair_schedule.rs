//! The schedule of the pairwise link test (`pair-bandwidth`), and what its figures say.
//!
//! A round measures disjoint node pairs at once. Round 1 pairs neighbours (0-1, 2-3...), round
//! 2 gives every node a second partner. A node with a fast pair is good; every other node is a
//! suspect and, in the next round, is paired with a good node it has not been measured with
//! (or, with no good node yet, with any node). A suspect slow with two good nodes is a slow
//! node; a slow pair of two good nodes is a slow link. With few faults this ends in 2-3 rounds
//! whatever the number of nodes: far fewer than the n-1 rounds of the whole matrix. Every rank
//! computes the same schedule from the same figures (read from the store), so no coordinator
//! is needed.
//!
//! "Fast" is relative to the best pair measured (what this fabric can do): a pair below
//! [`SLOW_FRACTION`] of it is slow. With two nodes there is nothing to compare with, so two
//! nodes alone are never called slow here. The diagnosis reads the same classification to name
//! a slow node or a slow link.

use std::collections::BTreeSet;

use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{DeviceKind, PairBandwidth};

/// A pair below this fraction of the best pair is slow. Healthy pairs of one fabric differ by
/// far less; a throttled or degraded link by far more.
pub const SLOW_FRACTION: f64 = 0.3;

/// The checks to run: the selected ones, plus the link test on a CPU run of 3 or more nodes
/// with a communication check (two nodes alone have nothing to compare their pair with). On
/// CPU no expected figure says whether a collective is slow, so the link test always runs
/// there; the CUDA backend has no 2-member NCCL rail test yet.
pub fn with_link_test(mut checks: Vec<String>, device: DeviceKind, nnodes: usize) -> Vec<String> {
    const COMM: &[CheckId] = &[
        CheckId::AllReduce,
        CheckId::AllToAll,
        CheckId::AllGather,
        CheckId::MultiAllReduce,
        CheckId::MatmulAllReduceOverlap,
    ];
    let comm = checks.iter().any(|c| COMM.iter().any(|id| c == id));
    if nnodes >= 3 && device == DeviceKind::Cpu && comm {
        checks.push(CheckId::PairBandwidth.into());
    }
    checks
}

pub fn key(a: usize, b: usize) -> [usize; 2] {
    [a.min(b), a.max(b)]
}

/// What the figures so far say.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Links {
    pub best: f64,
    pub slow_pairs: Vec<[usize; 2]>,
    pub good: BTreeSet<usize>,
    /// Nodes slow with every good node they were measured with (at least two, or all others).
    pub slow_nodes: Vec<usize>,
    /// Slow pairs of two good nodes.
    pub slow_links: Vec<[usize; 2]>,
    /// Slow pairs that the figures cannot pin on a node or a link.
    pub unresolved: Vec<[usize; 2]>,
}

pub fn classify(nnodes: usize, m: &[PairBandwidth]) -> Links {
    let best = m.iter().map(|p| p.busbw_gbps).fold(0.0, f64::max);
    let is_slow = |p: &PairBandwidth| p.busbw_gbps < SLOW_FRACTION * best;
    let slow_pairs: Vec<[usize; 2]> = m.iter().filter(|p| is_slow(p)).map(|p| key(p.nodes[0], p.nodes[1])).collect();
    let good: BTreeSet<usize> = m.iter().filter(|p| !is_slow(p)).flat_map(|p| p.nodes).collect();
    let partners = |n: usize| -> Vec<usize> {
        slow_pairs.iter().filter(|p| p.contains(&n)).map(|p| if p[0] == n { p[1] } else { p[0] }).collect()
    };
    let mut slow_nodes = Vec::new();
    for n in (0..nnodes).filter(|n| !good.contains(n)) {
        let with_good = partners(n).iter().filter(|p| good.contains(p)).count();
        if with_good >= 2 || (with_good >= 1 && partners(n).len() + 1 >= nnodes) {
            slow_nodes.push(n);
        }
    }
    let mut slow_links = Vec::new();
    let mut unresolved = Vec::new();
    for p in &slow_pairs {
        if good.contains(&p[0]) && good.contains(&p[1]) {
            slow_links.push(*p);
        } else if !slow_nodes.contains(&p[0]) && !slow_nodes.contains(&p[1]) {
            unresolved.push(*p);
        }
    }
    Links { best, slow_pairs, good, slow_nodes, slow_links, unresolved }
}

/// The pairs of the next round (empty: the test is over).
pub fn next_round(nnodes: usize, m: &[PairBandwidth]) -> Vec<[usize; 2]> {
    if m.is_empty() {
        return (0..nnodes / 2).map(|i| [2 * i, 2 * i + 1]).collect();
    }
    let rounds = m.iter().map(|p| p.round).max().unwrap_or(0);
    if rounds >= nnodes {
        return Vec::new();
    }
    let links = classify(nnodes, m);
    let measured: BTreeSet<[usize; 2]> = m.iter().map(|p| key(p.nodes[0], p.nodes[1])).collect();
    let partners = |s: usize| measured.iter().filter(|p| p.contains(&s)).count();
    let with_good = |s: usize| {
        links
            .slow_pairs
            .iter()
            .filter(|p| p.contains(&s) && p.iter().any(|o| *o != s && links.good.contains(o)))
            .count()
    };
    // Every node is measured with two partners at least (so that one slow node cannot make the
    // best pair look slow); a suspect until it is good or slow with two good nodes.
    let needy = |s: usize| {
        partners(s) < 2.min(nnodes - 1)
            || (!links.good.contains(&s) && !links.slow_nodes.contains(&s) && with_good(s) < 2)
    };
    let mut used = BTreeSet::new();
    let mut round = Vec::new();
    for s in (0..nnodes).filter(|s| needy(*s)) {
        if used.contains(&s) {
            continue;
        }
        let free = |p: &usize| *p != s && !used.contains(p) && !measured.contains(&key(s, *p));
        let partner = links.good.iter().copied().find(|p| free(p)).or_else(|| (0..nnodes).find(|p| free(p)));
        if let Some(p) = partner {
            used.insert(s);
            used.insert(p);
            round.push(key(s, p));
        }
    }
    round
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Runs the adaptive schedule against a fabric where `bw(a, b)` is a pair's figure.
    pub(crate) fn simulate(n: usize, bw: impl Fn(usize, usize) -> f64) -> (Vec<PairBandwidth>, usize) {
        let mut m = Vec::new();
        let mut rounds = 0;
        loop {
            let next = next_round(n, &m);
            if next.is_empty() {
                return (m, rounds);
            }
            rounds += 1;
            for p in next {
                m.push(PairBandwidth { nodes: p, busbw_gbps: bw(p[0], p[1]), round: rounds });
            }
        }
    }

    #[test]
    fn wrong_figures_are_not_waved_through() {
        // A node that is slow must not pass as good because its figures are merely "some".
        let m = vec![
            PairBandwidth { nodes: [0, 1], busbw_gbps: 10.0, round: 1 },
            PairBandwidth { nodes: [0, 2], busbw_gbps: 2.9, round: 2 },
            PairBandwidth { nodes: [1, 2], busbw_gbps: 2.0, round: 3 },
        ];
        assert_eq!(classify(3, &m).slow_nodes, [2]);
        let m = vec![PairBandwidth { nodes: [0, 2], busbw_gbps: 3.1, ..m[1].clone() }, m[0].clone()];
        assert!(classify(3, &m).slow_nodes.is_empty());
    }
}
