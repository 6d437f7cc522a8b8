//! The job-event consumer: reads a batch, applies every event in one database transaction
//! (idempotent by event id; malformed ones become dead letters in the outbox), commits it, and
//! only then stores the batch's offsets for commit. A crash before the commit redelivers the
//! batch, and the event ids already stored make the redelivery a no-op.
//!
//! A poison event, one the database refuses ([`DbError::is_poison`]: a data exception, an
//! integrity violation), becomes a dead letter with the database's reason and consumption goes
//! on. While the database is away (an outage) nothing is dead-lettered or committed: the batch
//! is applied again after a backoff.

use std::sync::Arc;
use std::time::Duration;

pub use crate::dead_letter::dead_letter;
use anyhow::Result;
use gpusanity_bus::backoff::Backoff;
use gpusanity_bus::kafka::{self, KafkaConn, ReadErrors};
use gpusanity_bus::signals::SIGNALS;
use gpusanity_common::wire::job::{JobEvent, JobEventBody};
use gpusanity_common::wire::output::{OutputBody, OutputEvent};
use gpusanity_common::wire::{Topics, WIRE_VERSION};
use gpusanity_db::runs;
use gpusanity_db::DbError;
use gpusanity_db::{bulk, Db, Tx};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Message, OwnedMessage};
use thiserror::Error;
use tokio::sync::{mpsc, Notify};

use crate::validate::Reject;
use crate::Notice;

/// The most events applied in one transaction.
pub const BATCH: usize = 1000;
/// The most payload bytes read into one batch: the broker takes messages of up to a megabyte by
/// default, and a batch of large ones stops early.
pub const BATCH_BYTES: usize = 8 * 1024 * 1024;

/// Why applying events failed.
#[derive(Debug, Error)]
pub enum ApplyError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("encoding JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Another replica stored the same event meanwhile (a rebalance gave both the batch):
    /// this transaction is rolled back, and applying the batch again skips the event.
    #[error("job event {0} was stored by another replica meanwhile")]
    Raced(String),
}

impl ApplyError {
    /// The event's data is at fault (the database refused it): applying it again fails again.
    pub fn is_poison(&self) -> bool {
        match self {
            ApplyError::Db(e) => e.is_poison(),
            ApplyError::Json(_) => true,
            ApplyError::Raced(_) => false,
        }
    }
}

pub(crate) type Applied<T> = std::result::Result<T, ApplyError>;

pub struct Ingest {
    pub db: Db,
    pub topics: Topics,
    pub notices: mpsc::UnboundedSender<Notice>,
    /// Woken after every commit that queued output events.
    pub outbox_wake: Arc<Notify>,
    /// What a job's `--sanity-check-envs` may set.
    pub env_policy: gpusanity_common::envs::EnvPolicy,
    /// This replica: it owns the runs it stores (their lease starts with the transaction).
    pub owner: Owner,
    /// Check a restart the timing policy would skip when the watch suspected one of the job's
    /// nodes while it ran (`watch.policy = "check_at_restart"`, docs/watch.md).
    pub check_suspected_at_restart: bool,
}

/// The replica that stores runs, and how long its first lease on each lasts.
#[derive(Debug, Clone)]
pub struct Owner {
    pub id: String,
    pub lease: Duration,
}

/// A fresh output event about a job.
pub fn output_event(
    job_id: &str,
    workspace_id: &str,
    run_id: Option<&str>,
    cause: &str,
    body: OutputBody,
) -> OutputEvent {
    OutputEvent {
        version: WIRE_VERSION,
        event_id: uuid::Uuid::new_v4().to_string(),
        job_id: job_id.into(),
        workspace_id: workspace_id.into(),
        run_id: run_id.map(str::to_string),
        cause_event_id: cause.into(),
        at: chrono::Utc::now(),
        body,
    }
}

