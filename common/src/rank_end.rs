//! How a rank that did not finish a check ended, as its launcher saw it ([`RankEnd`]): the
//! facts the crash and hang attribution decide on, typed, so that no decision reads a note.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The launcher's account of a rank that did not finish a check (absent in reports written
/// before it existed, which carried these facts as notes and metrics).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RankEnd {
    /// How the worker process ended (`exited with status 1`, `killed by signal SIGKILL`),
    /// when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit: Option<String>,
    /// When it ended (Unix ms): the first to die is the culprit, later deaths its consequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_unix_ms: Option<u64>,
    /// Why it was stopped by the run (another rank failed, a signal): it is not at fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    /// Its node never reported: nothing is known of the rank itself.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub node_lost: bool,
    /// The last progress it reported (`check phase step`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress: Option<String>,
    /// Seconds since its last heartbeat when the run stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_age_s: Option<f64>,
    /// How many progress reports it made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress_seq: Option<u64>,
}

impl RankEnd {
    /// The account as text for people, by the names the report shows it under.
    pub fn notes(&self) -> BTreeMap<String, String> {
        let mut n = BTreeMap::new();
        let mut put = |k: &str, v: Option<String>| {
            if let Some(v) = v {
                n.insert(k.to_string(), v);
            }
        };
        put("exit", self.exit.clone());
        put("stopped", self.stopped.clone());
        put("node_lost", self.node_lost.then(|| "its node never reported".to_string()));
        put("last_progress", self.last_progress.clone());
        put("heartbeat_age_s", self.heartbeat_age_s.map(|s| format!("{s:.1}")));
        n
    }
}
