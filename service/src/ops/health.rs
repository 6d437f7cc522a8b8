//! Liveness and readiness. `/health` answers while the process does; `/ready` answers 200 only
//! when the database answers, the broker answers and the job-events consumer has partitions
//! assigned, else 503 with what is not ready. The broker side is watched by [`probe`], which
//! also measures the consumers' lag for the metrics.
//!
//! Readiness is per process: with several replicas later, a replica without partitions is
//! not ready (it takes no job events), which is what a load balancer in front of the HTTP API
//! should not care about and an alert on "no replica ready" should.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpusanity_bus::signals::SIGNALS;
use gpusanity_db::Db;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};

use super::metrics::METRICS;

/// What the probe last saw of the broker.
#[derive(Debug, Default)]
pub struct Health {
    broker_ok: AtomicBool,
    /// Partitions of the job-events topic assigned to this process.
    partitions: AtomicI64,
    broker_error: Mutex<Option<String>>,
}

/// How often the probe looks, and how long it waits for an answer.
const PROBE_EVERY: Duration = Duration::from_secs(1);
const PROBE_WAIT: Duration = Duration::from_secs(2);

impl Health {
    /// (ready, the JSON body of `/ready`).
    pub async fn ready(&self, db: &Db) -> (bool, Value) {
        let mut not_ready = Vec::new();
        let database = match tokio::time::timeout(PROBE_WAIT, db.ping()).await {
            Ok(Ok(())) => "ok".to_string(),
            Ok(Err(e)) => format!("unreachable: {e}"),
            Err(_) => format!("no answer within {PROBE_WAIT:?}"),
        };
        if database != "ok" {
            not_ready.push(format!("database: {database}"));
        }
        let broker = if self.broker_ok.load(Ordering::Relaxed) {
            "ok".to_string()
        } else {
            let why = self.broker_error.lock().ok().and_then(|e| e.clone()).unwrap_or_else(|| "not yet reached".into());
            format!("unreachable: {why}")
        };
        if broker != "ok" {
            not_ready.push(format!("kafka: {broker}"));
        }
        let partitions = self.partitions.load(Ordering::Relaxed);
        if partitions == 0 {
            not_ready.push("kafka: no partition of the job-events topic assigned".into());
        }
        let ready = not_ready.is_empty();
        METRICS.ready.set(i64::from(ready));
        let body = json!({
            "status": if ready { "ready" } else { "not ready" },
            "database": database,
            "kafka": broker,
            "partitions_assigned": partitions,
            "not_ready": not_ready,
        });
        (ready, body)
    }
}

/// Watches the broker through the consumers (each with its topic; the first is the
/// job-events consumer whose partitions make the process ready) until the process ends.
pub async fn probe(health: Arc<Health>, consumers: Vec<(Arc<StreamConsumer>, String)>) {
    loop {
        let h = health.clone();
        let cs = consumers.clone();
        let _ = tokio::task::spawn_blocking(move || look(&h, &cs)).await;
        tokio::time::sleep(PROBE_EVERY).await;
    }
}

fn look(health: &Health, consumers: &[(Arc<StreamConsumer>, String)]) {
    let Some((first, topic)) = consumers.first() else { return };
    match first.fetch_metadata(Some(topic), PROBE_WAIT) {
        Ok(_) => {
            health.broker_ok.store(true, Ordering::Relaxed);
        }
        Err(e) => {
            if health.broker_ok.swap(false, Ordering::Relaxed) {
                tracing::warn!("Kafka does not answer: {e}; not ready until it does");
            }
            SIGNALS.kafka_error();
            if let Ok(mut last) = health.broker_error.lock() {
                *last = Some(e.to_string());
            }
            return;
        }
    }
    for (i, (c, topic)) in consumers.iter().enumerate() {
        let assigned = match c.assignment() {
            Ok(tpl) => tpl,
            Err(_) => TopicPartitionList::new(),
        };
        let n = i64::try_from(assigned.count()).unwrap_or(i64::MAX);
        if i == 0 {
            health.partitions.store(n, Ordering::Relaxed);
        }
        METRICS.partitions_assigned.with_label_values(&[topic]).set(n);
        lag(c, &assigned);
    }
}

/// The lag of every assigned partition: high watermark minus the committed offset (or minus
/// the low watermark when nothing is committed yet).
fn lag(c: &StreamConsumer, assigned: &TopicPartitionList) {
    let Ok(committed) = c.committed_offsets(assigned.clone(), PROBE_WAIT) else { return };
    for e in committed.elements() {
        let Ok((low, high)) = c.fetch_watermarks(e.topic(), e.partition(), PROBE_WAIT) else { continue };
        let done = match e.offset() {
            Offset::Offset(o) => o,
            _ => low,
        };
        let lag = high.checked_sub(done).unwrap_or(0).max(0);
        METRICS.consumer_lag.with_label_values(&[e.topic(), &e.partition().to_string()]).set(lag);
    }
}
