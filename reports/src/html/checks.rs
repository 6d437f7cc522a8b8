//! One section per check: status, duration, configuration, the per-rank table of its headline
//! figures, per-rank bar charts, bandwidth against message size, loss curves and the
//! connectivity heat maps.

use gpusanity_common::detail::GridCell;
use gpusanity_common::expected::{Conditions, Expected};
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{CheckDetail, CheckReport, CheckStatus, RankResult, Report, Severity, SweepPoint};
use gpusanity_common::stats::median;

use crate::columns::{charted, columns, status_word};
use crate::svg::{self, BarChart, BarInput, HeatInput, HeatMap, LineChart, Series};

pub struct CheckView {
    pub anchor: String,
    pub name: String,
    pub status: &'static str,
    pub status_class: &'static str,
    pub duration: String,
    pub config: Vec<(String, String)>,
    pub columns: Vec<&'static str>,
    pub rows: Vec<RowView>,
    /// Ranks not listed in `rows` (a large run lists the outliers only).
    pub rows_left_out: usize,
    /// A large run's min / median / max of each column over every rank.
    pub summary: Vec<String>,
    pub bars: Vec<BarChart>,
    pub lines: Vec<LineChart>,
    pub heat: Vec<HeatMap>,
    /// Ranks, note, value: the facts the ranks wrote (hashes, layouts, matrices...).
    pub notes: Vec<(String, String, String)>,
    /// Whether any listed rank was judged against a fleet baseline (the "fleet" column).
    pub fleet: bool,
}

pub struct RowView {
    pub rank: usize,
    pub host: String,
    pub device: String,
    pub cells: Vec<String>,
    pub status: &'static str,
    pub status_class: &'static str,
    /// The rank's error or why the check does not apply.
    pub detail: String,
    /// The codes of this check's findings that name the rank, and their worst severity's class.
    pub codes: Vec<String>,
    pub flag: &'static str,
    /// The rank's fleet percentile and the baseline it was judged against, when it was.
    pub fleet: Option<(String, String)>,
}

/// The CSS class of a check's or rank's status.
pub fn status_class(s: CheckStatus) -> &'static str {
    match s {
        CheckStatus::Passed => "ok",
        CheckStatus::Failed | CheckStatus::Error | CheckStatus::TimedOut => "bad",
        CheckStatus::NotRun | CheckStatus::NotApplicable => "muted",
    }
}

/// Pretty `key: value` pairs of a JSON object (strings bare, the rest as compact JSON).
pub fn pairs(v: &serde_json::Value) -> Vec<(String, String)> {
    match v {
        serde_json::Value::Object(m) => m
            .iter()
            .map(|(k, v)| {
                let text = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                (k.clone(), text)
            })
            .collect(),
        serde_json::Value::Null => Vec::new(),
        other => vec![("value".into(), other.to_string())],
    }
}

pub fn check_view(report: &Report, index: usize, c: &CheckReport) -> CheckView {
    let cols = columns(c.name);
    let keys: Vec<&str> = cols.iter().map(|(k, _)| *k).collect();
    let large = super::large::is_large(report);
    let listed: Vec<usize> = if large {
        super::large::rows_to_list(c, keys.first().copied(), |i| rank_class(report, c.name, c.ranks[i].rank) != "ok")
    } else {
        (0..c.ranks.len()).collect()
    };
    let rows: Vec<RowView> = listed.iter().map(|&i| row_view(report, c, &keys, i)).collect();
    let fleet = rows.iter().any(|r| r.fleet.is_some());
    CheckView {
        anchor: format!("check-{index}"),
        name: c.name.to_string(),
        status: status_word(c.status),
        status_class: status_class(c.status),
        duration: format!("{:.1} s", c.duration_s),
        config: pairs(&c.config),
        columns: cols.iter().map(|(_, t)| *t).collect(),
        rows,
        rows_left_out: c.ranks.len() - listed.len(),
        summary: if large { super::large::column_summary(c, &keys) } else { Vec::new() },
        bars: if large {
            super::large::histograms(c, |rank| rank_class(report, c.name, rank))
        } else {
            bars(report, c)
        },
        lines: if large {
            let flagged = |i: usize| rank_class(report, c.name, c.ranks[i].rank) != "ok";
            super::large::sweep_band(report, c, flagged, sweep_series)
                .into_iter()
                .chain(super::large::loss_band(c, flagged, loss_series))
                .collect()
        } else {
            sweep_chart(c).into_iter().chain(loss_chart(c)).collect()
        },
        heat: connectivity_maps(report, c),
        notes: if large { super::large::grouped_notes(c) } else { notes(c) },
        fleet,
    }
}

