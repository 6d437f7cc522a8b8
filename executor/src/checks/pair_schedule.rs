//! The schedule of the pairwise link test (`pair-bandwidth`), and what its figures say.
//!
//! Coverage first, all pairs of a round measured at once: round 1 pairs neighbours (0-1, 2-3...),
//! round 2 (and 3 for an odd count) gives every node a second partner. Then, one pair per round
//! (alone, so that no other pair competes for the hosts or the fabric), the suspects: a pair
//! below [`SLOW_FRACTION`] of the reference is measured again alone, twice, with
//! more calls ([`calls`]); it is slow only if it stays slow (a pair's figure is the best of its
//! measurements, each the fastest of its calls: noise only slows). Each node
//! of a slow pair is then paired, alone, with good nodes it has not been measured with until it
//! is good (fast with one) or slow with two good nodes. A node slow with two good nodes is a
//! slow node; a slow pair of two good nodes is a slow link. The coverage rounds cost O(1)
//! whatever the number of nodes, each fault a few single-pair rounds, at most
//! [`EXTRA_ROUNDS_MAX`] in all. Every rank computes the same schedule from the same figures
//! (read from the store), so no coordinator is needed.
//!
//! The reference is the upper quartile of the pairs' figures (the best pair when there are at
//! most four): what this fabric does, not lowered by the few slow pairs of a fault and not
//! raised by one lucky pair on a busy machine. With two nodes there is nothing to compare
//! with, so two nodes alone are never called slow here.

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
pub fn with_link_test(mut checks: Vec<CheckId>, device: DeviceKind, nnodes: usize) -> Vec<CheckId> {
    const COMM: &[CheckId] = &[
        CheckId::AllReduce,
        CheckId::AllToAll,
        CheckId::AllGather,
        CheckId::MultiAllReduce,
        CheckId::MatmulAllReduceOverlap,
    ];
    let comm = checks.iter().any(|c| COMM.contains(c));
    if nnodes >= 3 && device == DeviceKind::Cpu && comm {
        checks.push(CheckId::PairBandwidth);
    }
    checks
}

/// At most this many single-pair rounds after the coverage rounds.
pub const EXTRA_ROUNDS_MAX: usize = 32;

/// Alone measurements a slow pair needs before it counts as slow.
const CONFIRMATIONS: usize = 2;

/// Seconds of timed calls a suspect's measurement alone may take, at its best figure so far.
pub const CONFIRM_BUDGET_S: f64 = 0.5;

/// At most this many timed calls in one measurement alone.
pub const CONFIRM_CALLS_MAX: usize = 40;

/// Timed calls of one measurement of a round's pairs, each call moving `bytes`. The shared
/// rounds take `base`. A pair alone in its round that was measured before is a suspect being
/// confirmed: on a busy host its two nodes can be descheduled through all of `base` calls, so it
/// gets as many calls as fit in [`CONFIRM_BUDGET_S`] at its best figure so far, up to
/// [`CONFIRM_CALLS_MAX`], and its figure is still the fastest call: a slow link is slow in every
/// call (and keeps `base` calls, its calls being long), a descheduled pair is fast in some. Every
/// rank computes the same count from the same figures, so both members make the same calls.
pub fn calls(m: &[PairBandwidth], round: &[[usize; 2]], bytes: usize, base: usize) -> usize {
    let [p] = round else { return base };
    let gbps = figure(m, p[0], p[1]);
    if !gbps.is_finite() || gbps <= 0.0 {
        return base;
    }
    // A 2-member all-reduce's bus bandwidth is its algorithm bandwidth: bytes per second.
    let per_call = bytes as f64 / (gbps * 1e9);
    // `as` saturates, and maps NaN to 0: the clamp keeps the count within its bounds.
    let fit = (CONFIRM_BUDGET_S / per_call) as usize;
    fit.clamp(base, CONFIRM_CALLS_MAX.max(base))
}

pub fn key(a: usize, b: usize) -> [usize; 2] {
    [a.min(b), a.max(b)]
}

