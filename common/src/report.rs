//! The versioned `report.json` schema, shared by `gpusanity check` and the service.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

pub use crate::detail::CheckDetail;
use crate::events::StateEvent;
pub use crate::findings::{Code, Finding};
pub use crate::kinds::{DeviceKind, Link, PairBandwidth, Severity};
pub use crate::registry::{CheckId, Scope};
use crate::settings::Settings;

/// Bumped on every incompatible change of [`Report`].
pub const REPORT_SCHEMA_VERSION: u32 = 1;

/// The overall outcome of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Passed,
    Failed,
    TimedOut,
    Skipped,
}

/// The outcome of one check, or of one rank in one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Passed,
    Failed,
    /// The process raised an error (a failed CUDA call, a broken connection...).
    Error,
    /// The test overran `--sanity-check-timeout-per-test` (or the whole run its max time).
    TimedOut,
    /// The check never started: an earlier check ended the run.
    NotRun,
    /// The check does not apply to this device (e.g. kernel launch on CPU); the rank's notes
    /// say why. Not a failure.
    NotApplicable,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    pub gpusanity_version: String,
    pub run_id: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub status: RunStatus,
    /// One line for people: the verdict and the faulty nodes.
    pub summary: String,
    pub settings: Settings,
    pub backend: DeviceKind,
    pub nodes: Vec<NodeInfo>,
    pub ranks: Vec<RankInfo>,
    pub checks: Vec<CheckReport>,
    pub findings: Vec<Finding>,
    pub events: Vec<StateEvent>,
    /// A verdict per node (healthy / suspect / faulty), from the findings that place it.
    #[serde(default)]
    pub node_verdicts: Vec<NodeVerdict>,
    /// Node ranks judged faulty: the nodes to isolate.
    #[serde(default)]
    pub faulty_nodes: Vec<usize>,
    /// Checks re-measured on every rank before a verdict, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub remeasured: Vec<String>,
    /// Pairwise node-to-node bandwidth, when the link test ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pair_bandwidth: Vec<PairBandwidth>,
    /// Collective sweeps summarized on a large run: per check, the spread over every rank at
    /// each message size; the per-rank sweeps kept are those of the ranks a finding names and
    /// of the slowest, median and fastest rank.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sweep_summaries: Vec<SweepSummary>,
    /// What each node's launcher read of its host before any check (kernel log, settings),
    /// as judged into the findings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<NodeHost>,
}

/// One node's host readings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeHost {
    pub node_rank: usize,
    pub readings: crate::host::HostReadings,
}

/// One check's sweep over all its ranks, at each message size (see `Report::sweep_summaries`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepSummary {
    pub check: CheckId,
    /// Ranks whose per-rank sweep was left out of the report.
    pub ranks_left_out: usize,
    pub points: Vec<SweepStats>,
}

/// Bus bandwidth at one message size over the ranks that measured it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepStats {
    pub bytes: u64,
    pub ranks: usize,
    pub busbw_gbps_min: f64,
    pub busbw_gbps_median: f64,
    pub busbw_gbps_max: f64,
    /// Wrong elements summed over the ranks.
    pub wrong: u64,
}

impl Report {
    /// The first critical finding placed on node `node_rank`: the evidence behind isolating it.
    pub fn evidence(&self, node_rank: usize) -> Option<&Finding> {
        self.findings.iter().find(|f| f.severity == Severity::Critical && f.node_rank == Some(node_rank))
    }
}

/// How a node came out of the diagnosis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeHealth {
    Healthy,
    /// Named by a warning, or one of the two ends of a slow pair that could not be told apart.
    Suspect,
    /// Named by a critical finding: exclude it from the job.
    Faulty,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeVerdict {
    pub node_rank: usize,
    pub host: String,
    pub health: NodeHealth,
    /// The codes of the findings behind the verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub codes: Vec<Code>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub node_rank: usize,
    pub hostname: String,
    /// The address other nodes reach this node at.
    pub addr: String,
    pub nproc: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankInfo {
    pub rank: usize,
    pub node_rank: usize,
    pub local_rank: usize,
    pub host: String,
    pub device: String,
    /// The worker's process id on its node.
    pub pid: u32,
    /// How the device is linked to the node's other GPUs, as read from the device (NVML on a
    /// GPU); absent on CPU or where it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<Link>,
}

/// The link every rank reports, when they all report the same one.
pub fn common_link(ranks: &[RankInfo]) -> Option<Link> {
    let first = ranks.first()?.link?;
    ranks.iter().all(|r| r.link == Some(first)).then_some(first)
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckReport {
    pub name: CheckId,
    pub status: CheckStatus,
    pub duration_s: f64,
    /// The configuration the check ran with.
    pub config: serde_json::Value,
    pub ranks: Vec<RankResult>,
}

/// One rank's result in one check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankResult {
    pub rank: usize,
    pub status: CheckStatus,
    /// Headline figures, e.g. `tflops`, `busbw_gbps_max`, `wrong_elements`.
    pub metrics: BTreeMap<String, f64>,
    /// Per-message-size figures of a collective.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sweep: Vec<SweepPoint>,
    /// Free-form facts for people (the verifier's detail, the dtype...): no code decides on
    /// them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub notes: BTreeMap<String, String>,
    /// How the rank ended when it did not finish the check (the launcher's account; boxed:
    /// most results have none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<Box<crate::rank_end::RankEnd>>,
    /// The check's structured result, read by the diagnosis and the report (absent in
    /// reports written before it existed: see [`crate::detail`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<CheckDetail>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The headline figure against its fleet baseline (`check --baseline FILE`), when one held
    /// (boxed: most results have none, and results travel in the workers' messages).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<Box<crate::fleet::FleetJudgement>>,
}

impl RankResult {
    pub fn new(rank: usize, status: CheckStatus) -> Self {
        RankResult {
            rank,
            status,
            metrics: BTreeMap::new(),
            sweep: Vec::new(),
            notes: BTreeMap::new(),
            end: None,
            detail: None,
            error: None,
            fleet: None,
        }
    }

    /// The notes a report shows: the rank's own, with its end and the detail's facts for
    /// people.
    pub fn shown_notes(&self) -> BTreeMap<String, String> {
        let mut n = self.notes.clone();
        if let Some(end) = &self.end {
            n.extend(end.notes());
        }
        if let Some(d) = &self.detail {
            n.extend(d.notes());
        }
        n
    }
}

/// One message size of a collective sweep, with nccl-tests' definitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    pub bytes: u64,
    /// Mean time of one call, microseconds.
    pub time_us: f64,
    pub algbw_gbps: f64,
    pub busbw_gbps: f64,
    /// Elements of the result that differ from the expected value.
    pub wrong: u64,
}
