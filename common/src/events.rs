//! Run state transitions: every transition is an event with a timestamp.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The states of a check run, as the brief names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunState {
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
    pub state: RunState,
    pub at: DateTime<Utc>,
    /// Why: the verdict's summary, the skip reason, the command started...
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

impl StateEvent {
    pub fn now(state: RunState, detail: impl Into<String>) -> Self {
        StateEvent { state, at: Utc::now(), detail: detail.into() }
    }
}
