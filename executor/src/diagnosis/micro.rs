//! Diagnosis of the micro-benchmarks: the findings that need more than one rank's status (a
//! failed connectivity pair, a slow group of concurrent all-reduces, a GPU whose host link
//! drops when the node's GPUs copy at once) and those a check lists itself (the RDMA ports'
//! faults). Their wrong-result codes and headline figures are in their descriptors.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpusanity_common::config::CheckConfigs;
use gpusanity_common::detail::{GroupKind, Probe, ReduceGroup};
use gpusanity_common::findings::Code;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{CheckDetail, CheckReport, Finding, RankInfo, Severity};
use gpusanity_common::stats::median;

use super::place;

/// A check's findings beyond per-rank statuses and figures.
type Hook = fn(&CheckReport, &[RankInfo], &CheckConfigs, &mut Vec<Finding>);

/// The checks with findings of their own; every other check has none (its wrong results and
/// headline figures are judged from its descriptor), so a new check is added here only when it
/// raises more.
const HOOKS: &[(CheckId, Hook)] = &[
    (CheckId::NetworkConnectivity, |c, ranks, _, findings| connectivity(c, ranks, findings)),
    (CheckId::MultiAllReduce, multi_all_reduce),
    (CheckId::HostBandwidth, |c, ranks, cfg, findings| {
        super::hostlink::host_concurrent(c, ranks, cfg.slow_fraction, findings)
    }),
    (CheckId::RdmaPorts, |c, ranks, _, findings| super::hostlink::rdma_ports(c, ranks, findings)),
];

/// Findings of `c` beyond per-rank statuses and figures, under the run's `configs`.
pub fn diagnose(c: &CheckReport, ranks: &[RankInfo], configs: &CheckConfigs, findings: &mut Vec<Finding>) {
    if let Some((_, hook)) = HOOKS.iter().find(|(id, _)| *id == c.name) {
        hook(c, ranks, configs, findings);
    }
}

/// Places `f` on the rank of `info`, if any.
fn place_on(f: Finding, ranks: &[RankInfo], info: Option<&RankInfo>) -> Finding {
    match info {
        Some(i) => place(f, ranks, i.rank),
        None => f,
    }
}

