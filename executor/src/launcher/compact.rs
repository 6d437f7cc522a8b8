//! What node 0 keeps of the ranks' results once the diagnosis has read them, so that
//! report.json grows with the ranks and not with their square:
//!
//! - the link test's pair list, which every rank computes alike, once (on the first rank that
//!   carries it, the one the diagnosis read; the report's `pair_bandwidth` has it too);
//! - a collective's per-rank sweep, on a check of more than [`SWEEP_RANKS_MAX`] ranks, only for
//!   the ranks a finding names, the ranks that did not pass or saw wrong elements, and the
//!   slowest, median and fastest rank at the largest message; every rank's figures go into a
//!   per-size summary (`Report::sweep_summaries`). The headline `metrics` of every rank stay.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use gpusanity_common::registry::Scope;
use gpusanity_common::report::{
    CheckDetail, CheckReport, CheckStatus, Finding, RankInfo, Report, SweepStats, SweepSummary,
};

/// Up to this many ranks with a sweep, a check keeps every rank's sweep.
pub const SWEEP_RANKS_MAX: usize = 64;

pub fn compact(report: &mut Report) {
    for c in &mut report.checks {
        keep_one_pair_list(c);
        if let Some(s) = summarize_sweeps(c, &report.findings, &report.ranks) {
            report.sweep_summaries.push(s);
        }
    }
}

fn keep_one_pair_list(c: &mut CheckReport) {
    let mut kept = false;
    for r in &mut c.ranks {
        if matches!(r.detail, Some(CheckDetail::PairBandwidth { .. })) {
            if kept {
                r.detail = None;
            }
            kept = true;
        }
    }
}

fn summarize_sweeps(c: &mut CheckReport, findings: &[Finding], ranks: &[RankInfo]) -> Option<SweepSummary> {
    let with_sweep: Vec<usize> = (0..c.ranks.len()).filter(|&i| !c.ranks[i].sweep.is_empty()).collect();
    if with_sweep.len() <= SWEEP_RANKS_MAX {
        return None;
    }
    let mut by_size: BTreeMap<u64, (Vec<f64>, u64)> = BTreeMap::new();
    for &i in &with_sweep {
        for p in &c.ranks[i].sweep {
            let e = by_size.entry(p.bytes).or_default();
            if p.busbw_gbps.is_finite() {
                e.0.push(p.busbw_gbps);
            }
            e.1 = e.1.saturating_add(p.wrong);
        }
    }
    let points = by_size
        .into_iter()
        .map(|(bytes, (mut v, wrong))| {
            v.sort_by(f64::total_cmp);
            let at = |k: usize| v.get(k).copied().unwrap_or(f64::NAN);
            SweepStats {
                bytes,
                ranks: v.len(),
                busbw_gbps_min: at(0),
                busbw_gbps_median: at(v.len() / 2),
                busbw_gbps_max: at(v.len().saturating_sub(1)),
                wrong,
            }
        })
        .collect();

    let keep = ranks_to_keep(c, &with_sweep, findings, ranks);
    let mut left_out = 0;
    for &i in &with_sweep {
        if !keep.contains(&i) {
            c.ranks[i].sweep = Vec::new();
            left_out += 1;
        }
    }
    Some(SweepSummary { check: c.name, ranks_left_out: left_out, points })
}

