//! What a launcher tells its workers and what they tell it back.
//!
//! The launcher passes a [`WorkerSpec`] as JSON in the `GPUSANITY_WORKER_SPEC` environment
//! variable; the worker writes [`WorkerMsg`] JSON lines on its stdout (its logs go to stderr).

use gpusanity_common::config::CheckConfigs;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{DeviceKind, RankResult};
use serde::{Deserialize, Serialize};

use crate::store::Secret;

pub const SPEC_ENV: &str = "GPUSANITY_WORKER_SPEC";

/// Fault injection for tests of the checks themselves: `KIND@RANK[,KIND@RANK...]` in this
/// environment variable makes that rank misbehave for real (see [`crate::checks::Faults`]).
/// Workers see it only when the launcher runs with `--test-faults`.
pub use gpusanity_common::envs::FAULT_ENV;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub rank: usize,
    pub world: usize,
    pub local_rank: usize,
    pub node_rank: usize,
    pub node_addr: String,
    /// Workers per node, by node rank.
    pub node_sizes: Vec<usize>,
    pub store_addr: String,
    /// The run's rendezvous secret, for the store's handshake and the CPU transport's hellos
    /// (hex in the JSON; here rather than on a command line, which every user can read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdzv_secret: Option<Secret>,
    pub device: DeviceKind,
    pub checks: Vec<CheckId>,
    pub configs: CheckConfigs,
    /// This node's own store on loopback, where its ranks meet before their node speaks for
    /// them in node 0's store (`None`: a node of one rank, or node 0's store takes both levels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_store_addr: Option<String>,
    /// Rank 0 of a run with a fleet baseline: a private file (the launcher's, removed when the
    /// run ends) with the baseline's entries of the run's checks, which the worker reads with
    /// [`gpusanity_common::fleet::file::BaselineFile::read`] to re-measure before a rank is
    /// found below the fleet. A path, not the entries: a spec travels in one environment
    /// variable (128 KiB at most on Linux), a baseline file may hold 16 MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_baseline: Option<std::path::PathBuf>,
    /// Seconds a check may take before the launcher stops it as hung (its per-test limit):
    /// [`crate::checks::remeasure`] measures a rank still below its fleet floor again only
    /// when that fits well inside it. `None` (a launcher of before): no further measurement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_test_s: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkerMsg {
    /// The backend is open.
    Ready {
        device: String,
        /// How the device is linked to the node's other GPUs (GPU only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        link: Option<gpusanity_common::report::Link>,
    },
    /// Sent every [`HEARTBEAT_EVERY`] by a thread of its own, whatever the checks are doing: a
    /// worker that stops beating is stopped or dead, not merely waiting.
    Heartbeat,
    /// Where the worker is: check, phase (`start`, `warmup`, `timed`, `verify`...) and step.
    Progress { check: CheckId, phase: String, step: u64 },
    CheckDone {
        check: CheckId,
        duration_s: f64,
        /// Boxed: a result with its detail is far larger than the other messages.
        result: Box<RankResult>,
    },
    /// The worker cannot go on (backend failed to open...).
    Fatal { error: String },
}

pub const HEARTBEAT_EVERY: std::time::Duration = std::time::Duration::from_millis(250);
