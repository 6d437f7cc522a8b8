//! The page of a large run (more than [`LARGE_NODES`] nodes): what stays readable and loads
//! fast at 2,048 nodes of 8 ranks. Per check, the rank table lists the outliers only (ranks a
//! finding names or that did not pass, then the lowest few by the first column) with one row
//! of min / median / max over every rank; histograms of ranks per value replace the per-rank
//! bar charts; notes are listed once per distinct value with the number of ranks that wrote
//! it. The node table puts the faulty and suspect nodes first, and the run facts list nodes,
//! not ranks. The line charts (bandwidth against message size, training loss) draw a
//! min / median / max band over every rank and the own lines of the flagged ranks only: one
//! line per rank was most of a 2,048-node page (45 MB, 27 s to load).

use std::collections::{BTreeMap, HashMap};

use gpusanity_common::report::{
    CheckDetail, CheckReport, CheckStatus, NodeHealth, NodeVerdict, PairBandwidth, RankResult, Report,
};

use crate::columns::charted;
use crate::svg::{self, BarChart, BarInput, LineChart, Series};

/// Past this many nodes a page shows summaries instead of every rank (the heat maps stop
/// at the same size).
pub const LARGE_NODES: usize = 64;
/// Ranks listed besides the flagged ones: the lowest by the table's first column.
const LOWEST: usize = 8;
/// Pairs of the link test listed on a large run, the lowest first.
const LOWEST_PAIRS: usize = 16;
/// Bins of a histogram.
const BINS: usize = 24;
/// Distinct values of one note listed before the rest are counted.
const NOTE_VALUES: usize = 12;

pub fn is_large(report: &Report) -> bool {
    report.nodes.len() > LARGE_NODES
}

/// Whether rank index `i` of `c` is an outlier: `flagged` (a finding names it) or it did not pass.
fn outlier(c: &CheckReport, i: usize, flagged: &impl Fn(usize) -> bool) -> bool {
    flagged(i) || !matches!(c.ranks[i].status, CheckStatus::Passed | CheckStatus::NotApplicable)
}

/// Indexes into `c.ranks` of the rows to list: `flagged` ones (in rank order), then the
/// [`LOWEST`] others by the metric `key`.
pub fn rows_to_list(c: &CheckReport, key: Option<&str>, flagged: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut out: Vec<usize> = (0..c.ranks.len()).filter(|&i| outlier(c, i, &flagged)).collect();
    if let Some(key) = key {
        let mut rest: Vec<(f64, usize)> = (0..c.ranks.len())
            .filter(|i| !out.contains(i))
            .filter_map(|i| c.ranks[i].metrics.get(key).filter(|v| v.is_finite()).map(|v| (*v, i)))
            .collect();
        rest.sort_by(|a, b| a.0.total_cmp(&b.0));
        out.extend(rest.into_iter().take(LOWEST).map(|(_, i)| i));
    }
    out
}

/// min / median / max of each column over every rank.
pub fn column_summary(c: &CheckReport, keys: &[&str]) -> Vec<String> {
    keys.iter()
        .map(|k| {
            let mut v: Vec<f64> =
                c.ranks.iter().filter_map(|r| r.metrics.get(*k).copied()).filter(|x| x.is_finite()).collect();
            if v.is_empty() {
                return "-".into();
            }
            v.sort_by(f64::total_cmp);
            format!("{} / {} / {}", svg::fmt_num(v[0]), svg::fmt_num(v[v.len() / 2]), svg::fmt_num(v[v.len() - 1]))
        })
        .collect()
}

/// Bandwidth against message size: the band over every rank (the report's sweep summary of
/// the check, or computed from the ranks' sweeps when it has none), then the sweep of every
/// outlier rank (flagged, not passed, or with wrong elements) that the report kept.
pub fn sweep_band(
    report: &Report,
    c: &CheckReport,
    flagged: impl Fn(usize) -> bool,
    rank_series: impl Fn(&RankResult) -> Vec<Series>,
) -> Option<LineChart> {
    let band: Vec<(f64, [f64; 3], usize)> = match report.sweep_summaries.iter().find(|s| s.check == c.name) {
        Some(s) => s
            .points
            .iter()
            .map(|p| (p.bytes as f64, [p.busbw_gbps_min, p.busbw_gbps_median, p.busbw_gbps_max], p.ranks))
            .collect(),
        None => spread(c.ranks.iter().flat_map(|r| r.sweep.iter().map(|p| (p.bytes as f64, p.busbw_gbps)))),
    };
    let mut series = band_series(&band, "busbw");
    for (i, r) in c.ranks.iter().enumerate() {
        if outlier(c, i, &flagged) || r.sweep.iter().any(|p| p.wrong > 0) {
            series.extend(rank_series(r));
        }
    }
    svg::line_chart(&format!("{}: bandwidth vs message size", c.name), "message size", "GB/s", &series, true)
}