fn row_view(report: &Report, c: &CheckReport, keys: &[&str], i: usize) -> RowView {
    let r = &c.ranks[i];
    let info = report.ranks.iter().find(|x| x.rank == r.rank);
    RowView {
        rank: r.rank,
        host: info.map(|x| x.host.clone()).unwrap_or_else(|| "?".into()),
        device: info.map(|x| x.device.clone()).unwrap_or_default(),
        cells: keys.iter().map(|k| r.metrics.get(*k).map_or("-".into(), |v| svg::fmt_num(*v))).collect(),
        status: status_word(r.status),
        status_class: status_class(r.status),
        detail: r.error.clone().or_else(|| r.notes.get("not_applicable").cloned()).unwrap_or_default(),
        codes: report
            .findings
            .iter()
            .filter(|f| f.check == c.name && f.rank == Some(r.rank))
            .map(|f| f.code.to_string())
            .collect(),
        flag: rank_class(report, c.name, r.rank),
        fleet: r.fleet.as_deref().map(|j| {
            let pct = format!("{:.1}{}", j.percentile, if j.below { " (below)" } else { "" });
            let basis = format!(
                "{} {} against {} ± {} (floor {}), {} samples of {} nodes, window {}",
                j.metric,
                svg::fmt_num(j.value),
                svg::fmt_num(j.centre),
                svg::fmt_num(j.spread),
                svg::fmt_num(j.floor),
                j.samples,
                j.nodes,
                j.window
            );
            (pct, basis)
        }),
    }
}

/// The notes of a check: once with "all" for a value every rank wrote alike, else per rank.
fn notes(c: &CheckReport) -> Vec<(String, String, String)> {
    let shown: Vec<(usize, std::collections::BTreeMap<String, String>)> =
        c.ranks.iter().map(|r| (r.rank, r.shown_notes())).collect();
    let keys: std::collections::BTreeSet<&String> = shown.iter().flat_map(|(_, n)| n.keys()).collect();
    let mut out = Vec::new();
    for key in keys {
        let values: Vec<(usize, &String)> =
            shown.iter().filter_map(|(rank, n)| n.get(key).map(|v| (*rank, v))).collect();
        match values.first().map(|(_, v)| *v) {
            Some(first)
                if c.ranks.len() > 1 && values.len() == c.ranks.len() && values.iter().all(|(_, v)| *v == first) =>
            {
                out.push(("all".to_string(), key.clone(), first.clone()));
            }
            _ => out.extend(values.into_iter().map(|(r, v)| (r.to_string(), key.clone(), v.clone()))),
        }
    }
    out
}

/// The bar class of a rank: the severity of the worst finding of this check naming it.
fn rank_class(report: &Report, check: CheckId, rank: usize) -> &'static str {
    let worst = report.findings.iter().filter(|f| f.check == check && f.rank == Some(rank)).map(|f| f.severity).max();
    match worst {
        Some(Severity::Critical) => "critical",
        Some(Severity::Warning) => "warning",
        None => "ok",
    }
}

/// The expected figure for every rank's device, when they agree on one.
fn expected(report: &Report, c: &CheckReport, key: &str) -> Option<f64> {
    let when = Conditions::from_config(&c.config, &report.nodes.iter().map(|n| n.nproc).collect::<Vec<_>>());
    let devices: std::collections::HashMap<usize, &str> =
        report.ranks.iter().map(|i| (i.rank, i.device.as_str())).collect();
    let mut figures = c.ranks.iter().map(|r| {
        let device = devices.get(&r.rank).copied()?;
        Expected::builtin().lookup(device, c.name, key, when).map(|e| e.value)
    });
    let first = figures.next()??;
    figures.all(|f| f == Some(first)).then_some(first)
}

fn bars(report: &Report, c: &CheckReport) -> Vec<BarChart> {
    let mut keys: Vec<(String, String)> = charted(c.name).iter().map(|(k, t)| (k.to_string(), t.to_string())).collect();
    // multi-all-reduce: one chart per concurrent group too.
    if let Some(r) = c.ranks.first() {
        for (k, group) in r.metrics.keys().filter_map(|k| k.strip_prefix("busbw_gbps.").map(|g| (k, g))) {
            keys.push((k.clone(), format!("busbw GB/s in group {group}")));
        }
    }
    keys.iter()
        .filter_map(|(key, title)| {
            let input: Vec<BarInput> = c
                .ranks
                .iter()
                .filter_map(|r| {
                    r.metrics.get(key).map(|v| BarInput {
                        label: format!("rank {}", r.rank),
                        value: *v,
                        class: rank_class(report, c.name, r.rank),
                    })
                })
                .collect();
            let values: Vec<f64> = input.iter().map(|b| b.value).collect();
            let peers = (values.iter().filter(|v| v.is_finite()).count() >= 2).then(|| median(&values));
            svg::bar_chart(&format!("{}: {title}", c.name), &input, expected(report, c, key), peers)
        })
        .collect()
}

