//! The agent protocol: the coordinator sends [`AgentCommand`]s on the agent-tasks topic (keyed
//! by node name), the agents answer with [`AgentReport`]s on the agent-reports topic.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::report::Report;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentCommand {
    pub version: u32,
    /// The node this command is for; other agents ignore it.
    pub node: String,
    #[serde(flatten)]
    pub body: CommandBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum CommandBody {
    /// Run this node's part of a check run. Sent to node 0 first with no `master`; node 0's
    /// agent answers [`ReportBody::Started`] with its rendezvous port, and then the other
    /// nodes get it with `master` set. A repeated task for the same run is ignored.
    Task(Task),
    /// Stop this node's part of a run (job stopped, run failed elsewhere, deadline).
    Cancel { run_id: String, reason: String },
    /// Sample the job's GPUs on this node while it runs (docs/watch.md); a repeated one renews it.
    Watch(crate::wire::watch::WatchTask),
    /// Stop sampling the job's GPUs for the run (the job stopped or restarted): a later `Watch`
    /// of that run is refused, so that one sent before it (another replica's renewal, late on
    /// the topic) cannot start it again. `run_id` is empty from older services: whatever run of
    /// the job is watched stops, and nothing is refused later.
    Unwatch {
        job_id: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        run_id: String,
    },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Task {
    pub run_id: String,
    /// The job the run checks: on Kubernetes the agent finds the job's pods on its node by it
    /// (label `gpusanity.io/job-id`). Empty in tasks of older services.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub job_id: String,
    pub nnodes: usize,
    pub node_rank: usize,
    /// Node 0's rendezvous address and port; None for node 0 itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master: Option<(String, u16)>,
    /// The job's SanityCheckArgs (validated by the service).
    pub sanity_check_args: String,
    /// The agent gives up on the task after this instant (a stale task is ignored).
    pub deadline: DateTime<Utc>,
    /// The run's rendezvous secret, sealed under the key that signs this task (hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdzv_secret: Option<String>,
    /// The GPUs the job asked for on this node (the job event's `gpus`); fewer usable ones
    /// fail the node (`NODE_GPUS_MISSING`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// Which GPUs of the node are the job's (the job event's `gpu_ids`, validated by the
    /// service); empty: the first `gpus` (a whole-node job).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_ids: Vec<crate::wire::gpu_id::GpuId>,
    /// The fleet's baselines node 0 judges the run's figures against (`--baseline`); only in
    /// node 0's task, only when the fleet has learned one. Validated by the agent as the file
    /// `gpusanity check --baseline` reads (older agents ignore it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<crate::fleet::file::BaselineFile>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentReport {
    pub version: u32,
    pub node: String,
    /// Unique per agent process: a restarted agent is a new instance.
    pub agent_id: String,
    pub at: DateTime<Utc>,
    #[serde(flatten)]
    pub body: ReportBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum ReportBody {
    /// Sent every heartbeat interval while the agent lives, with the run it is busy with.
    Heartbeat {
        address: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run_id: Option<String>,
        /// Seconds since this node's part of the run started.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        elapsed_s: Option<f64>,
    },
    /// The node's launcher started; node 0 names its rendezvous port.
    Started {
        run_id: String,
        node_rank: usize,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        master_port: Option<u16>,
    },
    /// The node's launcher ended: its exit code, and node 0's report.
    Result(NodeResult),
    /// One piece of node 0's report when it is too large for one message: sent in order
    /// before its `Result`, which names how many there are ([`ChunkedReport`]).
    ReportChunk(ReportChunk),
}

/// A piece of node 0's gzipped report.json.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportChunk {
    pub run_id: String,
    pub node_rank: usize,
    /// 0, 1, 2... in the order the pieces join.
    pub seq: u32,
    /// The piece's bytes, base64 (standard alphabet, padded).
    pub data: String,
}

/// What a `Result` says of the report it sent in chunks ahead of it: the service joins them,
/// checks the length and digest, and reads the report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkedReport {
    pub chunks: u32,
    /// Length of the gzip stream the chunks join into.
    pub gzip_bytes: u64,
    /// SHA-256 of that stream, hex.
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeResult {
    pub run_id: String,
    pub node_rank: usize,
    /// The launcher's exit code (see common/src/exit.rs); None when it died by a signal.
    pub exit_code: Option<i32>,
    /// Node 0's report.json.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<Box<Report>>,
    /// Node 0's report sent ahead in [`ReportChunk`]s (then `report` is None here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report_chunks: Option<ChunkedReport>,
    /// The launcher's last error line, or why the agent could not run the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
