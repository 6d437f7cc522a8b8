//! Job lifecycle events, published by the platform on the job-events topic.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::gpu_id::GpuId;

/// One job lifecycle event: the envelope every type shares, then the type's own fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEvent {
    pub version: u32,
    /// Unique per event; a redelivered event (same id) is applied once.
    pub event_id: String,
    pub job_id: String,
    pub workspace_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occurred_at: Option<DateTime<Utc>>,
    #[serde(flatten)]
    pub body: JobEventBody,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum JobEventBody {
    /// The job got its nodes and is about to start (attempt 0) or start again.
    JobResourcesAllocated(Allocation),
    /// The job is being restarted.
    JobRestarted {
        attempt: u32,
        reason: RestartReason,
        /// A new set of nodes; absent: the nodes of the job's last allocation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nodes: Option<Vec<JobNode>>,
    },
    /// The job was stopped: a check run of it is cancelled.
    JobStopped {
        #[serde(default, skip_serializing_if = "String::is_empty")]
        reason: String,
    },
}

/// The type names [`JobEventBody`] accepts, for clear errors.
pub const JOB_EVENT_TYPES: [&str; 3] = ["JobResourcesAllocated", "JobRestarted", "JobStopped"];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    /// 0 on the job's first start.
    #[serde(default)]
    pub attempt: u32,
    /// The training framework, when the platform names it; only PyTorch jobs are checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub framework: Option<String>,
    pub nodes: Vec<JobNode>,
    pub settings: JobSettings,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobNode {
    /// The node's name; its agent runs with `gpusanity agent --node NAME`.
    pub name: String,
    pub address: String,
    pub gpus: u32,
    /// Which GPUs of the node are the job's, in the order its ranks use them, where the node is
    /// shared (UUIDs, PCI addresses or indices, one form per node; as many as `gpus`). Absent:
    /// the first `gpus` GPUs (a whole-node job).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_ids: Vec<GpuId>,
}

/// The job's own settings, as the platform spells them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSettings {
    #[serde(rename = "EnableSanityCheck", default = "yes")]
    pub enable_sanity_check: bool,
    #[serde(rename = "SanityCheckArgs", default)]
    pub sanity_check_args: String,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RestartReason {
    /// Restarted by the fault-tolerance machinery after a failure.
    FaultTolerant,
    /// Restarted by a person.
    Manual,
    /// Any other reason the platform names.
    #[serde(untagged)]
    Other(String),
}

/// A job event the service could not accept, on the dead-letter topic with the reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    pub version: u32,
    /// Unique per dead letter (derived from where the event was read, so a redelivery of the
    /// same message gets the same id).
    pub event_id: String,
    /// Why the event was rejected, in one line.
    pub reason: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// The event as it was read (lossy UTF-8); only its first bytes when it was larger than
    /// the dead letter's limit (`truncated`).
    pub payload: String,
    /// The payload was cut: `payload` holds its first bytes only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    /// The size of the event as it was read, in bytes.
    #[serde(default)]
    pub payload_size: u64,
    /// The SHA-256 of the event as it was read (hex), to match it against the producer's copy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub payload_sha256: String,
    pub at: DateTime<Utc>,
}
