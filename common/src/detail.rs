//! The structured part of one rank's result in one check ([`CheckDetail`]): what a check
//! writes for the diagnosis and the report to read, typed once here so that a renamed field
//! is a compile error in every reader rather than a finding silently dropped.
//!
//! `RankResult.notes` holds free-form text for people only. Reports written before this type
//! carried these structures as JSON strings in `notes` (`rdma_issues`, `losses`,
//! `front_end_cells`...); they still parse (`detail` is absent there) and their notes show as
//! text, without the charts or the findings drawn from them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::findings::Code;
use crate::health::Readings;
use crate::kinds::{PairBandwidth, Severity};

/// One check's structured result on one rank, tagged by `kind` in report.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CheckDetail {
    /// `gpu-health`: what NVML returned for the rank's GPU.
    GpuHealth { readings: Box<Readings> },
    /// `gpu-health` on a GPU whose NVML could not be read: why (health unknown).
    NvmlUnavailable { why: String },
    /// `rdma-ports`: the node's ports at the end of the span and what is wrong with them
    /// (written by the node's local rank 0).
    RdmaPorts {
        ports: Vec<RdmaPort>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        issues: Vec<PortIssue>,
    },
    /// A model check: the training loss of every step and the parameter self-check.
    Model {
        /// The loss of every step (`None`: not a finite number; JSON has no NaN).
        losses: Vec<Option<f64>>,
        /// What is wrong with the losses, if anything (not finite, not falling).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        loss_finding: Option<Code>,
        /// The rank's data-parallel group: its ranks must end with the same parameters.
        dp_group: usize,
        /// The parameters' checksum at the end of training (hex).
        param_checksum: String,
        /// The checksums after the last update and at the end, when they differ: the
        /// parameters changed in memory while nothing wrote them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        changed_at_rest: Option<String>,
    },
    /// `network-connectivity` (rank 0): the node x node grids, when the run is small enough
    /// to draw them, and every failed probe.
    Connectivity {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        front_end: Option<Vec<Vec<GridCell>>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        back_end: Option<Vec<Vec<GridCell>>>,
        #[serde(default)]
        front_end_failed: Vec<Probe>,
        #[serde(default)]
        back_end_failed: Vec<Probe>,
        /// How many nodes probed each node; absent: every other node did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        front_end_probers: Option<Vec<usize>>,
        /// How many ranks of other nodes each rank exchanged with; absent: all of them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        back_end_peers: Option<Vec<usize>>,
        /// The node's RDMA ports that are not ACTIVE (`mlx5_1 port 1: DOWN`), written by the
        /// node's local rank 0 (on the other nodes' local rank 0, the only field set).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ib_ports_not_active: Vec<String>,
    },
    /// `pair-bandwidth`: every measured node pair.
    PairBandwidth { pairs: Vec<PairBandwidth> },
    /// `gemm`: the hash of the product, compared between ranks of one device model.
    Gemm { result_hash: String },
    /// `multi-all-reduce`: the figure of every group the rank is in.
    MultiAllReduce { groups: Vec<GroupBusbw> },
}

/// One cell of a connectivity grid (row: from, column: to). report.json keeps the text the
/// grids always had (`-`, `0.31ms`, `FAIL`, `ok 4/4`, `FAIL 1/4`); it is parsed once, here, and
/// a cell this version cannot read is kept as [`GridCell::Text`], drawn as it is.
#[derive(Debug, Clone, PartialEq)]
pub enum GridCell {
    /// Not probed (the diagonal, or a pair no probe covered).
    NotProbed,
    /// Front end: reached, with the round trip in milliseconds.
    Reached { ms: f64 },
    /// Front end: the probe failed.
    Failed,
    /// Back end: the exchanges between the two nodes' ranks, and how many of them failed.
    Exchanges { n: u32, failed: u32 },
    /// A cell of another version's report.
    Text(String),
}

impl GridCell {
    /// Whether the cell says the pair could not talk.
    pub fn failed(&self) -> bool {
        matches!(self, GridCell::Failed | GridCell::Exchanges { failed: 1.., .. })
    }
}

