//! What a launcher tells its workers and what they tell it back.
//!
//! The launcher passes a [`WorkerSpec`] as JSON in the `GPUSANITY_WORKER_SPEC` environment
//! variable; the worker writes [`WorkerMsg`] JSON lines on its stdout (its logs go to stderr).

use gpusanity_common::config::CheckConfigs;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{DeviceKind, RankResult};
use serde::{Deserialize, Serialize};

use crate::backend::WorkerPlace;
use crate::store::Secret;

pub const SPEC_ENV: &str = "GPUSANITY_WORKER_SPEC";

/// Fault injection for tests of the checks themselves: `KIND@RANK[,KIND@RANK...]` in this
/// environment variable makes that rank misbehave for real (see [`crate::checks::Faults`]).
/// Workers see it only when the launcher runs with `--test-faults`.
pub use gpusanity_common::envs::FAULT_ENV;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerSpec {
    /// Where the worker sits: its fields stand at the top level of the JSON (`rank`, `world`,
    /// `local_rank`, `node_rank`, `node_addr`, `node_sizes`), as they did before they were
    /// one type.
    #[serde(flatten)]
    pub place: WorkerPlace,
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec's JSON keeps the worker's place at its top level, as before the place was one
    /// type (the test kit finds a worker's rank at `rank`), and reads back as written.
    #[test]
    fn a_spec_keeps_its_place_at_the_top_of_its_json() {
        let spec = WorkerSpec {
            place: WorkerPlace {
                rank: 5,
                world: 8,
                local_rank: 1,
                node_rank: 2,
                node_addr: "10.0.0.3".into(),
                node_sizes: vec![2, 2, 4],
            },
            store_addr: "10.0.0.1:29400".into(),
            rdzv_secret: Some(Secret::random()),
            device: DeviceKind::Cpu,
            checks: vec![CheckId::Gemm],
            configs: CheckConfigs::defaults(DeviceKind::Cpu),
            node_store_addr: None,
            fleet_baseline: None,
            per_test_s: Some(60.0),
        };
        let v = serde_json::to_value(&spec).expect("a spec");
        let mut keys: Vec<&str> = v.as_object().expect("an object").keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want = [
            "rank",
            "world",
            "local_rank",
            "node_rank",
            "node_addr",
            "node_sizes",
            "store_addr",
            "rdzv_secret",
            "device",
            "checks",
            "configs",
            "per_test_s",
        ];
        want.sort_unstable();
        assert_eq!(keys, want);
        assert_eq!((v["rank"].as_u64(), v["node_addr"].as_str()), (Some(5), Some("10.0.0.3")));
        let back: WorkerSpec = serde_json::from_value(v.clone()).expect("read back");
        assert_eq!((back.place.rank, back.place.world, back.place.local_rank, back.place.node_rank), (5, 8, 1, 2));
        assert_eq!((back.place.node_addr.as_str(), back.place.node_sizes.as_slice()), ("10.0.0.3", &[2, 2, 4][..]));
        assert_eq!(serde_json::to_value(&back).expect("a spec"), v);
    }
}
