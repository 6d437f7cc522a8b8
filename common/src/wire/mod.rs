//! Every wire format of the service, versioned: job lifecycle events in ([`job`]), output events
//! out ([`output`]), the agent protocol between the coordinator and the agents ([`agent`]) and
//! between an agent and its launcher ([`launcher`]).
//! Each message carries `version` ([`WIRE_VERSION`]); docs/events.md shows JSON examples.

pub mod agent;
pub mod gpu_id;
pub mod job;
pub mod launcher;
pub mod output;

/// The version of every message this build writes and the only one it accepts.
pub const WIRE_VERSION: u32 = 1;

/// Topic names; every one is configurable.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Topics {
    /// Job lifecycle events in (JobResourcesAllocated, JobRestarted, JobStopped).
    pub job_events: String,
    /// Output events (SanityCheckStarted, CheckPassed, CheckFailed, CheckSkipped, NodeIsolated...).
    pub output: String,
    /// Malformed job events, with the reason.
    pub dead_letter: String,
    /// Coordinator to agents: tasks and cancellations.
    pub agent_tasks: String,
    /// Agents to coordinator: heartbeats, progress, results.
    pub agent_reports: String,
}

impl Default for Topics {
    fn default() -> Self {
        Topics {
            job_events: "gpusanity.job-events".into(),
            output: "gpusanity.check-events".into(),
            dead_letter: "gpusanity.job-events.dead-letter".into(),
            agent_tasks: "gpusanity.agent-tasks".into(),
            agent_reports: "gpusanity.agent-reports".into(),
        }
    }
}

impl Topics {
    pub fn all(&self) -> [&str; 5] {
        [&self.job_events, &self.output, &self.dead_letter, &self.agent_tasks, &self.agent_reports]
    }
}