impl std::fmt::Display for GridCell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GridCell::NotProbed => f.write_str("-"),
            GridCell::Reached { ms } => write!(f, "{ms:.2}ms"),
            GridCell::Failed => f.write_str("FAIL"),
            GridCell::Exchanges { n, failed: 0 } => write!(f, "ok {n}/{n}"),
            GridCell::Exchanges { n, failed } => write!(f, "FAIL {failed}/{n}"),
            GridCell::Text(t) => f.write_str(t),
        }
    }
}

impl From<&str> for GridCell {
    fn from(s: &str) -> GridCell {
        let fraction = |t: &str| -> Option<(u32, u32)> {
            let (a, b) = t.split_once('/')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        };
        match s {
            "-" => GridCell::NotProbed,
            "FAIL" => GridCell::Failed,
            _ => {
                if let Some(ms) = s.strip_suffix("ms").and_then(|v| v.parse::<f64>().ok()).filter(|v| v.is_finite()) {
                    GridCell::Reached { ms }
                } else if let Some((n, m)) = s.strip_prefix("ok ").and_then(fraction).filter(|(n, m)| n == m) {
                    GridCell::Exchanges { n: m, failed: m - n }
                } else if let Some((failed, n)) =
                    s.strip_prefix("FAIL ").and_then(fraction).filter(|(b, n)| b <= n && *b > 0)
                {
                    GridCell::Exchanges { n, failed }
                } else {
                    GridCell::Text(s.to_string())
                }
            }
        }
    }
}

impl Serialize for GridCell {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GridCell {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<GridCell, D::Error> {
        Ok(GridCell::from(String::deserialize(d)?.as_str()))
    }
}

/// The kind of a `multi-all-reduce` group: groups are compared within their kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupKind {
    /// Local rank i of every node.
    Rail,
    /// Every rank of one node.
    Node,
    /// Every rank of the job (one of several concurrent world groups).
    World,
}

/// A `multi-all-reduce` group: its kind and index (`rail0`, `node1`, `world0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ReduceGroup {
    pub kind: GroupKind,
    /// The rail's local rank, the node's rank, or the world group's stream.
    pub index: usize,
}

impl std::fmt::Display for ReduceGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.kind {
            GroupKind::Rail => "rail",
            GroupKind::Node => "node",
            GroupKind::World => "world",
        };
        write!(f, "{kind}{}", self.index)
    }
}

/// One group's all-reduce as one of its ranks measured it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupBusbw {
    pub group: ReduceGroup,
    /// Its global ranks.
    pub ranks: Vec<usize>,
    pub busbw_gbps: f64,
}

/// One RDMA port as read under /sys/class/infiniband.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RdmaPort {
    pub device: String,
    pub port: String,
    /// E.g. `ACTIVE`, `DOWN`, `INIT` (the number before the colon dropped).
    pub state: String,
    /// E.g. `LinkUp`, `Polling`, `Disabled`.
    pub phys_state: String,
    /// E.g. `400 Gb/sec (4X NDR)`.
    pub rate: String,
    /// The rate in Gb/s, where it parses.
    pub rate_gbps: Option<f64>,
    /// `InfiniBand` or `Ethernet` (RoCE).
    pub link_layer: String,
    /// The flap and error counters that could be read.
    pub counters: BTreeMap<String, u64>,
}

impl RdmaPort {
    /// `mlx5_0 port 1`.
    pub fn name(&self) -> String {
        format!("{} port {}", self.device, self.port)
    }

    pub fn is_up(&self) -> bool {
        self.state == "ACTIVE" && self.phys_state == "LinkUp"
    }
}

/// One thing wrong with one RDMA port.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PortIssue {
    pub code: Code,
    pub severity: Severity,
    /// `mlx5_0 port 1`.
    pub port: String,
    pub message: String,
    /// The counters that moved, with their deltas (for the flap and error findings).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deltas: Vec<(String, u64)>,
}

