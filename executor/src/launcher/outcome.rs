//! What each node's launcher brings back from its workers, as node 0 gathers it: the node's
//! outcome (its ranks, each check's results, what stopped it, its host readings), why a node
//! stopped its workers, and what node 0 heard from each node.

use gpusanity_common::report::{RankInfo, RankResult};
use serde::{Deserialize, Serialize};

/// Why a node stopped its workers before they finished.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Stop {
    /// A test overran `--sanity-check-timeout-per-test` on `node_rank`.
    TestTimeout { node_rank: usize, check: String, limit_s: f64 },
    /// The whole run overran `--sanity-check-max-time`.
    RunTimeout { node_rank: usize, limit_s: f64 },
    /// A worker died or gave up.
    RankFailed { node_rank: usize, rank: usize, reason: String },
    /// The launcher of `node_rank` was told to stop (SIGTERM/SIGINT).
    Interrupted { node_rank: usize, signal: String },
    /// No rank of `node_rank` progressed, or one stopped beating, for `stall_s` in `check`.
    Stalled { node_rank: usize, check: String, stall_s: f64, silent_rank: Option<usize> },
}

impl Stop {
    /// The node that decided the stop.
    pub fn node_rank(&self) -> usize {
        match self {
            Stop::TestTimeout { node_rank, .. }
            | Stop::RunTimeout { node_rank, .. }
            | Stop::RankFailed { node_rank, .. }
            | Stop::Interrupted { node_rank, .. }
            | Stop::Stalled { node_rank, .. } => *node_rank,
        }
    }

    pub fn is_timeout(&self) -> bool {
        matches!(self, Stop::TestTimeout { .. } | Stop::RunTimeout { .. } | Stop::Stalled { .. })
    }
}

/// What one node measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeOutcome {
    pub node_rank: usize,
    pub ranks: Vec<RankInfo>,
    /// Per selected check: its duration on this node and this node's rank results.
    pub checks: Vec<(f64, Vec<RankResult>)>,
    pub stop: Option<Stop>,
    /// What the launcher read of its host before any check, and the findings it gave.
    #[serde(default)]
    pub host: Option<HostOutcome>,
}

/// What node 0 heard from one node once the checks were over.
#[derive(Debug, Clone)]
pub enum Heard {
    /// The node's outcome.
    Outcome(Box<NodeOutcome>),
    /// Nothing within the wait: the node is unreachable or dead.
    Silent,
    /// The node posted something that is not an outcome; the error says what was wrong with it.
    Malformed(String),
}

impl Heard {
    /// The outcome, where the node posted one that reads.
    pub fn outcome(&self) -> Option<&NodeOutcome> {
        match self {
            Heard::Outcome(o) => Some(o.as_ref()),
            Heard::Silent | Heard::Malformed(_) => None,
        }
    }
}

/// A node's host readings and their findings, as it posts them to node 0.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HostOutcome {
    pub readings: gpusanity_common::host::HostReadings,
    pub findings: Vec<gpusanity_common::report::Finding>,
}
