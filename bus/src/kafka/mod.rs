//! Kafka clients with the settings every part of the service shares, on the connection
//! ([`KafkaConn`]: bootstrap servers, TLS and SASL properties) every part shares.

mod conn;
mod read_errors;
mod topics;

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::producer::FutureProducer;
use rdkafka::{Offset, TopicPartitionList};

pub use conn::{KafkaConn, PropertyError, OWNED};
pub use rdkafka::error::KafkaError;
pub use read_errors::ReadErrors;
pub use topics::{ensure_topics, TopicSpec, TopicsError};

pub(crate) fn base(conn: &KafkaConn) -> ClientConfig {
    let mut c = conn.client_config();
    c.set("log_level", "3");
    // A broker back from an outage is found within a second (librdkafka's default backs off
    // to 10 s), unless the properties say otherwise.
    if c.get("reconnect.backoff.max.ms").is_none() {
        c.set("reconnect.backoff.max.ms", "1000");
    }
    c
}

/// An idempotent producer (no duplicates or reordering from its own retries), tuned for latency.
pub fn producer(conn: &KafkaConn) -> Result<FutureProducer, KafkaError> {
    producer_with_timeout(conn, Duration::from_secs(30))
}

/// [`producer`] whose messages fail after `timeout` (the outbox publisher's is bounded by its
/// lease: no message of a round is still in flight once the lease could be taken over).
pub fn producer_with_timeout(conn: &KafkaConn, timeout: Duration) -> Result<FutureProducer, KafkaError> {
    base(conn)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "1")
        // Reports (JSON with per-size sweeps) compress about tenfold.
        .set("compression.type", "lz4")
        .set("message.timeout.ms", timeout.as_millis().max(1).to_string())
        .set("message.max.bytes", "8000000")
        .create()
}

/// A consumer in `group` whose offsets are committed only for messages the caller has stored
/// (`store_offset`), so nothing is committed before it is handled.
pub fn group_consumer(conn: &KafkaConn, group: &str) -> Result<StreamConsumer, KafkaError> {
    group_config(conn, group).set("auto.offset.reset", "earliest").create()
}

/// [`group_consumer`] as the static member `instance` of the group: a member that restarts
/// within the session timeout gets its partitions back without a rebalance of the others,
/// and two processes with one instance id are refused by the broker (one is fenced).
pub fn static_member(conn: &KafkaConn, group: &str, instance: &str) -> Result<StreamConsumer, KafkaError> {
    group_config(conn, group).set("auto.offset.reset", "earliest").set("group.instance.id", instance).create()
}

/// A group member's settings. The session timeout is the broker's least by default (6 s): a
/// replica that died loses its partitions to the others that soon.
fn group_config(conn: &KafkaConn, group: &str) -> ClientConfig {
    let mut c = base(conn);
    c.set("group.id", group)
        .set("enable.auto.commit", "true")
        .set("auto.commit.interval.ms", "200")
        .set("enable.auto.offset.store", "false")
        .set("fetch.wait.max.ms", "10")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000")
        .set("fetch.message.max.bytes", "8000000");
    c
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

/// How long [`partition_ends`] waits out a topic whose partitions have no leader yet.
const LEADER_WAIT: Duration = Duration::from_secs(30);

/// Whether `e` says that a partition has no leader yet, or not this one: a topic created a
/// moment ago, or a broker that just started. It passes; anything else does not.
fn leader_moving(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::NotLeaderForPartition | C::LeaderNotAvailable | C::UnknownTopicOrPartition)
    )
}

/// (partition, high watermark) of every partition of `topic`, waiting up to [`LEADER_WAIT`]
/// while its partitions have no leader yet (a topic just created, a broker just started).
pub fn partition_ends<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
) -> Result<Vec<(i32, i64)>, KafkaError> {
    let deadline = std::time::Instant::now() + LEADER_WAIT;
    let mut backoff = crate::backoff::Backoff::default();
    loop {
        match partition_ends_once(client, topic) {
            Err(e) if leader_moving(&e) && std::time::Instant::now() < deadline => {
                tracing::info!(topic, "waiting for the partitions' leader: {e}");
                std::thread::sleep(backoff.step());
            }
            r => return r,
        }
    }
}

fn partition_ends_once<C: rdkafka::client::ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
) -> Result<Vec<(i32, i64)>, KafkaError> {
    use rdkafka::types::RDKafkaErrorCode as C;
    let md = client.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let mut out = Vec::new();
    for t in md.topics() {
        // A topic the broker is still creating comes back with an error and no partitions.
        if let Some(e) = t.error() {
            return Err(KafkaError::MetadataFetch(C::from(e)));
        }
        if t.partitions().is_empty() {
            return Err(KafkaError::MetadataFetch(C::UnknownTopicOrPartition));
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaErrorCode as C;

    #[test]
    fn only_a_moving_leader_is_waited_out() {
        for c in [C::NotLeaderForPartition, C::LeaderNotAvailable, C::UnknownTopicOrPartition] {
            assert!(leader_moving(&KafkaError::MetadataFetch(c)), "{c:?}");
        }
        for c in [C::TopicAuthorizationFailed, C::BrokerTransportFailure, C::SaslAuthenticationFailed] {
            assert!(!leader_moving(&KafkaError::MetadataFetch(c)), "{c:?}");
        }
    }
}
