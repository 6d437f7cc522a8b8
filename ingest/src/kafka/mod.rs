//! Kafka clients with the settings every part of the service shares, on the connection
//! ([`KafkaConn`]: bootstrap servers, TLS and SASL properties) every part shares.

mod conn;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::producer::{DeliveryResult, FutureProducer, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

pub use conn::{KafkaConn, PropertyError, OWNED};
pub use rdkafka::error::KafkaError;

fn base(conn: &KafkaConn) -> ClientConfig {
    let mut c = conn.client_config();
    c.set("log_level", "3");
    c
}

/// An idempotent producer (no duplicates or reordering from its own retries), tuned for latency.
pub fn producer(conn: &KafkaConn) -> Result<FutureProducer, KafkaError> {
    base(conn)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "1")
        // Reports (JSON with per-size sweeps) compress about tenfold.
        .set("compression.type", "lz4")
        .set("message.timeout.ms", "30000")
        .set("message.max.bytes", "8000000")
        .create()
}

/// A consumer in `group` whose offsets are committed only for messages the caller has stored
/// (`store_offset`), so nothing is committed before it is handled.
pub fn group_consumer(conn: &KafkaConn, group: &str) -> Result<StreamConsumer, KafkaError> {
    base(conn)
        .set("group.id", group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "200")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.wait.max.ms", "10")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .set("fetch.message.max.bytes", "8000000")
        .create()
}

/// A consumer that reads every partition of `topic` from its end as of now, without a group
/// (an agent only cares about tasks sent after it started).
pub fn tail_consumer(conn: &KafkaConn, topic: &str) -> Result<StreamConsumer, KafkaError> {
    let c: StreamConsumer = base(conn)
        .set("group.id", format!("gpusanity-tail-{}", uuid::Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "10")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for (p, high) in partition_ends(c.client(), topic)? {
        tpl.add_partition_offset(topic, p, Offset::Offset(high))?;
    }
    c.assign(&tpl)?;
    Ok(c)
}

/// (partition, high watermark) of every partition of `topic`.
pub fn partition_ends<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
) -> Result<Vec<(i32, i64)>, KafkaError> {
    let md = client.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut out = Vec::new();
    for t in md.topics() {
        for p in t.partitions() {
            let (_, high) = client.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
            out.push((p.id(), high));
        }
    }
    Ok(out)
}

/// A plain consumer for reading a topic back (the publisher's recovery after a crash).
pub fn reader(conn: &KafkaConn) -> Result<BaseConsumer, KafkaError> {
    base(conn)
        .set("group.id", format!("gpusanity-reader-{}", uuid::Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .create()
}

/// Why the topics could not be made sure of.
#[derive(Debug, thiserror::Error)]
pub enum TopicsError {
    #[error("Kafka at {0} did not answer within {1} s (is the broker running? check the bootstrap address{2})")]
    Unreachable(String, u64, String),
    #[error("Kafka at {0} refused the client: {1} (check kafka.properties and the SASL password)")]
    Refused(String, String),
    #[error("creating topic {0}: {1}")]
    Create(String, RDKafkaErrorCode),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// How long start-up waits for the broker.
const REACH_TIMEOUT: Duration = Duration::from_secs(20);

/// The client's errors while start-up waits: an authentication or TLS failure ends the wait at
/// once; the last error of any kind explains a broker that never answered.
#[derive(Default)]
struct Watch {
    last: Mutex<Option<String>>,
    refused: Mutex<Option<String>>,
    wake: tokio::sync::Notify,
}

struct WatchContext(Arc<Watch>);

impl ClientContext for WatchContext {
    // What goes wrong while waiting is told by the one error `ensure_topics` returns.
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        tracing::debug!("librdkafka: {fac}: {message}");
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!("librdkafka: {error}: {reason}");
        let code = error.rdkafka_error_code();
        if let Ok(mut last) = self.0.last.lock() {
            *last = Some(reason.to_string());
        }
        if matches!(
            code,
            Some(RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed | RDKafkaErrorCode::SSL)
        ) {
            if let Ok(mut refused) = self.0.refused.lock() {
                refused.get_or_insert_with(|| reason.to_string());
            }
            self.0.wake.notify_one();
        }
    }
}

impl ProducerContext for WatchContext {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &DeliveryResult<'_>, _: ()) {}
}

impl Watch {
    fn refused(&self, conn: &KafkaConn) -> Option<TopicsError> {
        let reason = self.refused.lock().ok()?.clone()?;
        Some(TopicsError::Refused(conn.bootstrap().into(), reason))
    }

    fn unreachable(&self, conn: &KafkaConn) -> TopicsError {
        let last = self.last.lock().ok().and_then(|l| l.clone()).map(|l| format!("; last error: {l}"));
        TopicsError::Unreachable(conn.bootstrap().into(), REACH_TIMEOUT.as_secs(), last.unwrap_or_default())
    }
}

/// Creates the topics that are missing (one partition each unless they exist already); the
/// broker must answer within 20 s, and take the client (TLS, SASL) at once.
pub async fn ensure_topics(conn: &KafkaConn, topics: &[&str]) -> Result<(), TopicsError> {
    let watch = Arc::new(Watch::default());
    let admin: AdminClient<WatchContext> = base(conn).create_with_context(WatchContext(watch.clone()))?;
    // The admin client's errors are never polled; a producer that sends nothing connects too,
    // and its own thread hands its errors (TLS, SASL) to the watch.
    let _probe: ThreadedProducer<WatchContext> = base(conn).create_with_context(WatchContext(watch.clone()))?;
    let new: Vec<NewTopic> = topics.iter().map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1))).collect();
    let opts =
        AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))).request_timeout(Some(REACH_TIMEOUT));
    let results = tokio::select! {
        r = tokio::time::timeout(REACH_TIMEOUT, admin.create_topics(&new, &opts)) => r,
        _ = watch.wake.notified() => {
            return Err(watch.refused(conn).unwrap_or_else(|| watch.unreachable(conn)))
        }
    };
    let results = match results {
        Err(_) | Ok(Err(KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut))) => {
            return Err(watch.refused(conn).unwrap_or_else(|| watch.unreachable(conn)))
        }
        Ok(r) => r?,
    };
    for res in results {
        match res {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => return Err(TopicsError::Create(t, code)),
        }
    }
    Ok(())
}
