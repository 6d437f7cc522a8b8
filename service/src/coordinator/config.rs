//! The coordinator's time limits, all in seconds (fractions allowed, so tests can be short).

use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    /// An agent not heard from for this long is lost; agents beat every second by default.
    pub agent_timeout_s: f64,
    /// How long a new run waits for every node's agent to be alive (and for node 0 to start).
    pub agent_wait_s: f64,
    /// Slack past `--sanity-check-max-time` before the service itself declares the overrun
    /// (the launchers enforce the limit first; this covers start-up and lost results).
    pub deadline_grace_s: f64,
    /// The report URL in CheckPassed/CheckFailed; `{run_id}` is replaced.
    pub report_url: String,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            agent_timeout_s: 10.0,
            agent_wait_s: 60.0,
            deadline_grace_s: 60.0,
            report_url: "http://127.0.0.1:8088/v1/runs/{run_id}/report".into(),
        }
    }
}

impl CoordinatorConfig {
    pub fn agent_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.agent_timeout_s)
    }
    pub fn agent_wait(&self) -> Duration {
        Duration::from_secs_f64(self.agent_wait_s)
    }
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("agent_timeout_s", self.agent_timeout_s),
            ("agent_wait_s", self.agent_wait_s),
            ("deadline_grace_s", self.deadline_grace_s),
        ] {
            if !(v.is_finite() && v > 0.0 && v < 7.0 * 86400.0) {
                return Err(format!("coordinator.{name} must be a positive number of seconds, got {v}"));
            }
        }
        Ok(())
    }
}