/// Bus bandwidth (and algorithm bandwidth where it differs) against message size, per rank.
fn sweep_chart(c: &CheckReport) -> Option<LineChart> {
    let series: Vec<Series> = c.ranks.iter().flat_map(sweep_series).collect();
    svg::line_chart(&format!("{}: bandwidth vs message size", c.name), "message size", "GB/s", &series, true)
}

/// One rank's bus bandwidth and, where it differs, algorithm bandwidth against message size.
fn sweep_series(r: &RankResult) -> Vec<Series> {
    if r.sweep.is_empty() {
        return Vec::new();
    }
    let point =
        |f: fn(&SweepPoint) -> f64| -> Vec<(f64, f64)> { r.sweep.iter().map(|p| (p.bytes as f64, f(p))).collect() };
    let mut series = vec![Series {
        name: format!("rank {} busbw", r.rank),
        points: point(|p| p.busbw_gbps),
        dashed: false,
        colour: r.rank,
    }];
    if r.sweep.iter().any(|p| p.algbw_gbps != p.busbw_gbps) {
        series.push(Series {
            name: format!("rank {} algbw", r.rank),
            points: point(|p| p.algbw_gbps),
            dashed: true,
            colour: r.rank,
        });
    }
    series
}

/// The training loss of every step, per rank (from the rank's model detail; a step whose loss
/// is not a finite number has no point).
fn loss_chart(c: &CheckReport) -> Option<LineChart> {
    let series: Vec<Series> = c.ranks.iter().filter_map(loss_series).collect();
    svg::line_chart(&format!("{}: training loss", c.name), "step", "loss", &series, false)
}

/// One rank's loss against step, when it trained a model.
fn loss_series(r: &RankResult) -> Option<Series> {
    let Some(CheckDetail::Model { losses, .. }) = &r.detail else {
        return None;
    };
    let points = losses.iter().enumerate().filter_map(|(i, l)| l.map(|v| ((i + 1) as f64, v))).collect();
    Some(Series { name: format!("rank {}", r.rank), points, dashed: false, colour: r.rank })
}

/// The node labels of the heat maps: `node0 (host)`.
pub fn node_labels(report: &Report, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| match report.nodes.iter().find(|x| x.node_rank == i) {
            Some(node) => format!("node{i} ({})", node.hostname),
            None => format!("node{i}"),
        })
        .collect()
}

/// Front-end and back-end reachability, node x node, from the cells of the check's detail.
fn connectivity_maps(report: &Report, c: &CheckReport) -> Vec<HeatMap> {
    let mut maps = Vec::new();
    let Some((front, back)) = c.ranks.iter().find_map(|r| match &r.detail {
        // Rank 0's: other nodes' local rank 0 may hold only their ports.
        Some(CheckDetail::Connectivity { front_end, back_end, .. }) if front_end.is_some() || back_end.is_some() => {
            Some((front_end, back_end))
        }
        _ => None,
    }) else {
        return maps;
    };
    for (grid, title) in [(front, "front-end network"), (back, "back-end network")] {
        let Some(cells) = grid else {
            continue;
        };
        let slowest = cells
            .iter()
            .flatten()
            .filter_map(|c| match c {
                GridCell::Reached { ms } => Some(*ms),
                _ => None,
            })
            .fold(0.0, f64::max);
        let grid: Vec<Vec<HeatInput>> = cells
            .iter()
            .map(|row| {
                row.iter()
                    .map(|c| {
                        let t = match c {
                            c if c.failed() => Some(0.0),
                            GridCell::Exchanges { .. } => Some(1.0),
                            // Reachable: green, towards yellow for the slowest probe.
                            GridCell::Reached { ms } => {
                                Some(if slowest > 0.0 { 1.0 - 0.4 * ms / slowest } else { 1.0 })
                            }
                            _ => None,
                        };
                        HeatInput { t, text: c.to_string() }
                    })
                    .collect()
            })
            .collect();
        maps.extend(svg::heat_map(&format!("{}: {title}", c.name), &node_labels(report, cells.len()), &grid));
    }
    maps
}
