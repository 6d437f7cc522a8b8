//! The fleet's baselines in the service: a passed run's figures are learned when the run ends
//! (in the transaction that stores its results), and `gpusanity baseline export` writes the
//! baseline file from them (docs/fleet.md).

use gpusanity_common::fleet::file::{BaselineEntry, BaselineFile};
use gpusanity_common::fleet::samples::learnable;
use gpusanity_common::fleet::{learn as learn_baseline, percentile, Judging, Key, Learned, Policy, Sample};
use gpusanity_common::report::Report;
use gpusanity_db::fleet::NodeMean;
use gpusanity_db::rows::RunRow;
use gpusanity_db::{fleet, Db, DbError, Tx};
use serde::Serialize;

/// Learns `report`'s figures for run `run`, which passed. The coordinator calls it only with
/// the report of node 0's agent, opened with an agent key that may speak for that node (an
/// unsigned or forged report never reaches a verdict); [`learnable`] leaves out fault-injected
/// runs and every rank or node a finding names.
pub async fn learn(tx: &mut Tx, run: &RunRow, report: &Report) -> Result<usize, DbError> {
    let names: Vec<String> = run.nodes.iter().map(|n| n.name.clone()).collect();
    let samples = learnable(report, &names);
    fleet::add_samples(tx, &run.run_id, &samples).await?;
    Ok(samples.len())
}

/// The baseline file of every key with enough samples under `policy`.
pub async fn export(db: &Db, policy: Policy) -> Result<BaselineFile, DbError> {
    let mut entries = Vec::new();
    for key in db.fleet_keys().await? {
        let window = db.fleet_window(&key, policy.window).await?;
        if let Some(learned) = learn_baseline(&window, policy) {
            let source = format!(
                "fleet: median and MAD x 1.4826 of the newest {} passed figures from {} nodes, exported {}",
                learned.samples,
                learned.nodes,
                chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ")
            );
            entries.push(BaselineEntry::new(&key, &learned, source));
        }
    }
    Ok(BaselineFile { judging: None, entries })
}

/// Bins of a key's histogram.
const BINS: usize = 24;
/// Nodes listed below the baseline, per key.
const LOWEST: u32 = 10;
/// The lowest nodes are found among a key's figures of the last week.
pub const LOWEST_SINCE_MS: i64 = 7 * 24 * 3600 * 1000;

/// One key of the fleet page and `GET /v1/fleet`: the window's distribution, its baseline when
/// there are enough samples, and the nodes whose mean over the last week is furthest below it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct KeyView {
    #[schema(value_type = Object)]
    pub key: Key,
    #[schema(value_type = Option<Object>)]
    pub baseline: Option<Learned>,
    /// The figure below which a rank raises BELOW_FLEET (default judging), with a baseline.
    pub floor: Option<f64>,
    pub samples: usize,
    /// Equal-width bins from the window's least to its greatest figure.
    pub histogram: Vec<Bin>,
    /// Nodes by their mean over the key's figures of the last week (not only the window),
    /// lowest first, at most 10 (empty for a workspace token: the fleet's
    /// figures are shared, its node names are not).
    pub lowest: Vec<NodeFigure>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Bin {
    pub lo: f64,
    pub hi: f64,
    pub n: usize,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct NodeFigure {
    pub node: String,
    /// The mean of the node's figures of the last week.
    pub mean: f64,
    pub samples: usize,
    /// (mean - centre) / spread, with a baseline.
    pub z: Option<f64>,
}

/// The view of one key over its newest `window` (newest first, as the database returns it),
/// with the `lowest` nodes as the database found them (none for a workspace token).
pub fn key_view(key: Key, window: &[Sample], policy: Policy, lowest: Vec<NodeMean>) -> KeyView {
    let baseline = learn_baseline(window, policy);
    let values: Vec<f64> = window.iter().map(|s| s.value).filter(|v| v.is_finite()).collect();
    let (lo, hi) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(*v), b.max(*v)));
    let mut histogram = Vec::new();
    if !values.is_empty() {
        let width = ((hi - lo) / BINS as f64).max(f64::EPSILON * hi.abs().max(1.0));
        histogram =
            (0..BINS).map(|i| Bin { lo: lo + width * i as f64, hi: lo + width * (i + 1) as f64, n: 0 }).collect();
        for v in &values {
            let i = (((v - lo) / width) as usize).min(BINS - 1);
            histogram[i].n += 1;
        }
    }
    let lowest = lowest
        .into_iter()
        .filter(|n| n.mean.is_finite())
        .map(|n| {
            let z = baseline.filter(|b| b.spread > 0.0).map(|b| (n.mean - b.centre) / b.spread);
            NodeFigure { node: n.node, mean: n.mean, samples: n.samples, z }
        })
        .collect();
    let floor = baseline.map(|b| Judging::DEFAULT.floor(b.centre, b.spread));
    KeyView { key, baseline, floor, samples: values.len(), histogram, lowest }
}

/// Every key's view; `with_nodes` false for a workspace token.
pub async fn view(db: &Db, policy: Policy, with_nodes: bool) -> Result<Vec<KeyView>, DbError> {
    let mut out = Vec::new();
    let since = gpusanity_db::now_ms().saturating_sub(LOWEST_SINCE_MS);
    for key in db.fleet_keys().await? {
        let window = db.fleet_window(&key, policy.window).await?;
        let lowest = if with_nodes { db.fleet_lowest_nodes(&key, since, LOWEST).await? } else { Vec::new() };
        out.push(key_view(key, &window, policy, lowest));
    }
    Ok(out)
}

/// How many of a node's newest figures its page and `GET /v1/nodes/{name}/figures` read at most
/// (over every key).
pub const NODE_FIGURES_MAX: u32 = 2000;

