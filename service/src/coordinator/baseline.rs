//! The fleet's baselines as node 0 of the service's runs judges with them (docs/fleet.md,
//! "Judging the service's own runs"): exported from the database as `gpusanity baseline export`
//! writes them, every `[coordinator.fleet] refresh_s`, and put into node 0's task. The agent
//! writes the file and passes `--baseline` to its launcher, so a run through the service is
//! judged exactly as `gpusanity check --baseline FILE` judges one by hand.
//!
//! The export runs in a task of its own, never in the coordinator's loop: at fleet scale it
//! reads every key's window, and a slow database must not hold up the agents' reports. A failed
//! export (the database away) keeps the last one; without any, runs are judged against the
//! static floor and their peers alone, as they always are in addition.

use std::sync::Arc;
use std::time::Duration;

use gpusanity_common::fleet::file::BaselineFile;
use gpusanity_common::fleet::Policy;
use gpusanity_db::Db;
use tokio::sync::watch;

use super::config::FleetJudging;

/// The latest export: None while judging is off or the fleet has no key with enough samples.
pub(super) type Latest = watch::Receiver<Option<Arc<BaselineFile>>>;

/// The longest one export may take before it is given up until the next round.
const EXPORT_WAIT: Duration = Duration::from_secs(30);

/// Starts exporting every `refresh_s` when judging is on; the task ends with the receiver.
pub(super) fn spawn(db: Db, config: &FleetJudging) -> Latest {
    let (tx, rx) = watch::channel(None);
    if !config.judge {
        return rx;
    }
    let every = Duration::from_secs_f64(config.refresh_s);
    tokio::spawn(async move {
        let mut entries = 0;
        while !tx.is_closed() {
            match tokio::time::timeout(EXPORT_WAIT, crate::fleet::export(&db, Policy::default())).await {
                Ok(Ok(file)) => {
                    let n = file.entries.len();
                    if n > 0 && n != entries {
                        tracing::info!(entries = n, "the fleet's baselines judge node 0 of every new run");
                    }
                    entries = n;
                    tx.send_replace((n > 0).then(|| Arc::new(file)));
                }
                Ok(Err(e)) => tracing::warn!("exporting the fleet's baselines: {e}; keeping the last export"),
                Err(_) => {
                    tracing::warn!("exporting the fleet's baselines took over {EXPORT_WAIT:?}; keeping the last export")
                }
            }
            tokio::time::sleep(every).await;
        }
    });
    rx
}
