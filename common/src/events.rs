//! A check run's state transitions (`events.jsonl`): every transition is an event with a
//! timestamp.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The states of one `gpusanity check` run as its `events.jsonl` records them: the checks, their
/// verdict or the skip, then the job's command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckState {
    /// Checks are running (or a KeepJobHang overrun waits for a person).
    Checking,
    CheckPassed,
    CheckFailed,
    /// The timing policy decided that this start needs no check.
    CheckSkipped,
    /// The job's COMMAND was started.
    Running,
}

/// One line of `events.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateEvent {
    pub state: CheckState,
    pub at: DateTime<Utc>,
    /// Why: the verdict's summary, the skip reason, the command started...
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl StateEvent {
    pub fn now(state: CheckState, detail: impl Into<String>) -> Self {
        StateEvent { state, at: Utc::now(), detail: detail.into() }
    }
}
