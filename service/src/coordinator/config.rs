//! The coordinator's time limits, all in seconds (fractions allowed, so tests can be short).

use std::time::Duration;

use gpusanity_common::checks::WrongResult;
use gpusanity_common::report::Code;
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
    /// `[coordinator.recheck]`: re-check before isolation, quarantine (docs/fleet.md).
    pub recheck: RecheckConfig,
    /// `[coordinator.fleet]`: judging the service's own runs against the fleet's baselines.
    pub fleet: FleetJudging,
}

/// Whether node 0 of every run the service starts judges its figures against the baselines
/// the fleet learned (docs/fleet.md, "Judging the service's own runs"). Off by default: once
/// on, the fleet's window judges every run, so an operator turns it on when the fleet page
/// shows baselines learned from the devices they trust (and never for a fleet of CPU test
/// rigs, whose figures vary with whatever else the machine runs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FleetJudging {
    /// Off: runs are judged against the static expected figures and their peers only.
    pub judge: bool,
    /// How often the baselines are exported again from the database, in seconds.
    pub refresh_s: f64,
}

impl Default for FleetJudging {
    fn default() -> Self {
        FleetJudging { judge: false, refresh_s: 60.0 }
    }
}

/// When a failed run's node is isolated at once, re-checked first, or quarantined.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RecheckConfig {
    /// Off: every node with a critical finding in a failed run is isolated at once (as before).
    pub enabled: bool,
    /// Codes a re-check cannot take back: the node is isolated at once.
    pub definitive: Vec<Code>,
    /// Quarantine: a node that failed `quarantine_failures` of its last `quarantine_window`
    /// runs (this one included) is isolated without a re-check.
    pub quarantine_failures: u32,
    pub quarantine_window: u32,
    /// Arguments added to a re-check's (after the failed run's own, fault injection left out):
    /// e.g. a shorter `--sanity-check-max-time`.
    pub extra_args: String,
}

impl Default for RecheckConfig {
    fn default() -> Self {
        RecheckConfig {
            enabled: true,
            definitive: definitive_codes(),
            quarantine_failures: 3,
            quarantine_window: 5,
            extra_args: String::new(),
        }
    }
}

/// The default definitive codes: every check's wrong result (from its descriptor: silent
/// corruption does not come and go), and a crash or hang, a missing or unusable GPU, a fatal XID
/// or uncorrectable memory error, a lost agent (a re-check needs the very agent that is gone).
pub fn definitive_codes() -> Vec<Code> {
    let wrong = gpusanity_common::checks::all().filter_map(|d| match d.wrong_result {
        WrongResult::Code(c) => Some(c),
        WrongResult::Own => None,
    });
    let mut codes: Vec<Code> = wrong.chain(OTHER_DEFINITIVE).collect();
    codes.sort();
    codes.dedup();
    codes
}

/// The definitive codes that are no check's wrong result.
const OTHER_DEFINITIVE: [Code; 23] = [
    Code::WorkerCrashed,
    Code::TestHang,
    Code::NodeLost,
    Code::NodeMissing,
    Code::NodeGpuUnusable,
    Code::NodeNoGpu,
    Code::NodeGpusMissing,
    Code::GemmResultMismatch,
    Code::WrongResult,
    Code::ModelLossNotFinite,
    Code::ModelSilentDataCorruption,
    Code::GpuHealthMissingGpu,
    Code::GpuHealthXidFatal,
    Code::GpuHealthEccUncorrectable,
    Code::GpuHealthRowRemapFailed,
    Code::GpuHealthRecoveryAction,
    Code::GpuHealthNvlinkDown,
    Code::NoAgent,
    Code::AgentLost,
    Code::AgentNoStart,
    Code::RunUnfinished,
    Code::DataPlaneError,
    Code::SettingsUnreadable,
];

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            agent_timeout_s: 10.0,
            agent_wait_s: 60.0,
            deadline_grace_s: 60.0,
            report_url: "http://127.0.0.1:8088/v1/runs/{run_id}/report".into(),
            recheck: RecheckConfig::default(),
            fleet: FleetJudging::default(),
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
            ("fleet.refresh_s", self.fleet.refresh_s),
        ] {
            if !(v.is_finite() && v > 0.0 && v < 7.0 * 86400.0) {
                return Err(format!("coordinator.{name} must be a positive number of seconds, got {v}"));
            }
        }
        let r = &self.recheck;
        if r.quarantine_window == 0
            || r.quarantine_failures == 0
            || r.quarantine_window > 1000
            || r.quarantine_failures > r.quarantine_window
        {
            return Err(format!(
                "coordinator.recheck: quarantine_failures ({}) must be 1 to quarantine_window ({}), itself 1 to 1000",
                r.quarantine_failures, r.quarantine_window
            ));
        }
        if let Err(e) = gpusanity_common::Settings::from_args_str(&r.extra_args) {
            return Err(format!("coordinator.recheck.extra_args: {e}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_check_s_wrong_result_is_definitive_and_a_slow_figure_is_not() {
        let codes = definitive_codes();
        for d in gpusanity_common::checks::all() {
            if let WrongResult::Code(c) = d.wrong_result {
                assert!(codes.contains(&c), "{}: {c:?}", d.id);
            }
        }
        for c in [Code::ReducescatterWrongResult, Code::AlltoallWrongResult, Code::NoAgent, Code::GpuHealthXidFatal] {
            assert!(codes.contains(&c), "{c:?}");
        }
        assert!(!codes.contains(&Code::GemmSlow) && !codes.contains(&Code::AllreduceSlow));
        assert_eq!(codes.len(), 34, "{codes:?}");
    }
}