/// One connectivity probe between two nodes (front end) or two ranks (back end).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Probe {
    pub from: usize,
    pub to: usize,
    /// Round trip in milliseconds (0 for a failed probe).
    pub ms: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl CheckDetail {
    /// The GPU's readings, if this is the health check's detail.
    pub fn readings(&self) -> Option<&Readings> {
        match self {
            CheckDetail::GpuHealth { readings } => Some(readings),
            _ => None,
        }
    }

    /// The items this detail holds, for a reader that bounds what it accepts.
    pub fn len(&self) -> usize {
        match self {
            CheckDetail::GpuHealth { .. } | CheckDetail::NvmlUnavailable { .. } => 1,
            CheckDetail::RdmaPorts { ports, issues } => ports.len() + issues.len(),
            CheckDetail::Model { losses, .. } => losses.len(),
            CheckDetail::Connectivity {
                front_end,
                back_end,
                front_end_failed,
                back_end_failed,
                front_end_probers,
                back_end_peers,
                ib_ports_not_active,
            } => {
                let cells = |g: &Option<Vec<Vec<GridCell>>>| g.iter().flatten().map(Vec::len).sum::<usize>();
                cells(front_end)
                    + cells(back_end)
                    + front_end_failed.len()
                    + back_end_failed.len()
                    + front_end_probers.as_ref().map_or(0, Vec::len)
                    + back_end_peers.as_ref().map_or(0, Vec::len)
                    + ib_ports_not_active.len()
            }
            CheckDetail::PairBandwidth { pairs } => pairs.len(),
            CheckDetail::Gemm { .. } => 1,
            CheckDetail::MultiAllReduce { groups } => groups.iter().map(|g| 1 + g.ranks.len()).sum(),
        }
    }

    /// The facts of the detail a report shows as notes, for people.
    pub fn notes(&self) -> BTreeMap<String, String> {
        let mut n = BTreeMap::new();
        match self {
            CheckDetail::NvmlUnavailable { why } => {
                n.insert("nvml_unavailable".to_string(), why.clone());
            }
            CheckDetail::Gemm { result_hash } => {
                n.insert("result_hash".to_string(), result_hash.clone());
            }
            CheckDetail::Connectivity { ib_ports_not_active, .. } if !ib_ports_not_active.is_empty() => {
                n.insert("ib_ports_not_active".to_string(), ib_ports_not_active.join("; "));
            }
            CheckDetail::MultiAllReduce { groups } => {
                let list: Vec<String> = groups.iter().map(|g| format!("{}: ranks {:?}", g.group, g.ranks)).collect();
                n.insert("groups".to_string(), list.join("; "));
            }
            _ => {}
        }
        n
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::GridCell;

    #[test]
    fn grid_cells_read_the_text_the_grids_always_had_and_write_it_back() {
        let cells = [
            ("-", GridCell::NotProbed),
            ("0.31ms", GridCell::Reached { ms: 0.31 }),
            ("FAIL", GridCell::Failed),
            ("ok 4/4", GridCell::Exchanges { n: 4, failed: 0 }),
            ("FAIL 1/4", GridCell::Exchanges { n: 4, failed: 1 }),
        ];
        for (text, cell) in cells {
            let read: GridCell = serde_json::from_value(serde_json::json!(text)).unwrap();
            assert_eq!(read, cell, "{text}");
            assert_eq!(serde_json::to_value(&read).unwrap(), text);
        }
        assert!(GridCell::Failed.failed() && GridCell::from("FAIL 4/4").failed());
        assert!(!GridCell::from("ok 2/2").failed() && !GridCell::from("1.5ms").failed());
        // What no version writes stays text: drawn as it is, judged as nothing.
        for odd in ["NaNms", "ok 1/2", "FAIL 5/4", "FAIL 0/4", "ok", "x", ""] {
            assert_eq!(GridCell::from(odd), GridCell::Text(odd.into()), "{odd}");
            assert!(!GridCell::from(odd).failed());
        }
    }
}
