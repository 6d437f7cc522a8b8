//! The page's sections beyond the checks: findings, the node-pair bandwidth map, the state
//! timelines and the run's facts.

use gpusanity_common::report::{Finding, NodeHealth, NodeVerdict, Report, Severity};

use super::checks::node_labels;
use super::{RunContext, TimelineEntry};
use crate::svg::{self, HeatInput, HeatMap, Strip};

pub struct FindingView<'a> {
    pub finding: &'a Finding,
    pub severity: &'static str,
    /// Where: node, host, rank or node pair.
    pub place: String,
    /// Measured, expected, the peers' median and MAD, the score: those the finding carries.
    pub figures: Vec<(&'static str, String)>,
}

pub fn severity_class(s: Severity) -> &'static str {
    match s {
        Severity::Warning => "warning",
        Severity::Critical => "critical",
    }
}

pub fn finding_view(f: &Finding) -> FindingView<'_> {
    let mut place = Vec::new();
    if let Some(n) = f.node_rank {
        place.push(format!("node {n}"));
    }
    if let Some(h) = &f.host {
        place.push(format!("host {h}"));
    }
    if let Some(r) = f.rank {
        place.push(format!("rank {r}"));
    }
    if let Some([a, b]) = f.pair {
        place.push(format!("node pair {a}–{b}"));
    }
    let figures = [
        ("measured", f.measured),
        ("expected", f.expected),
        ("peers' median", f.peers_median),
        ("peers' MAD", f.peers_mad),
        ("score", f.score),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.map(|v| (k, svg::fmt_num(v))))
    .collect();
    FindingView {
        finding: f,
        severity: severity_class(f.severity),
        place: if place.is_empty() { "the whole job".into() } else { place.join(" · ") },
        figures,
    }
}

/// The nodes whose verdict is `health`.
pub fn with_health(report: &Report, health: NodeHealth) -> Vec<NodeVerdict> {
    report.node_verdicts.iter().filter(|v| v.health == health).cloned().collect()
}

/// The nodes to isolate (`report.faulty_nodes`), with their hosts and the codes behind their
/// verdicts where the report has them.
pub fn faulty_nodes(report: &Report) -> Vec<NodeVerdict> {
    report
        .faulty_nodes
        .iter()
        .map(|&n| {
            report.node_verdicts.iter().find(|v| v.node_rank == n).cloned().unwrap_or_else(|| NodeVerdict {
                node_rank: n,
                host: report.nodes.iter().find(|x| x.node_rank == n).map_or_else(|| "?".into(), |x| x.hostname.clone()),
                health: NodeHealth::Faulty,
                codes: Vec::new(),
            })
        })
        .collect()
}

/// Node x node bus bandwidth of the link test, coloured against the best pair. None without
/// pairs, or past [`super::large::LARGE_NODES`] nodes (a large run shows
/// [`super::large::pair_summary`] instead).
pub fn pair_map(report: &Report) -> Option<HeatMap> {
    let n = report.pair_bandwidth.iter().flat_map(|p| p.nodes).max()?.checked_add(1)?;
    let n = n.max(report.nodes.len());
    if n > super::large::LARGE_NODES {
        return None;
    }
    let best = report.pair_bandwidth.iter().map(|p| p.busbw_gbps).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let mut grid: Vec<Vec<HeatInput>> =
        (0..n).map(|_| (0..n).map(|_| HeatInput { t: None, text: "-".into() }).collect()).collect();
    for p in &report.pair_bandwidth {
        let [a, b] = p.nodes;
        let t = (best > 0.0 && p.busbw_gbps.is_finite()).then(|| p.busbw_gbps / best);
        let text = format!("{} GB/s", svg::fmt_num(p.busbw_gbps));
        for (row, col) in [(a, b), (b, a)] {
            if let Some(cell) = grid.get_mut(row).and_then(|r| r.get_mut(col)) {
                *cell = HeatInput { t, text: text.clone() };
            }
        }
    }
    svg::heat_map("link test: busbw GB/s per node pair", &node_labels(report, n), &grid)
}

/// One timeline: its name, its rows and its strip.
pub struct TimelineView {
    pub name: &'static str,
    pub rows: Vec<TimelineEntry>,
    pub strip: Option<Strip>,
}

pub fn timelines(report: &Report, ctx: &RunContext) -> Vec<TimelineView> {
    let events: Vec<TimelineEntry> = report
        .events
        .iter()
        .map(|e| TimelineEntry {
            state: serde_json::to_value(e.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("{:?}", e.state)),
            at: e.at,
            detail: e.detail.clone(),
        })
        .collect();
    [("service", ctx.timeline.clone()), ("check run", events)]
        .into_iter()
        .filter(|(_, rows)| !rows.is_empty())
        .map(|(name, rows)| {
            let states: Vec<_> = rows.iter().map(|r| (r.state.clone(), r.at, r.detail.clone())).collect();
            TimelineView { name, strip: svg::strip(&states), rows }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusanity_common::registry::CheckId;
    use gpusanity_common::report::Code;

    #[test]
    fn a_finding_names_its_place_and_only_the_figures_it_carries() {
        let mut f = Finding::new(Severity::Critical, Code::GemmSlow, CheckId::Gemm, "slow".into());
        assert_eq!(finding_view(&f).place, "the whole job");
        assert!(finding_view(&f).figures.is_empty());
        f.node_rank = Some(1);
        f.host = Some("gpu-b".into());
        f.rank = Some(3);
        f.measured = Some(400.0);
        f.score = Some(-12.5);
        let v = finding_view(&f);
        assert_eq!(v.place, "node 1 · host gpu-b · rank 3");
        assert_eq!(v.figures, [("measured", "400".to_string()), ("score", "-12.5".to_string())]);
        assert_eq!(v.severity, "critical");
    }

    #[test]
    fn faulty_nodes_come_from_the_nodes_to_isolate() {
        let r: Report =
            serde_json::from_str(include_str!("../../../docs/examples/report-cpu.json")).expect("example report");
        let faulty = faulty_nodes(&r);
        assert!(!faulty.is_empty(), "the example has a faulty node");
        assert_eq!(faulty.iter().map(|v| v.node_rank).collect::<Vec<_>>(), r.faulty_nodes);
        let mut old = r.clone();
        old.node_verdicts.clear();
        let faulty = faulty_nodes(&old);
        assert_eq!(faulty.len(), r.faulty_nodes.len());
        assert!(faulty.iter().all(|v| v.codes.is_empty() && v.host != "?"));
    }
}