/// The training loss: the band over every rank at each step, then the losses of the outliers.
pub fn loss_band(
    c: &CheckReport,
    flagged: impl Fn(usize) -> bool,
    rank_series: impl Fn(&RankResult) -> Option<Series>,
) -> Option<LineChart> {
    fn losses(r: &RankResult) -> &[Option<f64>] {
        match &r.detail {
            Some(CheckDetail::Model { losses, .. }) => losses,
            _ => &[],
        }
    }
    let band = spread(
        c.ranks.iter().flat_map(|r| losses(r).iter().enumerate().filter_map(|(i, l)| l.map(|v| ((i + 1) as f64, v)))),
    );
    let mut series = band_series(&band, "loss");
    series.extend((0..c.ranks.len()).filter(|&i| outlier(c, i, &flagged)).filter_map(|i| rank_series(&c.ranks[i])));
    svg::line_chart(&format!("{}: training loss", c.name), "step", "loss", &series, false)
}

/// min / median / max of the finite y values at each x, and how many there were.
fn spread(points: impl Iterator<Item = (f64, f64)>) -> Vec<(f64, [f64; 3], usize)> {
    let mut by_x: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for (x, y) in points.filter(|(x, y)| x.is_finite() && y.is_finite()) {
        // f64 bits keep the order of non-negative x (sizes and steps).
        by_x.entry(x.to_bits()).or_default().push(y);
    }
    by_x.into_iter()
        .map(|(x, mut v)| {
            v.sort_by(f64::total_cmp);
            (f64::from_bits(x), [v[0], v[v.len() / 2], v[v.len() - 1]], v.len())
        })
        .collect()
}

/// The band as three series: min and max dashed, the median solid, in one colour.
fn band_series(band: &[(f64, [f64; 3], usize)], what: &str) -> Vec<Series> {
    if band.is_empty() {
        return Vec::new();
    }
    let ranks = band.iter().map(|b| b.2).max().unwrap_or(0);
    ["min", "median", "max"]
        .iter()
        .enumerate()
        .map(|(k, name)| Series {
            name: format!("{name} {what}, {ranks} ranks"),
            points: band.iter().map(|b| (b.0, b.1[k])).collect(),
            dashed: k != 1,
            colour: 7,
        })
        .collect()
}

/// One histogram per charted figure: ranks per value bin, a bin red or amber when it holds a
/// rank a finding names (`class`).
pub fn histograms(c: &CheckReport, class: impl Fn(usize) -> &'static str) -> Vec<BarChart> {
    charted(c.name)
        .iter()
        .filter_map(|(key, title)| {
            let values: Vec<(f64, &'static str)> = c
                .ranks
                .iter()
                .filter_map(|r| r.metrics.get(*key).filter(|v| v.is_finite()).map(|v| (*v, class(r.rank))))
                .collect();
            histogram(&format!("{}: {title}, ranks per bin", c.name), &values)
        })
        .collect()
}

fn histogram(title: &str, values: &[(f64, &'static str)]) -> Option<BarChart> {
    let lo = values.iter().map(|v| v.0).fold(f64::INFINITY, f64::min);
    let hi = values.iter().map(|v| v.0).fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() || !hi.is_finite() {
        return None;
    }
    let bins = if hi > lo { BINS } else { 1 };
    let width = (hi - lo) / bins as f64;
    let mut counts = vec![(0usize, "ok"); bins];
    for &(v, class) in values {
        let i = if width > 0.0 { (((v - lo) / width) as usize).min(bins - 1) } else { 0 };
        counts[i].0 += 1;
        counts[i].1 = worse(counts[i].1, class);
    }
    let input: Vec<BarInput> = counts
        .iter()
        .enumerate()
        .map(|(i, &(n, class))| BarInput { label: svg::fmt_num(lo + width * (i as f64 + 0.5)), value: n as f64, class })
        .collect();
    svg::bar_chart(title, &input, None, None)
}

fn worse(a: &'static str, b: &'static str) -> &'static str {
    let rank = |c: &str| match c {
        "critical" => 2,
        "warning" => 1,
        _ => 0,
    };
    if rank(b) > rank(a) {
        b
    } else {
        a
    }
}

/// The notes once per distinct value: ("N ranks", or the rank when one wrote it, key, value).
pub fn grouped_notes(c: &CheckReport) -> Vec<(String, String, String)> {
    let shown: Vec<(usize, BTreeMap<String, String>)> = c.ranks.iter().map(|r| (r.rank, r.shown_notes())).collect();
    let mut by_key: BTreeMap<&str, BTreeMap<&str, Vec<usize>>> = BTreeMap::new();
    for (rank, notes) in &shown {
        for (k, v) in notes {
            by_key.entry(k).or_default().entry(v).or_default().push(*rank);
        }
    }
    let mut out = Vec::new();
    for (key, values) in by_key {
        let mut values: Vec<(&str, Vec<usize>)> = values.into_iter().collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.1.len()));
        let more = values.len().saturating_sub(NOTE_VALUES);
        for (value, ranks) in values.into_iter().take(NOTE_VALUES) {
            let who = match ranks[..] {
                [one] => one.to_string(),
                _ if ranks.len() == c.ranks.len() => "all".into(),
                _ => format!("{} ranks", ranks.len()),
            };
            out.push((who, key.to_string(), value.to_string()));
        }
        if more > 0 {
            out.push((String::new(), key.to_string(), format!("... and {more} other values")));
        }
    }
    out
}

