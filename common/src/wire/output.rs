//! Output events, published by the service on the output topic for the platform and the ops
//! workflow. Every event has a unique `event_id`: a consumer that sees an id twice drops it.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::kinds::DeviceKind;
use crate::registry::CheckId;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputEvent {
    pub version: u32,
    pub event_id: String,
    pub job_id: String,
    pub workspace_id: String,
    /// The check run; absent for decisions that started none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    /// The job event that caused this output.
    pub cause_event_id: String,
    pub at: DateTime<Utc>,
    #[serde(flatten)]
    pub body: OutputBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum OutputBody {
    /// A run started: the job is in `Checking`.
    SanityCheckStarted { attempt: u32, nodes: Vec<String>, checks: Vec<CheckId> },
    /// Every check passed: the platform may start the job.
    CheckPassed {
        summary: String,
        report_url: String,
        /// The backend the checks ran on, from node 0's report (absent without one): `cpu` on a
        /// GPU job means an agent started with `--device cpu` checked it, not the job's GPUs.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        backend: Option<DeviceKind>,
        /// The nodes whose check passed (an isolation backend returns them to service if it
        /// isolated them); empty when a person passed a held run. Absent in events of older
        /// versions, read as empty.
        #[serde(default)]
        passed_nodes: Vec<String>,
    },
    /// A problem was found, a deadline overran under MarkJobFail, or a person failed a held run.
    CheckFailed {
        summary: String,
        faulty_nodes: Vec<String>,
        report_url: String,
        reason: FailReason,
        /// As in CheckPassed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        backend: Option<DeviceKind>,
    },
    /// No check for this start, and why (timing policy, EnableSanityCheck off, out of scope).
    CheckSkipped { reason: String },
    /// A run was cancelled because its job stopped.
    CheckCancelled { reason: String },
    /// A node with a critical finding, for the ops workflow to take out of service.
    NodeIsolated {
        node: String,
        /// The codes of the node's critical findings; a code this version does not know is
        /// refused when the event is read.
        codes: Vec<crate::findings::Code>,
        reason: String,
        /// Why the service isolated the node now (definitive failure, quarantine, a re-check
        /// that reproduced it). Absent in events of older versions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        decision: Option<IsolationDecision>,
        /// The job's GPUs on the node, where its event named them (`gpu_ids`): the GPUs the
        /// check ran on and found the problem on. Absent: the whole node was checked.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gpus: Vec<crate::wire::gpu_id::GpuId>,
    },
    /// While the job runs, its GPUs' telemetry makes the service suspect a node (docs/watch.md):
    /// one event per job start, node and code. Nothing is isolated on it alone.
    NodeSuspected {
        node: String,
        /// The GPU (its UUID) the evidence is about.
        gpu: String,
        code: crate::wire::watch::SuspectCode,
        /// What was seen, for people.
        evidence: String,
        /// The first sample that showed it.
        since: DateTime<Utc>,
    },
}

/// On what ground a node was isolated (docs/fleet.md, "Re-check and quarantine").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsolationBasis {
    /// A failure a re-check cannot take back (a wrong result, a fatal XID, a missing GPU, a
    /// crash, a lost agent): isolated at once.
    Definitive,
    /// The node failed `failures` of its last `window` runs: isolated without a re-check.
    Quarantine,
    /// A quick check of the node alone failed again.
    Reproduced,
    /// Re-checks are off (`[coordinator.recheck] enabled = false`), or a person failed the run.
    Immediate,
}

/// The decision behind a NodeIsolated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolationDecision {
    pub basis: IsolationBasis,
    /// The run whose failure started it (for a re-check: the run re-checked).
    pub failed_run: String,
    /// The re-check run, when one was made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recheck_run: Option<String>,
    /// The node's failed runs among its last `window` runs, this one included.
    pub failures: u32,
    pub window: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailReason {
    /// A check found a problem (or a node had no live agent / lost it).
    CheckFailed,
    /// The whole run overran its max time, or a test its per-test timeout, under MarkJobFail.
    TimedOut,
    /// A person resolved a KeepJobHang hold as failed.
    ResolvedByOperator,
    /// The run could not be carried out (the data plane reported an error).
    Error,
}

impl OutputBody {
    pub fn type_name(&self) -> &'static str {
        match self {
            OutputBody::SanityCheckStarted { .. } => "SanityCheckStarted",
            OutputBody::CheckPassed { .. } => "CheckPassed",
            OutputBody::CheckFailed { .. } => "CheckFailed",
            OutputBody::CheckSkipped { .. } => "CheckSkipped",
            OutputBody::CheckCancelled { .. } => "CheckCancelled",
            OutputBody::NodeIsolated { .. } => "NodeIsolated",
            OutputBody::NodeSuspected { .. } => "NodeSuspected",
        }
    }
}
