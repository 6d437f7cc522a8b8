//! The fleet's baselines as node 0 of the service's runs judges with them (docs/fleet.md,
//! "Judging the service's own runs"): exported from the database as `gpusanity baseline export`
//! writes them, at most every `[coordinator.fleet] refresh_s`, and put into node 0's task. The
//! agent writes the file and passes `--baseline` to its launcher, so a run through the service
//! is judged exactly as `gpusanity check --baseline FILE` judges one by hand.
//!
//! A failed export (the database away) keeps the last one: judging goes on against a baseline
//! a minute older rather than stopping; without any, runs are judged against the static floor
//! alone, as they always are in addition.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gpusanity_common::fleet::file::BaselineFile;
use gpusanity_common::fleet::Policy;
use gpusanity_db::Db;

use super::config::FleetJudging;

/// The longest an export may take before the tick goes on without it.
const EXPORT_WAIT: Duration = Duration::from_secs(5);

/// The last export, and when it was tried.
#[derive(Debug, Default)]
pub(super) struct Baselines {
    /// None: judging is off, or the fleet has no key with enough samples yet.
    pub file: Option<Arc<BaselineFile>>,
    tried: Option<Instant>,
}

impl Baselines {
    /// Exports the baselines again when `refresh_s` has passed since the last try.
    pub async fn refresh(&mut self, db: &Db, config: &FleetJudging) {
        if !config.judge {
            self.file = None;
            return;
        }
        let every = Duration::from_secs_f64(config.refresh_s);
        if self.tried.is_some_and(|t| t.elapsed() < every) {
            return;
        }
        self.tried = Some(Instant::now());
        match tokio::time::timeout(EXPORT_WAIT, crate::fleet::export(db, Policy::default())).await {
            Ok(Ok(file)) => {
                let n = file.entries.len();
                if n > 0 && self.file.as_ref().map(|f| f.entries.len()) != Some(n) {
                    tracing::info!(entries = n, "the fleet's baselines judge node 0 of every new run");
                }
                self.file = (n > 0).then(|| Arc::new(file));
            }
            Ok(Err(e)) => tracing::warn!("exporting the fleet's baselines: {e}; keeping the last export"),
            Err(_) => {
                tracing::warn!("exporting the fleet's baselines took over {EXPORT_WAIT:?}; keeping the last export")
            }
        }
    }
}
