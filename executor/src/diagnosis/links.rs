//! Slow link or slow node: the findings from the pairwise link test's figures, classified by
//! [`crate::checks::pair_schedule::classify`] (the same reading that schedules the test's rounds).

use std::collections::BTreeSet;

use gpusanity_common::findings::Code;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{Finding, PairBandwidth, Severity};

use crate::checks::pair_schedule::{classify, figure, SLOW_FRACTION};

/// The check that runs the link test (hidden: added by the launcher on multi-node runs).
pub const CHECK: CheckId = CheckId::PairBandwidth;

/// Findings from the link test's figures. A slow pair with a node in `known_bad` (already named
/// critical by another check, e.g. starved of CPU) is explained by that node, not by the link.
pub fn findings(
    nnodes: usize,
    m: &[PairBandwidth],
    host: impl Fn(usize) -> String,
    known_bad: &BTreeSet<usize>,
) -> Vec<Finding> {
    let mut links = classify(nnodes, m);
    let explained = |p: &[usize; 2]| p.iter().any(|n| known_bad.contains(n));
    links.slow_links.retain(|p| !explained(p));
    links.unresolved.retain(|p| !explained(p));
    let fig = |a: usize, b: usize| figure(m, a, b);
    let mut out = Vec::new();
    for &n in &links.slow_nodes {
        let pairs: Vec<String> = links
            .slow_pairs
            .iter()
            .filter(|p| p.contains(&n))
            .map(|p| format!("node {}-{}: {:.3} GB/s", p[0], p[1], fig(p[0], p[1])))
            .collect();
        let mut f = Finding::new(
            Severity::Critical,
            Code::NodeCommSlow,
            CHECK,
            format!(
                "every pair with node {n} is slow, measured alone twice (below {:.0}% of the reference pair, {:.3} GB/s): {}",
                SLOW_FRACTION * 100.0,
                links.best,
                pairs.join(", ")
            ),
        );
        f.node_rank = Some(n);
        f.host = Some(host(n));
        f.measured = Some(pairs_min(m, n));
        f.peers_median = Some(links.best);
        f.evidence = pairs;
        f.action = Some("exclude the node; inspect its NIC, cable and switch port".into());
        out.push(f);
    }
    for (p, sev, why) in links
        .slow_links
        .iter()
        .map(|p| (p, Severity::Critical, "both nodes are fast with others: the link between them is slow"))
        .chain(
            links
                .unresolved
                .iter()
                .map(|p| (p, Severity::Warning, "no other pair tells whether a node or the link is slow")),
        )
    {
        let mut f = Finding::new(
            sev,
            Code::LinkSlow,
            CHECK,
            format!(
                "nodes {} and {}: {:.3} GB/s measured alone twice, reference pair {:.3} GB/s; {why}",
                p[0],
                p[1],
                fig(p[0], p[1]),
                links.best
            ),
        );
        f.pair = Some(*p);
        f.measured = Some(fig(p[0], p[1]));
        f.peers_median = Some(links.best);
        f.action =
            Some(format!("inspect the path between {} and {} (cables, switch ports, routes)", host(p[0]), host(p[1])));
        out.push(f);
    }
    out
}

/// The slowest of node `n`'s pairs, each at the best of its measurements.
fn pairs_min(m: &[PairBandwidth], n: usize) -> f64 {
    m.iter().filter(|p| p.nodes.contains(&n)).map(|p| figure(m, p.nodes[0], p.nodes[1])).fold(f64::INFINITY, f64::min)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checks::pair_schedule::key;
    use crate::checks::pair_schedule::tests::simulate;

    #[test]
    fn a_clean_fabric_needs_one_or_two_rounds_and_names_nothing() {
        for n in [2, 3, 4, 7, 16] {
            let (m, rounds) = simulate(n, |a, b| 10.0 + (a + b) as f64 * 0.1);
            assert!(rounds <= 4, "{n}: {rounds}");
            assert!(findings(n, &m, |k| format!("n{k}"), &BTreeSet::new()).is_empty(), "{n}");
        }
    }

    #[test]
    fn a_slow_node_is_named_in_few_rounds() {
        for (n, bad) in [(3, 2), (3, 0), (4, 3), (8, 5), (16, 0), (33, 17)] {
            let (m, rounds) = simulate(n, |a, b| if a == bad || b == bad { 0.5 } else { 10.0 });
            let l = classify(n, &m);
            assert_eq!(l.slow_nodes, [bad], "n {n} bad {bad}: {l:?}");
            assert!(l.slow_links.is_empty() && l.unresolved.is_empty(), "{l:?}");
            assert!(rounds <= 14, "n {n}: {rounds} rounds");
            let f = findings(n, &m, |k| format!("n{k}"), &BTreeSet::new());
            assert_eq!(f.len(), 1);
            assert_eq!((f[0].code, f[0].node_rank), (Code::NodeCommSlow, Some(bad)));
        }
    }

    #[test]
    fn a_slow_link_is_told_from_a_slow_node() {
        // Links the schedule measures (round 1 or 2); a route between two good nodes that no round
        // pairs is not looked at: the test localizes, it does not measure the whole matrix.
        for (n, link) in [(4, [0, 1]), (5, [0, 2]), (8, [2, 3])] {
            let (m, _) = simulate(n, |a, b| if key(a, b) == link { 0.5 } else { 10.0 });
            let l = classify(n, &m);
            assert_eq!((l.slow_nodes.clone(), l.slow_links.clone()), (vec![], vec![link]), "{l:?}");
            let f = findings(n, &m, |k| format!("n{k}"), &BTreeSet::new());
            assert_eq!((f[0].code, f[0].pair, f[0].severity), (Code::LinkSlow, Some(link), Severity::Critical));
        }
    }
}