/// Indexes into `c.ranks` whose sweep stays.
fn ranks_to_keep(c: &CheckReport, with_sweep: &[usize], findings: &[Finding], ranks: &[RankInfo]) -> BTreeSet<usize> {
    let mine = findings.iter().filter(|f| f.check == Scope::Check(c.name));
    let named_ranks: BTreeSet<usize> = mine.clone().filter_map(|f| f.rank).collect();
    let named_nodes: BTreeSet<usize> = mine.filter(|f| f.rank.is_none()).filter_map(|f| f.node_rank).collect();
    let nodes: HashMap<usize, usize> = ranks.iter().map(|r| (r.rank, r.node_rank)).collect();
    let node_of = |rank: usize| nodes.get(&rank).copied();
    let mut keep: BTreeSet<usize> = with_sweep
        .iter()
        .copied()
        .filter(|&i| {
            let r = &c.ranks[i];
            named_ranks.contains(&r.rank)
                || node_of(r.rank).is_some_and(|n| named_nodes.contains(&n))
                || !matches!(r.status, CheckStatus::Passed)
                || r.sweep.iter().any(|p| p.wrong > 0)
        })
        .collect();
    // Slowest, median and fastest at the largest message (what the chart's spread shows).
    let mut last: Vec<(f64, usize)> = with_sweep
        .iter()
        .filter_map(|&i| c.ranks[i].sweep.last().map(|p| (p.busbw_gbps, i)))
        .filter(|(v, _)| v.is_finite())
        .collect();
    last.sort_by(|a, b| a.0.total_cmp(&b.0));
    for k in [0, last.len() / 2, last.len().saturating_sub(1)] {
        if let Some(&(_, i)) = last.get(k) {
            keep.insert(i);
        }
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusanity_common::report::{CheckId, Code, PairBandwidth, RankResult, Severity, SweepPoint};

    fn point(bytes: u64, busbw: f64) -> SweepPoint {
        SweepPoint { bytes, time_us: 1.0, algbw_gbps: busbw, busbw_gbps: busbw, wrong: 0 }
    }

    fn check(n: usize) -> CheckReport {
        let ranks = (0..n)
            .map(|k| {
                let mut r = RankResult::new(k, CheckStatus::Passed);
                r.sweep = vec![point(1024, 1.0 + k as f64), point(4096, 10.0 + k as f64)];
                r
            })
            .collect();
        CheckReport {
            name: CheckId::AllReduce,
            status: CheckStatus::Passed,
            duration_s: 1.0,
            config: Default::default(),
            ranks,
        }
    }

    fn infos(n: usize) -> Vec<RankInfo> {
        (0..n)
            .map(|k| RankInfo {
                rank: k,
                node_rank: k / 8,
                local_rank: k % 8,
                host: format!("h{}", k / 8),
                device: "cpu".into(),
                pid: 1,
                link: None,
            })
            .collect()
    }

    #[test]
    fn a_small_check_keeps_every_sweep() {
        let mut c = check(SWEEP_RANKS_MAX);
        assert!(summarize_sweeps(&mut c, &[], &infos(SWEEP_RANKS_MAX)).is_none());
        assert!(c.ranks.iter().all(|r| r.sweep.len() == 2));
    }

    #[test]
    fn a_large_check_keeps_the_named_and_the_extreme_ranks() {
        let n = 200;
        let mut c = check(n);
        c.ranks[7].sweep[1].wrong = 3;
        c.ranks[9].status = CheckStatus::Failed;
        let mut f = Finding::new(Severity::Critical, Code::AllreduceSlow, CheckId::AllReduce, "slow".into());
        f.rank = Some(42);
        let mut node = Finding::new(Severity::Warning, Code::AllreduceSlow, CheckId::AllReduce, "node".into());
        node.node_rank = Some(20);
        let s = summarize_sweeps(&mut c, &[f, node], &infos(n)).expect("summarized");
        let kept: Vec<usize> = c.ranks.iter().filter(|r| !r.sweep.is_empty()).map(|r| r.rank).collect();
        let node20: Vec<usize> = (160..168).collect();
        let mut want = vec![0, 7, 9, 42, n / 2, n - 1];
        want.extend(&node20);
        want.sort();
        assert_eq!(kept, want);
        assert_eq!(s.ranks_left_out, n - want.len());
        assert_eq!(s.points.len(), 2);
        let big = &s.points[1];
        assert_eq!((big.bytes, big.ranks, big.wrong), (4096, n, 3));
        assert_eq!((big.busbw_gbps_min, big.busbw_gbps_median, big.busbw_gbps_max), (10.0, 110.0, 209.0));
    }

    #[test]
    fn the_pair_list_is_kept_once() {
        let pairs = vec![PairBandwidth { nodes: [0, 1], busbw_gbps: 1.0, round: 1 }];
        let mut c = check(3);
        c.name = CheckId::PairBandwidth;
        for r in &mut c.ranks {
            r.sweep.clear();
            r.detail = Some(CheckDetail::PairBandwidth { pairs: pairs.clone() });
        }
        c.ranks[0].detail = None;
        keep_one_pair_list(&mut c);
        let with: Vec<usize> = c.ranks.iter().filter(|r| r.detail.is_some()).map(|r| r.rank).collect();
        assert_eq!(with, [1]);
    }
}
