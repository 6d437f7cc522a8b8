//! Every wire format of the service, versioned: job lifecycle events in ([`job`]), output events
//! out ([`output`]), the agent protocol between the coordinator and the agents ([`agent`]) and
//! between an agent and its launcher ([`launcher`]), and the watch while a job runs ([`watch`]).
//! Each message carries `version` ([`WIRE_VERSION`]); docs/events.md shows JSON examples.

pub mod agent;
pub mod gpu_id;
pub mod job;
pub mod launcher;
pub mod output;
pub mod watch;

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
    /// Agents to the service's judgement: the GPUs' telemetry while a job runs (docs/watch.md).
    pub telemetry: String,
}

impl Default for Topics {
    fn default() -> Self {
        Topics {
            job_events: "gpusanity.job-events".into(),
            output: "gpusanity.check-events".into(),
            dead_letter: "gpusanity.job-events.dead-letter".into(),
            agent_tasks: "gpusanity.agent-tasks".into(),
            agent_reports: "gpusanity.agent-reports".into(),
            telemetry: "gpusanity.agent-telemetry".into(),
        }
    }
}

impl Topics {
    pub fn all(&self) -> [&str; 6] {
        [&self.job_events, &self.output, &self.dead_letter, &self.agent_tasks, &self.agent_reports, &self.telemetry]
    }
}
