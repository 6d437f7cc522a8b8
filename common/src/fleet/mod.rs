//! Fleet baselines: what healthy devices of one model measured in this fleet's own passed runs,
//! and a rank's figure judged against them.
//!
//! - [`Key`]: what a baseline is kept apart by (device model, driver major version, check,
//!   headline metric, and the [`Conditions`] that change the figure);
//! - [`learn`]: a robust centre and spread (median, and MAD x 1.4826) over a sliding window of
//!   the newest passed samples, used only with enough samples from enough distinct nodes
//!   ([`Policy`]);
//! - [`Judging`] and [`judge`]: a figure below centre - max(k x spread, min_gap x centre) is
//!   below the fleet; every judged figure gets its fleet percentile;
//! - [`samples`]: the key of each rank's figure, and which figures of a report may be learned;
//! - [`noise`]: how a healthy H200's GEMM figure varies (the fleet simulation and the test
//!   rigs' paced device draw from it);
//! - [`file`]: the baseline file (`gpusanity baseline export` writes it, `gpusanity check
//!   --baseline FILE` reads it), in the format of `expected.toml` plus the spread.
//!
//! Every figure judged here is a throughput (a low figure is bad), as every headline metric is.

pub mod file;
pub mod noise;
mod normal;
pub mod samples;

use serde::{Deserialize, Serialize};

pub use normal::{normal_cdf, normal_quantile};

use crate::expected::Conditions;
use crate::kinds::Link;
use crate::registry::CheckId;
use crate::stats::median;

/// MAD x this estimates the standard deviation of normally distributed figures.
pub const MAD_SCALE: f64 = 1.4826;

/// What one baseline holds for: figures of different keys are never pooled.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Key {
    /// The device's full name as the worker reports it (`NVIDIA H200`).
    pub device: String,
    /// The driver's major version (580), when the run read it (GPU runs with gpu-health).
    pub driver: Option<u32>,
    pub check: CheckId,
    pub metric: String,
    /// The GEMM's m = n = k, a memory check's size.
    pub size: Option<u64>,
    /// A collective's largest message.
    pub max_bytes: Option<u64>,
    /// Ranks on every node (None: nodes of unequal sizes).
    pub ranks_per_node: Option<usize>,
    /// Whether every rank sat on one node (a collective is then bounded by the node's links).
    pub single_node: bool,
    /// How the node's GPUs are linked, when every rank reported the same.
    pub link: Option<Link>,
}

impl Key {
    /// The key of `device`'s `check.metric` measured under `when`.
    pub fn new(device: &str, driver: Option<u32>, check: CheckId, metric: &str, when: Conditions) -> Key {
        Key {
            device: device.to_string(),
            driver,
            check,
            metric: metric.to_string(),
            size: when.size,
            max_bytes: when.max_bytes,
            ranks_per_node: when.ranks_per_node,
            single_node: when.nodes == 1,
            link: when.link,
        }
    }
}

/// The major version of a driver version string (`580.95.05` -> 580).
pub fn driver_major(version: &str) -> Option<u32> {
    version.trim().split('.').next()?.parse().ok()
}

/// How much history a baseline is learned from, and how much it needs before it is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// The newest samples the centre and spread are computed over (a sliding window, so a
    /// fleet-wide change such as a driver update is learned within one window).
    pub window: usize,
    /// No baseline with fewer samples: the MAD of a handful of figures is one of their gaps.
    pub min_samples: usize,
    /// No baseline from fewer distinct nodes: one node's figures are its own, not the fleet's.
    pub min_nodes: usize,
}

impl Default for Policy {
    /// 200 samples (the median's standard error is then 9% of the spread), at least 30 samples
    /// (the MAD's relative error about 20%) from at least 4 nodes.
    fn default() -> Policy {
        Policy { window: 200, min_samples: 30, min_nodes: 4 }
    }
}

/// One passed rank's figure, as learned.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The node it was measured on (its name in the run).
    pub node: String,
    pub value: f64,
}

/// A learned baseline: centre, spread and what they were computed over.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Learned {
    /// The median of the window.
    pub centre: f64,
    /// MAD x 1.4826: the standard deviation were the figures normal.
    pub spread: f64,
    /// Samples in the window.
    pub samples: usize,
    /// Distinct nodes in the window.
    pub nodes: usize,
    /// The window's size (the policy's).
    pub window: usize,
}