/// Front end: a node no other node reaches is named; other failed connections name the pair.
/// Back end: a rank whose every cross-node probe failed (with two or more peers) is named;
/// other failed exchanges name the pair. RDMA ports not ACTIVE are warned about.
fn connectivity(c: &CheckReport, ranks: &[RankInfo], findings: &mut Vec<Finding>) {
    let name = c.name;
    let info = |rank: usize| ranks.iter().find(|r| r.rank == rank);
    let first_of_node = |node: usize| ranks.iter().filter(|r| r.node_rank == node).min_by_key(|r| r.rank);
    let host = |node: usize| {
        first_of_node(node).map_or_else(|| format!("node {node}"), |r| format!("node {node} ({})", r.host))
    };
    let nodes: BTreeSet<usize> = ranks.iter().map(|r| r.node_rank).collect();
    let empty = Vec::new();
    // How many partners probed each node and rank (a run beyond the whole-matrix size probes a
    // few partners each); reports without them probed every other node and rank.
    let (front, back, front_probers, back_peers) =
        match c.ranks.iter().find(|r| r.rank == 0).and_then(|r| r.detail.as_ref()) {
            Some(CheckDetail::Connectivity {
                front_end_failed,
                back_end_failed,
                front_end_probers,
                back_end_peers,
                ..
            }) => (front_end_failed, back_end_failed, front_end_probers.clone(), back_end_peers.clone()),
            _ => (&empty, &empty, None, None),
        };
    let mut named = BTreeSet::new();
    for &target in &nodes {
        let from: BTreeSet<usize> = front.iter().filter(|p| p.to == target).map(|p| p.from).collect();
        let probers =
            front_probers.as_ref().and_then(|v| v.get(target).copied()).unwrap_or(nodes.len().saturating_sub(1));
        if probers >= 1 && from.len() == probers {
            let why: Vec<String> = front.iter().filter(|p| p.to == target).filter_map(|p| p.error.clone()).collect();
            let msg = format!(
                "{} is unreachable on the front end from every node that probed it ({probers}): {}",
                host(target),
                why.join("; ")
            );
            let f = Finding::new(Severity::Critical, Code::NetFrontendUnreachable, name, msg);
            findings.push(place_on(f, ranks, first_of_node(target)));
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
        findings.push(Finding::new(Severity::Critical, Code::NetFrontendPairFailed, name, msg));
    }

    let pair = |p: &Probe| (p.from.min(p.to), p.from.max(p.to));
    let failed: BTreeSet<(usize, usize)> = back.iter().map(pair).collect();
    let mut blamed = BTreeSet::new();
    // Linear in ranks and failed pairs: each rank's failed partners, and how many ranks each
    // node holds (a rank's peers are the ranks of the other nodes).
    let node_of: HashMap<usize, usize> = ranks.iter().map(|r| (r.rank, r.node_rank)).collect();
    let mut per_node: HashMap<usize, usize> = HashMap::new();
    for r in ranks {
        *per_node.entry(r.node_rank).or_default() += 1;
    }
    let mut bad_of: HashMap<usize, BTreeSet<usize>> = HashMap::new();
    for &(a, b) in &failed {
        bad_of.entry(a).or_default().insert(b);
        bad_of.entry(b).or_default().insert(a);
    }
    for r in ranks {
        let Some(bad) = bad_of.get(&r.rank) else { continue };
        let peers = ranks.len() - per_node.get(&r.node_rank).copied().unwrap_or(0);
        let on_other_nodes = bad.iter().all(|q| node_of.get(q).is_some_and(|&n| n != r.node_rank));
        let expected = back_peers.as_ref().and_then(|v| v.get(r.rank).copied()).unwrap_or(peers);
        if expected >= 2 && bad.len() == expected && on_other_nodes {
            let msg = format!(
                "rank {} failed the back-end exchange with every rank it was paired with on other nodes ({expected} peers)",
                r.rank
            );
            let f = Finding::new(Severity::Critical, Code::NetBackendRankUnreachable, name, msg);
            findings.push(place(f, ranks, r.rank));
            blamed.insert(r.rank);
        }
    }
    for &(a, b) in failed.iter().filter(|(a, b)| !blamed.contains(a) && !blamed.contains(b)) {
        let why: Vec<String> = back.iter().filter(|p| pair(p) == (a, b)).filter_map(|p| p.error.clone()).collect();
        let side = |r: usize| info(r).map_or(format!("rank {r}"), |i| format!("rank {r} ({})", host(i.node_rank)));
        let msg = format!("back-end exchange between {} and {} failed: {}", side(a), side(b), why.join("; "));
        findings.push(Finding::new(Severity::Critical, Code::NetBackendPairFailed, name, msg));
    }
    for r in &c.ranks {
        if let Some(CheckDetail::Connectivity { ib_ports_not_active: down, .. }) = &r.detail {
            if down.is_empty() {
                continue;
            }
            let f = Finding::new(
                Severity::Warning,
                Code::NetIbPortNotActive,
                name,
                format!("RDMA ports not ACTIVE: {}", down.join("; ")),
            );
            findings.push(place_on(f, ranks, info(r.rank)));
        }
    }
}

/// A group, its ranks and the median of their figures.
type GroupFigure<'a> = (ReduceGroup, &'a [usize], f64);

