//! Stores the judgement's suspicions, each with its NodeSuspected in one transaction, on a task
//! of its own: the judgement names each (node, code) of a run once, so a suspicion the database
//! cannot store now is kept and stored once it answers again (an outage loses none), and a
//! database that does not answer holds up neither the judgement nor the agents' renewals.

use std::sync::Arc;

use gpusanity_bus::backoff::Backoff;
use gpusanity_common::wire::output::{OutputBody, OutputEvent};
use gpusanity_db::Db;
use tokio::sync::{mpsc, Notify};

use crate::ops::metrics::METRICS;

/// The most suspicions waiting for the database: one per (node, code) of each watched run, so
/// more means a database down for very long; a suspicion beyond them is dropped, said.
const MAX_WAITING: usize = 4096;
/// The times in a row a database that answers may refuse one suspicion before it is dropped
/// (with the waits between attempts, about 20 s).
const MAX_REFUSED: u32 = 10;

/// The judgement's end of the recorder task.
pub(super) struct Recorder {
    tx: mpsc::Sender<OutputEvent>,
}

impl Recorder {
    /// Starts the task, which ends once the returned end is dropped and it has stored what it
    /// was given.
    pub(super) fn spawn(db: &Db, topic: &str, outbox_wake: &Arc<Notify>) -> Recorder {
        let (tx, rx) = mpsc::channel(MAX_WAITING);
        tokio::spawn(run(db.clone(), topic.to_string(), outbox_wake.clone(), rx));
        Recorder { tx }
    }

    /// Queues `event` (a NodeSuspected) to be stored, in the order given.
    pub(super) fn record(&self, event: OutputEvent) {
        let (event, why) = match self.tx.try_send(event) {
            Ok(()) => return,
            Err(mpsc::error::TrySendError::Full(e)) => (e, "the most that may wait for the database are waiting"),
            Err(mpsc::error::TrySendError::Closed(e)) => (e, "the recorder ended"),
        };
        tracing::error!(job_id = event.job_id, event_id = event.event_id, "a suspicion dropped: {why}");
    }
}

async fn run(db: Db, topic: String, outbox_wake: Arc<Notify>, mut rx: mpsc::Receiver<OutputEvent>) {
    while let Some(event) = rx.recv().await {
        let (mut failed, mut answered) = (0u32, 0u32);
        let mut backoff = Backoff::default();
        loop {
            let e = match store(&db, &topic, &outbox_wake, &event).await {
                Ok(()) => break,
                Err(e) => e,
            };
            if failed == 0 {
                tracing::warn!(
                    job_id = event.job_id,
                    event_id = event.event_id,
                    "storing a suspicion: {e}; kept, and offered again"
                );
            }
            failed = failed.saturating_add(1);
            // A database that answers with an error may be busy (a lock, a serialization
            // failure) but may also refuse this statement for good: after a while the
            // suspicion is dropped rather than holding up every later one. One that cannot be
            // reached (an outage) is waited out.
            answered = if e.answered() { answered + 1 } else { 0 };
            if answered >= MAX_REFUSED {
                tracing::error!(
                    event_id = event.event_id,
                    "a suspicion dropped: the database refused it {answered} times in a row: {e}"
                );
                break;
            }
            backoff.wait().await;
        }
        if failed > 0 && answered < MAX_REFUSED {
            tracing::info!(event_id = event.event_id, "a suspicion kept through {failed} failure(s) is stored");
        }
    }
}

/// Stores one NodeSuspected with its row (once: storing the same event again does nothing),
/// says so, counts it and wakes the outbox's publisher.
async fn store(db: &Db, topic: &str, outbox_wake: &Notify, event: &OutputEvent) -> gpusanity_db::Result<()> {
    let OutputBody::NodeSuspected { node, gpu, code, evidence, .. } = &event.body else { return Ok(()) };
    if db.record_suspicion(event, topic).await? {
        tracing::warn!(job_id = event.job_id, node, gpu, code = %code, "node suspected: {evidence}");
        METRICS.suspected(*code);
        outbox_wake.notify_one();
    }
    Ok(())
}
