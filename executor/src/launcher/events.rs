//! `events.jsonl`: every state transition with its timestamp, appended as it happens (node 0).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use gpusanity_common::events::{CheckState, StateEvent};

pub struct EventLog {
    path: Option<PathBuf>,
    pub events: Vec<StateEvent>,
}

impl EventLog {
    /// A log that writes to `dir/events.jsonl` (created afresh), or only keeps events in memory.
    pub fn new(dir: Option<&Path>) -> Result<EventLog> {
        let path = match dir {
            Some(d) => {
                std::fs::create_dir_all(d).with_context(|| format!("creating report directory {}", d.display()))?;
                let p = d.join("events.jsonl");
                std::fs::write(&p, b"").with_context(|| format!("writing {}", p.display()))?;
                Some(p)
            }
            None => None,
        };
        Ok(EventLog { path, events: Vec::new() })
    }

    pub fn push(&mut self, state: CheckState, detail: impl Into<String>) -> Result<()> {
        let ev = StateEvent::now(state, detail);
        tracing::info!(state = ?ev.state, "{}", ev.detail);
        if let Some(p) = &self.path {
            let mut f =
                std::fs::OpenOptions::new().append(true).open(p).with_context(|| format!("opening {}", p.display()))?;
            writeln!(f, "{}", serde_json::to_string(&ev)?)?;
        }
        self.events.push(ev);
        Ok(())
    }
}