/// One key's figures of one node over time, against the fleet's baseline of that key.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct NodeKeyFigures {
    #[schema(value_type = Object)]
    pub key: Key,
    #[schema(value_type = Option<Object>)]
    pub baseline: Option<Learned>,
    /// The figure below which a rank raises BELOW_FLEET (default judging), with a baseline.
    pub floor: Option<f64>,
    /// The newest figure's fleet percentile (0-100), with a baseline.
    pub percentile: Option<f64>,
    /// Oldest first.
    pub points: Vec<Point>,
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Point {
    /// When the figure was learned (ms since the epoch).
    pub at: i64,
    pub value: f64,
    pub run_id: String,
}

/// The newest `limit` figures of `node` (of `workspace`'s runs only, with one), by key, each
/// key against its baseline as the fleet page shows it.
pub async fn node_figures(
    db: &Db,
    node: &str,
    workspace: Option<&str>,
    limit: u32,
    policy: Policy,
) -> Result<Vec<NodeKeyFigures>, DbError> {
    let mut by_key: std::collections::BTreeMap<Key, Vec<Point>> = Default::default();
    for s in db.node_samples(node, workspace, limit).await?.into_iter().rev() {
        if s.value.is_finite() {
            by_key.entry(s.key).or_default().push(Point { at: s.at, value: s.value, run_id: s.run_id });
        }
    }
    let mut out = Vec::with_capacity(by_key.len());
    for (key, points) in by_key {
        let baseline = learn_baseline(&db.fleet_window(&key, policy.window).await?, policy);
        let last = points.last().map(|p| p.value);
        out.push(NodeKeyFigures {
            floor: baseline.map(|b| Judging::DEFAULT.floor(b.centre, b.spread)),
            percentile: baseline.zip(last).map(|(b, v)| percentile(v, b.centre, b.spread)),
            key,
            baseline,
            points,
        });
    }
    Ok(out)
}

/// A node's newest figure of one check against the fleet (`gpusanity_node_fleet_percentile`).
#[derive(Debug, Clone, PartialEq)]
pub struct NodePercentile {
    pub node: String,
    pub check: String,
    pub percentile: f64,
}

/// Per (node, check), the fleet percentile of the node's newest figure learned since `since`
/// (its lowest over the check's keys), the `cap` lowest first; and how many (node, check)
/// pairs were judged in all, so that a truncated list shows.
pub async fn node_percentiles(
    db: &Db,
    since: i64,
    cap: usize,
    policy: Policy,
) -> Result<(Vec<NodePercentile>, usize), DbError> {
    let mut lowest: std::collections::BTreeMap<(String, String), f64> = Default::default();
    for key in db.fleet_keys().await? {
        let Some(b) = learn_baseline(&db.fleet_window(&key, policy.window).await?, policy) else { continue };
        for s in db.fleet_last_per_node(&key, since).await?.into_iter().filter(|s| s.value.is_finite()) {
            let p = percentile(s.value, b.centre, b.spread);
            let e = lowest.entry((s.node, key.check.as_str().to_string())).or_insert(p);
            *e = e.min(p);
        }
    }
    let total = lowest.len();
    let mut out: Vec<NodePercentile> =
        lowest.into_iter().map(|((node, check), percentile)| NodePercentile { node, check, percentile }).collect();
    out.sort_by(|a, b| a.percentile.total_cmp(&b.percentile).then_with(|| a.node.cmp(&b.node)));
    out.truncate(cap);
    Ok((out, total))
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusanity_common::expected::Conditions;
    use gpusanity_common::registry::CheckId;

    #[test]
    fn the_view_bins_every_figure_marks_the_floor_and_places_the_lowest_nodes() {
        let key = Key::new("NVIDIA H200", Some(580), CheckId::Gemm, "tflops", Conditions::default());
        // 8 nodes of 10 figures each around 680; node-7 runs 10% slow.
        let window: Vec<Sample> = (0..80)
            .map(|i| {
                let node = i % 8;
                let base = if node == 7 { 612.0 } else { 680.0 };
                Sample { node: format!("node-{node}"), value: base + (i % 5) as f64 }
            })
            .collect();
        let mean = |node: &str, mean: f64| NodeMean { node: node.into(), mean, samples: 10 };
        let lowest = vec![mean("node-7", 614.0), mean("node-3", 682.0), mean("x", f64::NAN)];
        let v = key_view(key.clone(), &window, Policy::default(), lowest);
        assert_eq!(v.samples, 80);
        assert_eq!(v.histogram.iter().map(|b| b.n).sum::<usize>(), 80);
        let b = v.baseline.expect("80 samples from 8 nodes");
        assert!(v.floor.expect("a floor") < b.centre);
        assert_eq!(v.lowest.iter().map(|n| n.node.as_str()).collect::<Vec<_>>(), ["node-7", "node-3"]);
        assert!(v.lowest[0].z.is_none_or(|z| z < -4.0), "{:?}", v.lowest[0]);
        // Hostile figures left out of the distribution.
        let mut hostile = window.clone();
        hostile.push(Sample { node: "x".into(), value: f64::NAN });
        hostile.push(Sample { node: "y".into(), value: f64::INFINITY });
        let v = key_view(key.clone(), &hostile, Policy::default(), Vec::new());
        assert!(v.lowest.is_empty());
        assert_eq!(v.samples, 80);
        // One figure, or none: no panic, no baseline.
        let one = key_view(key.clone(), &window[..1], Policy::default(), Vec::new());
        assert_eq!((one.histogram.iter().map(|b| b.n).sum::<usize>(), one.baseline), (1, None));
        let none = key_view(key, &[], Policy::default(), Vec::new());
        assert!(none.histogram.is_empty() && none.lowest.is_empty());
    }
}
