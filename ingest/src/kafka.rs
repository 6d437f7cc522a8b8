//! Kafka clients with the settings every part of the service shares.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::producer::FutureProducer;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

pub use rdkafka::error::KafkaError;

fn base(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap).set("log_level", "3");
    c
}

/// An idempotent producer (no duplicates or reordering from its own retries), tuned for latency.
pub fn producer(bootstrap: &str) -> Result<FutureProducer, KafkaError> {
    base(bootstrap)
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
pub fn group_consumer(bootstrap: &str, group: &str) -> Result<StreamConsumer, KafkaError> {
    base(bootstrap)
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
pub fn tail_consumer(bootstrap: &str, topic: &str) -> Result<StreamConsumer, KafkaError> {
    let c: StreamConsumer = base(bootstrap)
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
pub fn reader(bootstrap: &str) -> Result<BaseConsumer, KafkaError> {
    base(bootstrap)
        .set("group.id", format!("gpusanity-reader-{}", uuid::Uuid::new_v4()))
        .set("enable.auto.commit", "false")
        .create()
}

/// Why the topics could not be made sure of.
#[derive(Debug, thiserror::Error)]
pub enum TopicsError {
    #[error("Kafka at {0} did not answer within {1} s (is the broker running? check the bootstrap address)")]
    Unreachable(String, u64),
    #[error("creating topic {0}: {1}")]
    Create(String, RDKafkaErrorCode),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// How long start-up waits for the broker.
const REACH_TIMEOUT: Duration = Duration::from_secs(20);

/// Creates the topics that are missing (one partition each unless they exist already); the
/// broker must answer within 20 s.
pub async fn ensure_topics(bootstrap: &str, topics: &[&str]) -> Result<(), TopicsError> {
    let admin: AdminClient<DefaultClientContext> = base(bootstrap).create()?;
    let new: Vec<NewTopic> = topics.iter().map(|t| NewTopic::new(t, 1, TopicReplication::Fixed(1))).collect();
    let opts =
        AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))).request_timeout(Some(REACH_TIMEOUT));
    let results = tokio::time::timeout(REACH_TIMEOUT, admin.create_topics(&new, &opts))
        .await
        .map_err(|_| TopicsError::Unreachable(bootstrap.into(), REACH_TIMEOUT.as_secs()))?;
    let results = match results {
        Err(KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut)) => {
            return Err(TopicsError::Unreachable(bootstrap.into(), REACH_TIMEOUT.as_secs()))
        }
        r => r?,
    };
    for res in results {
        match res {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => return Err(TopicsError::Create(t, code)),
        }
    }
    Ok(())
}