/// Each group's busbw (the median of its members' figures) against the groups of its kind
/// (rails, nodes, world): a group below `slow_fraction` of its kind's median is named, where
/// the run's configuration asks for the comparison.
fn multi_all_reduce(c: &CheckReport, ranks: &[RankInfo], configs: &CheckConfigs, findings: &mut Vec<Finding>) {
    if !configs.multi_all_reduce.compare_groups {
        return;
    }
    let slow_fraction = configs.slow_fraction;
    // Every group's members and the figures its members measured.
    let mut by_group: BTreeMap<ReduceGroup, (&[usize], Vec<f64>)> = BTreeMap::new();
    for r in &c.ranks {
        let Some(CheckDetail::MultiAllReduce { groups }) = &r.detail else { continue };
        for g in groups {
            by_group.entry(g.group).or_insert((&g.ranks, Vec::new())).1.push(g.busbw_gbps);
        }
    }
    let mut by_kind: BTreeMap<GroupKind, Vec<GroupFigure<'_>>> = BTreeMap::new();
    for (g, (members, v)) in &by_group {
        by_kind.entry(g.kind).or_default().push((*g, members, median(v)));
    }
    for groups in by_kind.values().filter(|g| g.len() >= 2) {
        let med = median(&groups.iter().map(|(_, _, v)| *v).collect::<Vec<_>>());
        for (g, members, v) in groups.iter().filter(|(_, _, v)| *v < slow_fraction * med) {
            let msg = format!(
                "group {g} (ranks {members:?}): {v:.2} GB/s busbw, below {:.0}% of the median {med:.2} of its kind",
                slow_fraction * 100.0
            );
            let mut f = Finding::new(Severity::Critical, Code::MultiAllreduceSlowGroup, c.name, msg);
            if g.kind == GroupKind::Node {
                f.node_rank = Some(g.index);
                f.host = ranks.iter().find(|r| r.node_rank == g.index).map(|r| r.host.clone());
            }
            f.measured = Some(*v);
            f.peers_median = Some(med);
            findings.push(f);
        }
    }
}

#[cfg(test)]
mod tests {
    use gpusanity_common::detail::GroupBusbw;
    use gpusanity_common::report::{CheckStatus, RankResult};

    use super::*;

    fn report(name: &str, ranks: Vec<RankResult>) -> CheckReport {
        CheckReport {
            name: name.parse().expect("a check's name"),
            status: CheckStatus::NotRun,
            duration_s: 1.0,
            config: serde_json::Value::Null,
            ranks,
        }
    }

    fn cfg() -> CheckConfigs {
        CheckConfigs::defaults(gpusanity_common::report::DeviceKind::Cuda)
    }

    fn infos(n: usize, per_node: usize) -> Vec<RankInfo> {
        (0..n)
            .map(|i| RankInfo {
                rank: i,
                node_rank: i / per_node,
                local_rank: i % per_node,
                host: format!("h{}", i / per_node),
                device: "cpu".into(),
                pid: 0,
                link: None,
            })
            .collect()
    }

    #[test]
    fn a_slow_rail_is_named_and_a_balanced_run_is_not() {
        // 2 nodes x 4: rails 0..3 of ranks {i, i + 4}; rail 2 at a third of the others.
        let group = |kind, index, ranks: Vec<usize>, busbw_gbps| GroupBusbw {
            group: ReduceGroup { kind, index },
            ranks,
            busbw_gbps,
        };
        let ranks: Vec<RankResult> = (0..8)
            .map(|i| {
                let mut r = RankResult::new(i, CheckStatus::Passed);
                let rail = i % 4;
                let node = i / 4;
                let groups = vec![
                    group(GroupKind::Rail, rail, vec![rail, rail + 4], if rail == 2 { 30.0 } else { 90.0 + i as f64 }),
                    group(GroupKind::Node, node, (node * 4..node * 4 + 4).collect(), 200.0),
                ];
                r.detail = Some(CheckDetail::MultiAllReduce { groups });
                r
            })
            .collect();
        let mut f = Vec::new();
        let mut c = report("multi-all-reduce", ranks.clone());
        let mut configs = CheckConfigs::defaults(gpusanity_common::report::DeviceKind::Cuda);
        configs.multi_all_reduce.compare_groups = false;
        diagnose(&c, &infos(8, 4), &configs, &mut f);
        assert!(f.is_empty(), "no comparison unless configured");
        configs.multi_all_reduce.compare_groups = true;
        diagnose(&c, &infos(8, 4), &configs, &mut f);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(f[0].code, Code::MultiAllreduceSlowGroup);
        assert!(f[0].message.contains("rail2 (ranks [2, 6])"), "{}", f[0].message);
        // The same figures without the slow rail: nothing.
        let even: Vec<RankResult> = ranks
            .into_iter()
            .map(|mut r| {
                if let Some(CheckDetail::MultiAllReduce { groups }) = &mut r.detail {
                    for g in groups {
                        g.busbw_gbps = g.busbw_gbps.max(90.0);
                    }
                }
                r
            })
            .collect();
        let mut f = Vec::new();
        c.ranks = even;
        diagnose(&c, &infos(8, 4), &configs, &mut f);
        assert!(f.is_empty(), "{f:?}");
        // A slow node among two is named, and placed on that node.
        c.ranks = (0..8)
            .map(|i| {
                let mut r = RankResult::new(i, CheckStatus::Passed);
                let node = i / 4;
                let bw = if node == 1 { 50.0 } else { 200.0 };
                let groups = vec![group(GroupKind::Node, node, (node * 4..node * 4 + 4).collect(), bw)];
                r.detail = Some(CheckDetail::MultiAllReduce { groups });
                r
            })
            .collect();
        let mut f = Vec::new();
        diagnose(&c, &infos(8, 4), &configs, &mut f);
        assert_eq!(
            f.iter().map(|f| (f.code, f.node_rank)).collect::<Vec<_>>(),
            [(Code::MultiAllreduceSlowGroup, Some(1))]
        );
    }

