//! The outbox publisher: sends output events (and dead letters) in the order they were stored,
//! then marks them sent.
//!
//! Guarantee (docs/service.md): an event is stored in the same transaction as the state change
//! that causes it, so it is never lost; the producer is idempotent, so its own retries add no
//! duplicates; and a crash between Kafka's acknowledgement and the `sent` mark is repaired at
//! start-up by [`Publisher::recover`], which reads the topics' tails back and marks as sent
//! every unsent event whose id is already there, so it is not sent twice.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use gpusanity_db::Db;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::Notify;

use gpusanity_ingest::kafka;

/// How far back [`Publisher::recover`] reads each partition.
const RECOVERY_WINDOW: i64 = 100_000;

pub struct Publisher {
    pub db: Db,
    pub producer: FutureProducer,
    pub kafka: kafka::KafkaConn,
    pub wake: Arc<Notify>,
}

impl Publisher {
    /// Marks as sent the unsent outbox rows already on their topic (a crash after the send).
    pub async fn recover(&self) -> Result<u64> {
        let unsent = self.db.unsent(i64::MAX).await?;
        if unsent.is_empty() {
            return Ok(0);
        }
        let topics: BTreeSet<String> = unsent.iter().map(|r| r.topic.clone()).collect();
        let wanted: HashSet<String> = unsent.iter().map(|r| r.event_id.clone()).collect();
        let conn = self.kafka.clone();
        let found = tokio::task::spawn_blocking(move || -> Result<Vec<String>> {
            let mut found = Vec::new();
            for t in topics {
                found.extend(read_event_ids(&conn, &t, &wanted)?);
            }
            Ok(found)
        })
        .await??;
        let n = self.db.mark_sent_by_event_ids(&found).await?;
        if n > 0 {
            tracing::warn!("{n} output event(s) were sent before a crash but not marked: marked now, not sent again");
        }
        Ok(n)
    }

    /// Sends until the process ends; Kafka errors (a broker down) are retried with backoff,
    /// database errors end it.
    pub async fn run(&self) -> Result<()> {
        loop {
            let rows = self.db.unsent(2000).await?;
            if rows.is_empty() {
                // Woken by every commit that queues events; the timeout is a safety net.
                let _ = tokio::time::timeout(Duration::from_millis(500), self.wake.notified()).await;
                continue;
            }
            // Enqueue all, then await the acknowledgements in order.
            let mut pending = Vec::with_capacity(rows.len());
            for r in &rows {
                let rec = FutureRecord::to(&r.topic).key(&r.key).payload(&r.payload).headers(
                    OwnedHeaders::new().insert(Header { key: "event_id", value: Some(r.event_id.as_bytes()) }),
                );
                match self.producer.send_result(rec) {
                    Ok(f) => pending.push(f),
                    Err((e, _)) => {
                        tracing::warn!(topic = r.topic, "queueing an output event failed, will retry: {e}");
                        break;
                    }
                }
            }
            let mut sent = Vec::new();
            for (r, f) in rows.iter().zip(pending) {
                match f.await {
                    Ok(Ok(_)) => sent.push(r.id),
                    Ok(Err((e, _))) => {
                        tracing::warn!(topic = r.topic, "sending an output event failed, will retry: {e}");
                        break;
                    }
                    Err(_) => break,
                }
            }
            let failed = sent.len() < rows.len();
            self.db.mark_sent(&sent).await.context("marking output events sent")?;
            if failed {
                tokio::time::sleep(Duration::from_millis(500)).await;
                // Some of the failed batch may have reached the topic after all: find out
                // before sending again (a broker still down is waited out, not died of).
                let mut backoff = gpusanity_ingest::retry::Backoff::default();
                while let Err(e) = self.recover().await {
                    let wait = backoff.wait().await;
                    tracing::warn!("reading back the output topics failed, retried after {wait:?}: {e:#}");
                }
            }
        }
    }
}

/// The ids among `wanted` found in the `event_id` header of the last messages of `topic`.
fn read_event_ids(conn: &kafka::KafkaConn, topic: &str, wanted: &HashSet<String>) -> Result<Vec<String>> {
    let c: BaseConsumer = kafka::reader(conn)?;
    let mut tpl = TopicPartitionList::new();
    let mut left = HashSet::new();
    for (p, high) in kafka::partition_ends(c.client(), topic)? {
        let (low, _) = c.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        if high > low {
            tpl.add_partition_offset(topic, p, Offset::Offset(low.max(high - RECOVERY_WINDOW)))?;
            left.insert((p, high));
        }
    }
    if left.is_empty() {
        return Ok(Vec::new());
    }
    c.assign(&tpl)?;
    let mut found = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !left.is_empty() {
        if std::time::Instant::now() > deadline {
            anyhow::bail!("reading back {topic} to recover the outbox took over 60 s");
        }
        let Some(m) = c.poll(Duration::from_millis(200)) else { continue };
        let m = m?;
        if let Some(h) = m.headers() {
            for i in 0..h.count() {
                let hd = h.get(i);
                if hd.key == "event_id" {
                    if let Some(id) = hd.value.and_then(|v| std::str::from_utf8(v).ok()) {
                        if wanted.contains(id) {
                            found.push(id.to_string());
                        }
                    }
                }
            }
        }
        let done: Vec<(i32, i64)> =
            left.iter().copied().filter(|(p, high)| *p == m.partition() && m.offset() + 1 >= *high).collect();
        for d in done {
            left.remove(&d);
        }
    }
    Ok(found)
}