/// What the figures so far say.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Links {
    /// The reference figure: the upper quartile of the pairs' figures.
    pub best: f64,
    /// Pairs below [`SLOW_FRACTION`] of the reference, confirmed or not.
    pub suspects: Vec<[usize; 2]>,
    /// Suspects that stayed slow when measured alone [`CONFIRMATIONS`] times.
    pub slow_pairs: Vec<[usize; 2]>,
    /// Nodes with a pair that is not slow.
    pub good: BTreeSet<usize>,
    /// Nodes slow with every good node they were measured with (at least two, or all others).
    pub slow_nodes: Vec<usize>,
    /// Slow pairs of two good nodes.
    pub slow_links: Vec<[usize; 2]>,
    /// Slow pairs that the figures cannot pin on a node or a link.
    pub unresolved: Vec<[usize; 2]>,
}

/// One pair's figures: the best of its measurements and how many were alone in their round.
#[derive(Debug, Clone, Copy)]
struct Figure {
    best: f64,
    alone: usize,
}

fn figures(m: &[PairBandwidth]) -> std::collections::BTreeMap<[usize; 2], Figure> {
    let mut per_round = std::collections::BTreeMap::<usize, usize>::new();
    for p in m {
        *per_round.entry(p.round).or_default() += 1;
    }
    let mut out = std::collections::BTreeMap::<[usize; 2], Figure>::new();
    for p in m {
        let f = out.entry(key(p.nodes[0], p.nodes[1])).or_insert(Figure { best: 0.0, alone: 0 });
        f.best = f.best.max(p.busbw_gbps);
        f.alone += usize::from(per_round.get(&p.round) == Some(&1));
    }
    out
}

/// The best figure measured for the pair `a`-`b` (0 if never measured).
pub fn figure(m: &[PairBandwidth], a: usize, b: usize) -> f64 {
    m.iter().filter(|p| key(p.nodes[0], p.nodes[1]) == key(a, b)).map(|p| p.busbw_gbps).fold(0.0, f64::max)
}

