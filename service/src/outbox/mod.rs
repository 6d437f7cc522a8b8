//! The outbox publisher: sends output events (and dead letters) in the order they were stored,
//! then marks them sent.
//!
//! Guarantee (docs/service.md): an event is stored in the same transaction as the state change
//! that causes it, so it is never lost; the producer is idempotent, so its own retries add no
//! duplicates; and a crash between Kafka's acknowledgement and the `sent` mark is repaired by
//! [`Publisher::recover`] (at start-up and after a failed send), which reads the topics' tails
//! back and marks as sent every unsent event whose id is already there, so it is not sent twice.
//!
//! Outages never end the publisher: a broker or a database away is waited out with the
//! ingest's [`Backoff`]. A message the broker refuses for good (too large, invalid) is tried
//! [`MAX_REFUSALS`] times, then marked failed with the broker's error, logged once and counted
//! (`gpusanity_outbox_refused_total`), so it does not hold back the rows after it.

pub mod lease;
mod recover;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use gpusanity_bus::backoff::Backoff;
use gpusanity_bus::kafka::{self, KafkaError};
use gpusanity_bus::signals::SIGNALS;
use gpusanity_db::{Db, DbError};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::Notify;

use crate::ops::metrics::METRICS;

/// Rows sent per round.
const BATCH: i64 = 2000;

/// Refusals of one row before it is marked failed.
pub const MAX_REFUSALS: i64 = 3;

pub struct Publisher {
    pub db: Db,
    pub producer: FutureProducer,
    pub kafka: kafka::KafkaConn,
    pub wake: Arc<Notify>,
    /// The lease that makes this replica the one that sends ([`lease`]).
    pub keeper: lease::Keeper,
}

/// How a round of sending went.
enum Round {
    /// Nothing to send.
    Idle,
    /// Every row was sent, or refused for good.
    Done,
    /// The broker did not take some rows (away, timed out): find out what reached it, then retry.
    Interrupted,
}

/// Why a round stopped.
#[derive(Debug, thiserror::Error)]
enum RoundError {
    #[error("the database: {0}")]
    Db(#[from] DbError),
}

/// The broker refuses this message for good: sending it again cannot succeed.
fn permanent(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
                | RDKafkaErrorCode::InvalidMessageSize
                | RDKafkaErrorCode::InvalidMessage
                | RDKafkaErrorCode::InvalidRecord
        )
    )
}

impl Publisher {
    /// Sends until the process ends; outages are waited out, never returned.
    pub async fn run(&self) -> Result<()> {
        let mut leading = false;
        let mut backoff = Backoff::default();
        loop {
            if !self.keeper.may_send() {
                // Another replica sends, or the lease is not renewed yet: look again soon.
                if leading && self.keeper.holds() {
                    tracing::warn!("the outbox publisher's lease is held but not renewed in time: sending paused");
                }
                leading = false;
                tokio::time::sleep(self.keeper.lease / 10).await;
                continue;
            }
            if !leading {
                // Newly the sender: what the last one sent may not be marked yet.
                self.recover_until_done().await;
                leading = true;
                continue;
            }
            match self.round().await {
                Ok(Round::Idle) => {
                    backoff = Backoff::default();
                    // Woken by every commit of this process that queues events and, on
                    // PostgreSQL, by those of the other replicas too (a notification:
                    // gpusanity_db::wake). The timeout is a safety net: a notification lost
                    // while its connection was down (50 ms on PostgreSQL, where other replicas
                    // commit rows; 500 ms on SQLite, one replica).
                    let idle = match self.db.backend {
                        gpusanity_db::DbBackend::Postgres => Duration::from_millis(50),
                        gpusanity_db::DbBackend::Sqlite => Duration::from_millis(500),
                    };
                    let _ = tokio::time::timeout(idle, self.wake.notified()).await;
                }
                Ok(Round::Done) => backoff = Backoff::default(),
                Ok(Round::Interrupted) => {
                    SIGNALS.kafka_error();
                    backoff.wait().await;
                    // Some of the batch may have reached the topic after all: find out before
                    // sending again.
                    self.recover_until_done().await;
                }
                Err(e) => {
                    SIGNALS.db_error();
                    let wait = backoff.wait().await;
                    tracing::warn!("outbox: {e}; retried after {wait:?}");
                    // Rows may have been sent and not marked (the database went away between
                    // the two): read the topics back before sending again.
                    leading = false;
                }
            }
        }
    }

    /// [`Publisher::recover`], again and again until it succeeds (a broker or a database away
    /// is waited out).
    async fn recover_until_done(&self) {
        let mut backoff = Backoff::default();
        while let Err(e) = self.recover().await {
            if e.chain().any(|c| c.is::<DbError>()) {
                SIGNALS.db_error();
            } else {
                SIGNALS.kafka_error();
            }
            let wait = backoff.wait().await;
            tracing::warn!("reading back the output topics failed, retried after {wait:?}: {e:#}");
        }
    }

    async fn round(&self) -> Result<Round, RoundError> {
        let rows = self.db.unsent(BATCH).await?;
        SIGNALS.db_ok();
        if rows.is_empty() {
            return Ok(Round::Idle);
        }
        // Enqueue all, then await the acknowledgements in order.
        let mut pending = Vec::with_capacity(rows.len());
        let mut refused: Vec<(i64, KafkaError)> = Vec::new();
        let mut interrupted = false;
        for r in &rows {
            let rec = FutureRecord::to(&r.topic)
                .key(&r.key)
                .payload(&r.payload)
                .headers(OwnedHeaders::new().insert(Header { key: "event_id", value: Some(r.event_id.as_bytes()) }));
            match self.producer.send_result(rec) {
                Ok(f) => pending.push((r, f)),
                Err((e, _)) if permanent(&e) => refused.push((r.id, e)),
                Err((e, _)) => {
                    tracing::warn!(topic = r.topic, "queueing an output event failed, will retry: {e}");
                    interrupted = true;
                    break;
                }
            }
        }
        let mut sent = Vec::new();
        for (r, f) in pending {
            match f.await {
                Ok(Ok(_)) => sent.push(r.id),
                Ok(Err((e, _))) if permanent(&e) => refused.push((r.id, e)),
                Ok(Err((e, _))) => {
                    tracing::warn!(topic = r.topic, "sending an output event failed, will retry: {e}");
                    interrupted = true;
                    break;
                }
                Err(_) => {
                    interrupted = true;
                    break;
                }
            }
        }
        self.db.mark_sent(&sent).await?;
        for (id, e) in refused {
            let row = rows.iter().find(|r| r.id == id);
            let (topic, event_id) = row.map(|r| (r.topic.as_str(), r.event_id.as_str())).unwrap_or_default();
            if self.db.outbox_refused(id, &e.to_string(), MAX_REFUSALS).await? {
                METRICS.outbox_refused.inc();
                tracing::error!(
                    topic,
                    event_id,
                    bytes = row.map(|r| r.payload.len()).unwrap_or(0),
                    "the broker refused an output event {MAX_REFUSALS} times ({e}): marked failed, not sent again"
                );
            }
        }
        Ok(if interrupted { Round::Interrupted } else { Round::Done })
    }
}