/// The baseline of `newest_first` (the newest sample first; non-finite and non-positive figures
/// are ignored) under `policy`, or None while it has too few samples or nodes.
pub fn learn(newest_first: &[Sample], policy: Policy) -> Option<Learned> {
    let window: Vec<&Sample> =
        newest_first.iter().filter(|s| s.value.is_finite() && s.value > 0.0).take(policy.window).collect();
    let mut nodes: Vec<&str> = window.iter().map(|s| s.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    if window.len() < policy.min_samples.max(1) || nodes.len() < policy.min_nodes {
        return None;
    }
    let values: Vec<f64> = window.iter().map(|s| s.value).collect();
    let centre = median(&values);
    let dev: Vec<f64> = values.iter().map(|v| (v - centre).abs()).collect();
    Some(Learned {
        centre,
        spread: MAD_SCALE * median(&dev),
        samples: values.len(),
        nodes: nodes.len(),
        window: policy.window,
    })
}

/// How far below the centre a figure may fall.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Judging {
    /// Spreads below the centre.
    pub k: f64,
    /// The least gap, as a fraction of the centre: a fleet that spreads very little (or whose
    /// MAD is 0) does not flag a figure 0.5% below its median.
    pub min_gap: f64,
}

impl Judging {
    /// k = 4.0 and a 3% least gap. A normal figure falls 3.09 spreads below its mean once in
    /// 1,000 runs; the spread is itself estimated from a window of samples, and the measured
    /// H200 figures have heavier tails than a normal, so k is set where the simulation of
    /// bench/fleet_sim.rs (docs/benchmarks/fleet.md) measures at most 0.1% of healthy runs below.
    pub const DEFAULT: Judging = Judging { k: 4.0, min_gap: 0.03 };

    /// The largest k accepted (from a file or `--check-param`): past it nothing is ever flagged.
    pub const MAX_K: f64 = 50.0;

    /// The figure below which a value is below the fleet.
    pub fn floor(&self, centre: f64, spread: f64) -> f64 {
        centre - (self.k * spread).max(self.min_gap * centre)
    }

    /// Refuses a k or gap that is not a finite number in its range.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.k.is_finite() && self.k > 0.0 && self.k <= Self::MAX_K) {
            return Err(format!("k must be a number above 0 and at most {}, not {}", Self::MAX_K, self.k));
        }
        if !(self.min_gap.is_finite() && (0.0..1.0).contains(&self.min_gap)) {
            return Err(format!("min_gap must be a fraction in [0, 1), not {}", self.min_gap));
        }
        Ok(())
    }
}

impl Default for Judging {
    fn default() -> Judging {
        Judging::DEFAULT
    }
}

/// A rank's figure against its fleet baseline, as report.json carries it on the rank's entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FleetJudgement {
    /// The metric judged (`tflops`).
    pub metric: String,
    pub value: f64,
    /// Where the figure falls in the fleet, 0-100 (a normal of the baseline's centre and spread).
    pub percentile: f64,
    pub centre: f64,
    pub spread: f64,
    /// Below this figure the rank is below the fleet.
    pub floor: f64,
    pub k: f64,
    pub samples: usize,
    pub nodes: usize,
    pub window: usize,
    /// Whether the figure fell below `floor`.
    pub below: bool,
    /// The baseline's own source line.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub source: String,
}

/// `value` of `metric` against `baseline` under `judging`.
pub fn judge(metric: &str, value: f64, baseline: &Learned, judging: Judging, source: &str) -> FleetJudgement {
    let floor = judging.floor(baseline.centre, baseline.spread);
    FleetJudgement {
        metric: metric.to_string(),
        value,
        percentile: percentile(value, baseline.centre, baseline.spread),
        centre: baseline.centre,
        spread: baseline.spread,
        floor,
        k: judging.k,
        samples: baseline.samples,
        nodes: baseline.nodes,
        window: baseline.window,
        below: value < floor,
        source: source.to_string(),
    }
}

/// Where `value` falls among figures of this centre and spread, 0-100.
pub fn percentile(value: f64, centre: f64, spread: f64) -> f64 {
    if spread > 0.0 {
        100.0 * normal_cdf((value - centre) / spread)
    } else if value < centre {
        0.0
    } else if value > centre {
        100.0
    } else {
        50.0
    }
}

#[cfg(test)]
mod tests;