    /// Rank 0's result with failed probes `list` on the front end (`front`) or the back end.
    fn probes(front: bool, list: &[(usize, usize)]) -> RankResult {
        let mut r = RankResult::new(0, CheckStatus::Failed);
        let v: Vec<Probe> =
            list.iter().map(|&(from, to)| Probe { from, to, ms: 0.0, error: Some("refused".into()) }).collect();
        let (front_end_failed, back_end_failed) = if front { (v, Vec::new()) } else { (Vec::new(), v) };
        r.detail = Some(CheckDetail::Connectivity {
            front_end: None,
            back_end: None,
            front_end_failed,
            back_end_failed,
            front_end_probers: None,
            back_end_peers: None,
            ib_ports_not_active: Vec::new(),
        });
        r
    }

    #[test]
    fn connectivity_names_an_unreachable_node_a_silent_rank_or_else_the_pair() {
        let codes = |f: &[Finding]| f.iter().map(|f| (f.code, f.node_rank, f.rank)).collect::<Vec<_>>();
        // 3 nodes of 1: nobody reaches node 2.
        let mut f = Vec::new();
        diagnose(&report("network-connectivity", vec![probes(true, &[(0, 2), (1, 2)])]), &infos(3, 1), &cfg(), &mut f);
        assert_eq!(codes(&f), [(Code::NetFrontendUnreachable, Some(2), Some(2))]);
        // Only node 0 -> node 2 fails: the pair, nobody blamed.
        let mut f = Vec::new();
        diagnose(&report("network-connectivity", vec![probes(true, &[(0, 2)])]), &infos(3, 1), &cfg(), &mut f);
        assert_eq!(codes(&f), [(Code::NetFrontendPairFailed, None, None)]);
        // Back end, 3 nodes of 1: rank 1 fails with both peers.
        let mut f = Vec::new();
        diagnose(&report("network-connectivity", vec![probes(false, &[(0, 1), (1, 2)])]), &infos(3, 1), &cfg(), &mut f);
        assert_eq!(codes(&f), [(Code::NetBackendRankUnreachable, Some(1), Some(1))]);
        // Two nodes of one: only the pair can be named.
        let mut f = Vec::new();
        diagnose(&report("network-connectivity", vec![probes(false, &[(1, 0)])]), &infos(2, 1), &cfg(), &mut f);
        assert_eq!(codes(&f), [(Code::NetBackendPairFailed, None, None)]);
        // Nothing failed: nothing said.
        let mut f = Vec::new();
        diagnose(&report("network-connectivity", vec![probes(false, &[])]), &infos(2, 1), &cfg(), &mut f);
        assert!(f.is_empty());
    }
}