pub fn classify(nnodes: usize, m: &[PairBandwidth]) -> Links {
    let figs = figures(m);
    let mut sorted: Vec<f64> = figs.values().map(|f| f.best).collect();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let best = sorted.get(sorted.len().saturating_sub(1) / 4).copied().unwrap_or(0.0);
    let slow = |f: &Figure| f.best < SLOW_FRACTION * best;
    let suspects: Vec<[usize; 2]> = figs.iter().filter(|(_, f)| slow(f)).map(|(p, _)| *p).collect();
    let slow_pairs: Vec<[usize; 2]> =
        figs.iter().filter(|(_, f)| slow(f) && f.alone >= CONFIRMATIONS).map(|(p, _)| *p).collect();
    let good: BTreeSet<usize> = figs.iter().filter(|(_, f)| !slow(f)).flat_map(|(p, _)| *p).collect();
    let measured_with = |n: usize| figs.keys().filter(|p| p.contains(&n)).count();
    let mut slow_nodes = Vec::new();
    for n in (0..nnodes).filter(|n| !good.contains(n)) {
        let with_good =
            slow_pairs.iter().filter(|p| p.contains(&n) && p.iter().any(|o| *o != n && good.contains(o))).count();
        let all_slow = slow_pairs.iter().filter(|p| p.contains(&n)).count();
        if with_good >= 2 || (with_good >= 1 && all_slow + 1 >= nnodes && measured_with(n) + 1 >= nnodes) {
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
    Links { best, suspects, slow_pairs, good, slow_nodes, slow_links, unresolved }
}

/// The coverage rounds of `nnodes` nodes: neighbours, then a second partner for every node
/// (a third round when the count is odd), all pairs of a round at once. They depend on the
/// node count alone.
pub fn coverage(nnodes: usize) -> Vec<Vec<[usize; 2]>> {
    if nnodes < 2 {
        return Vec::new();
    }
    let mut rounds: Vec<Vec<[usize; 2]>> = vec![(0..nnodes / 2).map(|i| [2 * i, 2 * i + 1]).collect()];
    let want = 2.min(nnodes - 1);
    loop {
        let measured: BTreeSet<[usize; 2]> = rounds.iter().flatten().copied().collect();
        let partners = |s: usize| measured.iter().filter(|p| p.contains(&s)).count();
        let mut used = BTreeSet::new();
        let mut round = Vec::new();
        for s in (0..nnodes).filter(|&s| partners(s) < want) {
            if used.contains(&s) {
                continue;
            }
            let free = |p: &usize| *p != s && !used.contains(p) && !measured.contains(&key(s, *p));
            // Another node that needs a partner first, then any.
            let partner = (s + 1..nnodes)
                .chain(0..s)
                .find(|p| free(p) && partners(*p) < want)
                .or_else(|| (s + 1..nnodes).chain(0..s).find(|p| free(p)));
            if let Some(p) = partner {
                used.insert(s);
                used.insert(p);
                round.push(key(s, p));
            }
        }
        if round.is_empty() || rounds.len() >= 4 {
            return rounds;
        }
        rounds.push(round);
    }
}

/// The pairs of the next round (empty: the test is over).
pub fn next_round(nnodes: usize, m: &[PairBandwidth]) -> Vec<[usize; 2]> {
    let cover = coverage(nnodes);
    let rounds = m.iter().map(|p| p.round).max().unwrap_or(0);
    if let Some(round) = cover.get(rounds) {
        return round.clone();
    }
    if rounds >= cover.len() + EXTRA_ROUNDS_MAX {
        return Vec::new();
    }
    let figs = figures(m);
    let links = classify(nnodes, m);
    // Confirm: a suspect measured alone fewer times than the confirmations needed.
    if let Some(p) = links.suspects.iter().find(|p| figs.get(*p).is_some_and(|f| f.alone < CONFIRMATIONS)) {
        return vec![*p];
    }
    // Localize: a node of a slow pair that is neither good nor slow yet, with a good node it
    // was not measured with.
    for p in &links.slow_pairs {
        for &s in p {
            if links.good.contains(&s) || links.slow_nodes.contains(&s) {
                continue;
            }
            if let Some(g) = links.good.iter().copied().find(|g| *g != s && !figs.contains_key(&key(s, *g))) {
                return vec![key(s, g)];
            }
        }
    }
    Vec::new()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Runs the adaptive schedule against a fabric where `bw(a, b)` is a pair's figure.
    pub(crate) fn simulate(n: usize, bw: impl Fn(usize, usize) -> f64) -> (Vec<PairBandwidth>, usize) {
        simulate_noisy(n, |a, b, _| bw(a, b))
    }

    /// The schedule against a fabric where `bw(a, b, alone)` is a pair's figure, `alone` when
    /// the pair has its round to itself.
    pub(crate) fn simulate_noisy(n: usize, bw: impl Fn(usize, usize, bool) -> f64) -> (Vec<PairBandwidth>, usize) {
        let mut m = Vec::new();
        let mut rounds = 0;
        loop {
            let next = next_round(n, &m);
            if next.is_empty() {
                return (m, rounds);
            }
            rounds += 1;
            let alone = next.len() == 1;
            for p in next {
                m.push(PairBandwidth { nodes: p, busbw_gbps: bw(p[0], p[1], alone), round: rounds });
            }
        }
    }

    #[test]
    fn wrong_figures_are_not_waved_through() {
        // A node that is slow must not pass as good because its figures are merely "some".
        let pair = |nodes, busbw_gbps, round| PairBandwidth { nodes, busbw_gbps, round };
        let mut m = vec![pair([0, 1], 10.0, 1), pair([0, 2], 2.9, 2), pair([1, 2], 2.0, 3)];
        assert!(classify(3, &m).slow_nodes.is_empty(), "measured alone once: not yet slow");
        m.extend([pair([0, 2], 2.5, 4), pair([1, 2], 2.8, 5)]);
        assert_eq!(classify(3, &m).slow_nodes, [2]);
        m.push(pair([0, 2], 3.1, 6));
        assert!(classify(3, &m).slow_nodes.is_empty(), "fast once: not slow");
    }

    #[test]
    fn a_suspect_alone_gets_more_calls_within_the_budget_and_a_slow_link_no_more() {
        let pair = |nodes, busbw_gbps, round| PairBandwidth { nodes, busbw_gbps, round };
        let bytes = 4 << 20;
        let m = vec![pair([0, 1], 2.0, 1), pair([2, 3], 0.3, 1), pair([4, 5], 0.0125, 1)];
        // Shared rounds, and a pair never measured: the base count.
        assert_eq!(calls(&m, &[[0, 1], [2, 3]], bytes, 5), 5);
        assert_eq!(calls(&m, &[[0, 2]], bytes, 5), 5);
        // A descheduled pair at 0.3 GB/s: 14 ms a call, 35 calls in half a second.
        assert_eq!(calls(&m, &[[2, 3]], bytes, 5), 35);
        // A fast pair is capped; a 100 Mbit/s link (0.34 s a call) keeps the base count.
        assert_eq!(calls(&m, &[[0, 1]], bytes, 5), CONFIRM_CALLS_MAX);
        assert_eq!(calls(&m, &[[4, 5]], bytes, 5), 5);
        // Hostile figures (read from the store): never below the base count nor above the cap.
        for v in [f64::INFINITY, f64::NAN, -1.0, f64::MAX, f64::MIN_POSITIVE] {
            let n = calls(&[pair([0, 1], v, 1)], &[[0, 1]], bytes, 5);
            assert!((5..=CONFIRM_CALLS_MAX).contains(&n), "{v}: {n}");
        }
        assert_eq!(calls(&m, &[[2, 3]], 0, 5), CONFIRM_CALLS_MAX);
        assert_eq!(calls(&m, &[[2, 3]], bytes, 50), 50);
    }

    #[test]
    fn every_node_gets_two_partners_in_at_most_four_coverage_rounds() {
        for n in 2..70 {
            let c = coverage(n);
            assert!(c.len() <= 4, "n {n}: {} rounds", c.len());
            for s in 0..n {
                let k = c.iter().flatten().filter(|p| p.contains(&s)).count();
                assert!(k >= 2.min(n - 1), "n {n} node {s}: {k} partners");
            }
            for round in &c {
                let mut used = BTreeSet::new();
                assert!(round.iter().flatten().all(|s| used.insert(*s)), "n {n}: a node twice in a round");
            }
        }
    }

    #[test]
    fn contention_in_the_shared_rounds_is_not_a_finding() {
        // Pairs measured at once on a busy machine read anything from 5% to 100% of what they do
        // alone; alone they are all alike.
        for n in [3, 4, 8, 16, 32, 64] {
            let (m, rounds) =
                simulate_noisy(
                    n,
                    |a, b, alone| {
                        if alone {
                            2.0
                        } else {
                            2.0 * (0.05 + ((a * 7 + b * 13) % 20) as f64 / 20.0)
                        }
                    },
                );
            let l = classify(n, &m);
            assert!(l.slow_pairs.is_empty() && l.slow_nodes.is_empty(), "n {n}: {l:?}");
            assert!(rounds <= 4 + EXTRA_ROUNDS_MAX, "n {n}: {rounds}");
        }
    }

    #[test]
    fn a_slow_node_is_named_through_contention() {
        for (n, bad) in [(8, 3), (16, 9), (64, 40)] {
            let (m, _) = simulate_noisy(n, |a, b, alone| {
                let f = if a == bad || b == bad { 0.2 } else { 2.0 };
                if alone {
                    f
                } else {
                    f * (0.3 + ((a + b) % 3) as f64 / 3.0)
                }
            });
            assert_eq!(classify(n, &m).slow_nodes, [bad], "n {n}");
        }
    }
}