/// The node verdicts, faulty first, then suspect, then healthy (each in node order).
pub fn outliers_first(v: &[NodeVerdict]) -> Vec<NodeVerdict> {
    let order = |h: NodeHealth| match h {
        NodeHealth::Faulty => 0,
        NodeHealth::Suspect => 1,
        NodeHealth::Healthy => 2,
    };
    let mut out = v.to_vec();
    out.sort_by_key(|n| (order(n.health), n.node_rank));
    out
}

/// The link test of a large run, instead of its node x node map (at 256 nodes the map alone
/// was 9 MB of the page): pairs per bus-bandwidth bin, and the lowest pairs.
pub struct PairSummary {
    pub histogram: Option<BarChart>,
    pub lowest: Vec<PairRow>,
    pub pairs: usize,
}

/// One pair of the link test, as listed.
pub struct PairRow {
    pub a: String,
    pub b: String,
    pub busbw: String,
    /// The pair's figure as a share of the best pair's.
    pub of_best: String,
    /// `critical` when either node is to be isolated, `warning` when either is suspect.
    pub class: &'static str,
}

/// The link test's summary on a large run with pairs; `None` otherwise.
pub fn pair_summary(report: &Report) -> Option<PairSummary> {
    if !is_large(report) || report.pair_bandwidth.is_empty() {
        return None;
    }
    let health: HashMap<usize, NodeHealth> = report.node_verdicts.iter().map(|v| (v.node_rank, v.health)).collect();
    let host: HashMap<usize, &str> = report.nodes.iter().map(|n| (n.node_rank, n.hostname.as_str())).collect();
    let class = |p: &PairBandwidth| {
        let of = |n: usize| match health.get(&n) {
            Some(NodeHealth::Faulty) => "critical",
            Some(NodeHealth::Suspect) => "warning",
            _ => "ok",
        };
        worse(of(p.nodes[0]), of(p.nodes[1]))
    };
    let values: Vec<(f64, &'static str)> =
        report.pair_bandwidth.iter().filter(|p| p.busbw_gbps.is_finite()).map(|p| (p.busbw_gbps, class(p))).collect();
    let best = values.iter().map(|v| v.0).fold(0.0, f64::max);
    // A pair that measured nothing (not finite) sorts first: it is the worst.
    let key = |p: &PairBandwidth| if p.busbw_gbps.is_finite() { p.busbw_gbps } else { f64::NEG_INFINITY };
    let mut order: Vec<&PairBandwidth> = report.pair_bandwidth.iter().collect();
    order.sort_by(|x, y| key(x).total_cmp(&key(y)));
    let name = |n: usize| match host.get(&n) {
        Some(h) => format!("node{n} ({h})"),
        None => format!("node{n}"),
    };
    let lowest = order
        .into_iter()
        .take(LOWEST_PAIRS)
        .map(|p| PairRow {
            a: name(p.nodes[0]),
            b: name(p.nodes[1]),
            busbw: svg::fmt_num(p.busbw_gbps),
            of_best: if best > 0.0 && p.busbw_gbps.is_finite() {
                format!("{:.0}%", 100.0 * p.busbw_gbps / best)
            } else {
                "-".into()
            },
            class: class(p),
        })
        .collect();
    Some(PairSummary {
        histogram: histogram("link test: busbw GB/s, node pairs per bin", &values),
        lowest,
        pairs: report.pair_bandwidth.len(),
    })
}
