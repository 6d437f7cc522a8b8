//! The publisher's recovery: unsent rows already on their topic (sent before a crash, or by a
//! send whose acknowledgement was lost) are marked sent, so they are not sent twice.
//!
//! Bounded: each topic with unsent rows is read from the first message that can be one of them
//! (found by time: a message is produced after its row was stored, so nothing older than the
//! oldest unsent row, less a margin for clocks, is read), at most [`RECOVERY_WINDOW`] messages
//! back per partition; the ids found are marked in chunks as the reading goes, and the unsent
//! rows are never all loaded. There is no overall time limit: a read that makes no progress
//! for [`STALL`] fails and is retried with a backoff.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use gpusanity_bus::kafka;

use super::Publisher;

/// How far back recovery reads each partition at most.
const RECOVERY_WINDOW: i64 = 100_000;

/// How much older than its row a message may be stamped (clocks of different hosts).
const CLOCK_MARGIN_MS: i64 = 60_000;

/// A read of the topic that gets no message this long is given up (and retried by the caller).
const STALL: Duration = Duration::from_secs(30);

/// Ids found are marked sent in chunks of this many.
const CHUNK: usize = 500;

impl Publisher {
    /// Marks as sent the unsent outbox rows already on their topic; the number marked.
    pub async fn recover(&self) -> Result<u64> {
        let topics = self.db.unsent_topics().await?;
        if topics.is_empty() {
            return Ok(0);
        }
        let conn = self.kafka.clone();
        let (tx, mut rx) = mpsc::channel::<Vec<String>>(4);
        let reader = tokio::task::spawn_blocking(move || -> Result<()> {
            for (topic, since) in topics {
                read_event_ids(&conn, &topic, since.saturating_sub(CLOCK_MARGIN_MS), &tx)
                    .with_context(|| format!("reading back {topic}"))?;
            }
            Ok(())
        });
        let mut n = 0u64;
        while let Some(chunk) = rx.recv().await {
            n = n.saturating_add(self.db.mark_sent_by_event_ids(&chunk).await?);
        }
        reader.await??;
        if n > 0 {
            tracing::warn!("{n} output event(s) were sent before a crash but not marked: marked now, not sent again");
        }
        Ok(n)
    }
}

/// Sends the `event_id` headers of `topic`'s messages stamped from `since_ms` on, in chunks.
fn read_event_ids(conn: &kafka::KafkaConn, topic: &str, since_ms: i64, out: &mpsc::Sender<Vec<String>>) -> Result<()> {
    let c: BaseConsumer = kafka::reader(conn)?;
    let ends = kafka::partition_ends(c.client(), topic)?;
    let mut times = TopicPartitionList::new();
    for (p, _) in &ends {
        times.add_partition_offset(topic, *p, Offset::Offset(since_ms))?;
    }
    let starts = c.offsets_for_times(times, Duration::from_secs(10))?;
    let mut tpl = TopicPartitionList::new();
    let mut left: Vec<(i32, i64)> = Vec::new();
    for (p, high) in ends {
        let (low, _) = c.fetch_watermarks(topic, p, Duration::from_secs(10))?;
        let by_time = match starts.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => o,
            // No message that recent in this partition.
            Some(Offset::End) => continue,
            _ => low,
        };
        let start = by_time.max(low).max(high.saturating_sub(RECOVERY_WINDOW));
        if high > start {
            tpl.add_partition_offset(topic, p, Offset::Offset(start))?;
            left.push((p, high));
        }
    }
    if left.is_empty() {
        return Ok(());
    }
    c.assign(&tpl)?;
    let mut found = Vec::new();
    let mut last = Instant::now();
    while !left.is_empty() {
        if last.elapsed() > STALL {
            anyhow::bail!("no message for {STALL:?} with {} partition(s) still to read", left.len());
        }
        let Some(m) = c.poll(Duration::from_millis(200)) else { continue };
        let m = m?;
        last = Instant::now();
        if let Some(h) = m.headers() {
            let id = h.iter().find(|hd| hd.key == "event_id").and_then(|hd| hd.value);
            if let Some(id) = id.and_then(|v| std::str::from_utf8(v).ok()) {
                found.push(id.to_string());
            }
        }
        if found.len() >= CHUNK {
            out.blocking_send(std::mem::take(&mut found)).context("the recovery was dropped")?;
        }
        left.retain(|(p, high)| !(*p == m.partition() && m.offset() + 1 >= *high));
    }
    if !found.is_empty() {
        out.blocking_send(found).context("the recovery was dropped")?;
    }
    Ok(())
}