impl Ingest {
    /// Consumes `consumer` (subscribed to the job-events topic) until it fails.
    pub async fn run(&self, consumer: &StreamConsumer) -> Result<()> {
        // Consumer errors (a broker restarting...) are transient: librdkafka reconnects. They
        // are read on at once, never slept on (see `ReadErrors`).
        let mut errors = ReadErrors::new("job events");
        loop {
            let first = match consumer.recv().await {
                Ok(m) => m.detach(),
                Err(e) => {
                    errors.error(&e);
                    continue;
                }
            };
            errors.message();
            let mut bytes = message_bytes(&first);
            let mut batch = vec![first];
            while batch.len() < BATCH && bytes < BATCH_BYTES {
                match tokio::time::timeout(Duration::from_millis(1), consumer.recv()).await {
                    Ok(Ok(m)) => {
                        let m = m.detach();
                        bytes = bytes.saturating_add(message_bytes(&m));
                        batch.push(m);
                    }
                    Ok(Err(e)) => {
                        errors.error(&e);
                        break;
                    }
                    Err(_) => break,
                }
            }
            let notices = self.apply_until_done(&batch).await;
            for m in &batch {
                // Fails only when the partition was taken away meanwhile (a rebalance): its new
                // owner reads the batch again, and the stored event ids make that a no-op.
                if let Err(e) = consumer.store_offset(m.topic(), m.partition(), m.offset()) {
                    SIGNALS.kafka_error();
                    tracing::warn!(partition = m.partition(), offset = m.offset(), "storing a consumed offset: {e}");
                }
            }
            self.outbox_wake.notify_one();
            for n in notices {
                let _ = self.notices.send(n);
            }
        }
    }

    /// Applies a batch, again and again while the database is away (nothing is committed
    /// meanwhile, so a good event is never dead-lettered for an outage).
    async fn apply_until_done(&self, batch: &[OwnedMessage]) -> Vec<Notice> {
        let mut backoff = Backoff::default();
        loop {
            match self.apply_batch(batch).await {
                Ok(notices) => {
                    SIGNALS.db_ok();
                    return notices;
                }
                Err(e) => {
                    SIGNALS.db_error();
                    let wait = backoff.step();
                    tracing::warn!(events = batch.len(), "applying job events failed, retrying in {wait:?}: {e}");
                    tokio::time::sleep(wait).await;
                }
            }
        }
    }

    /// Applies a batch in one transaction; returns the notices for the coordinator. When the
    /// database refuses an event of the batch, the batch is rolled back and its events applied
    /// one transaction each, and the refused one becomes a dead letter with the reason.
    pub async fn apply_batch(&self, batch: &[OwnedMessage]) -> Applied<Vec<Notice>> {
        match self.apply_together(batch).await {
            Err(e) if e.is_poison() => {
                let mut notices = Vec::new();
                for m in batch {
                    match self.apply_together(std::slice::from_ref(m)).await {
                        Ok(n) => notices.extend(n),
                        Err(e) if e.is_poison() => {
                            let row = self.dead_letter_row(m, &format!("refused by the database: {e}"))?;
                            let mut tx = self.db.begin().await?;
                            bulk::enqueue(&mut tx, std::slice::from_ref(&row)).await?;
                            tx.commit().await.map_err(DbError::from)?;
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(notices)
            }
            r => r,
        }
    }

    /// Applies one well-formed event, one not stored before (the batch looked its id up in the
    /// same transaction). The outer error is the database's; the inner one rejects the event
    /// (dead letter).
    pub(crate) async fn apply(
        &self,
        tx: &mut Tx,
        ev: &JobEvent,
        raw: &[u8],
        notices: &mut Vec<Notice>,
    ) -> Applied<Result<(), Reject>> {
        let (kind, decision) = match &ev.body {
            JobEventBody::JobResourcesAllocated(a) => match self.allocated(tx, ev, a, notices).await? {
                Ok(d) => ("JobResourcesAllocated", d),
                Err(r) => return Ok(Err(r)),
            },
            JobEventBody::JobRestarted { attempt, reason, nodes } => {
                match self.restarted(tx, ev, *attempt, reason, nodes.as_deref(), notices).await? {
                    Ok(d) => ("JobRestarted", d),
                    Err(r) => return Ok(Err(r)),
                }
            }
            JobEventBody::JobStopped { reason } => ("JobStopped", self.stopped(tx, ev, reason, notices).await?),
        };
        if !runs::record_job_event(tx, &ev.event_id, &ev.job_id, kind, &String::from_utf8_lossy(raw), &decision).await?
        {
            return Err(ApplyError::Raced(ev.event_id.clone()));
        }
        Ok(Ok(()))
    }
}

/// The bytes a message holds (payload and key), for the batch's cap.
fn message_bytes(m: &OwnedMessage) -> usize {
    let payload = m.payload().map_or(0, <[u8]>::len);
    payload.saturating_add(m.key().map_or(0, <[u8]>::len))
}

/// Subscribes a group consumer to the job-events topic.
/// `instance`: this replica's id, its static membership of the group.
pub fn subscribe(conn: &KafkaConn, group: &str, instance: &str, topic: &str) -> Result<StreamConsumer> {
    let c = kafka::static_member(conn, group, instance)?;
    c.subscribe(&[topic])?;
    Ok(c)
}
