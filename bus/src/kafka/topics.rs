//! Making sure of the topics at start-up: the missing ones are created with the configured
//! partitions and replication factor. Start-up waits for the broker (`[kafka] startup_wait_s`)
//! in attempts of [`REACH_TIMEOUT`]; a broker that refuses the client (TLS, SASL) ends the wait
//! at once.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::ClientContext;
use rdkafka::producer::{DeliveryResult, ProducerContext, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;

use super::{base, KafkaConn, KafkaError};

/// How the missing topics are created, and how long start-up waits for the broker.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicSpec {
    pub partitions: i32,
    pub replication_factor: i32,
    /// None: wait for ever.
    pub startup_wait: Option<Duration>,
}

impl Default for TopicSpec {
    fn default() -> Self {
        TopicSpec { partitions: 1, replication_factor: 1, startup_wait: Some(REACH_TIMEOUT) }
    }
}

/// Why the topics could not be made sure of.
#[derive(Debug, thiserror::Error)]
pub enum TopicsError {
    #[error("Kafka at {0} did not answer within {1} s (is the broker running? check the bootstrap address and kafka.startup_wait_s{2})")]
    Unreachable(String, u64, String),
    #[error("Kafka at {0} refused the client: {1} (check kafka.properties and the SASL password)")]
    Refused(String, String),
    #[error("creating topic {0}: {1}")]
    Create(String, RDKafkaErrorCode),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// One attempt to reach the broker at start-up.
pub const REACH_TIMEOUT: Duration = Duration::from_secs(20);

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

    fn unreachable(&self, conn: &KafkaConn, waited: Duration) -> TopicsError {
        let last = self.last.lock().ok().and_then(|l| l.clone()).map(|l| format!("; last error: {l}"));
        TopicsError::Unreachable(conn.bootstrap().into(), waited.as_secs(), last.unwrap_or_default())
    }
}

/// Creates the topics that are missing (with `spec`'s partitions and replication factor; those
/// that exist are left as they are). The broker is waited for up to `spec.startup_wait`, in
/// attempts of [`REACH_TIMEOUT`]; a broker that refuses the client (TLS, SASL) is an error at once.
pub async fn ensure_topics(conn: &KafkaConn, topics: &[&str], spec: &TopicSpec) -> Result<(), TopicsError> {
    let started = Instant::now();
    loop {
        let attempt = match spec.startup_wait {
            None => REACH_TIMEOUT,
            Some(w) => w.saturating_sub(started.elapsed()).min(REACH_TIMEOUT).max(Duration::from_secs(1)),
        };
        match create(conn, topics, spec, attempt).await {
            Err(Attempt::Unreachable(watch)) => {
                let waited = started.elapsed();
                if spec.startup_wait.is_some_and(|w| waited >= w) {
                    return Err(watch.unreachable(conn, waited));
                }
                crate::signals::SIGNALS.kafka_error();
                tracing::warn!(
                    kafka = conn.bootstrap(),
                    "Kafka does not answer yet, still waiting ({:.0} s so far)",
                    waited.as_secs_f64()
                );
            }
            Err(Attempt::Failed(e)) => return Err(e),
            Ok(()) => return Ok(()),
        }
    }
}

/// How one attempt failed.
enum Attempt {
    Unreachable(Arc<Watch>),
    Failed(TopicsError),
}

async fn create(conn: &KafkaConn, topics: &[&str], spec: &TopicSpec, limit: Duration) -> Result<(), Attempt> {
    let watch = Arc::new(Watch::default());
    let fail = |e: KafkaError| Attempt::Failed(TopicsError::Kafka(e));
    let admin: AdminClient<WatchContext> = base(conn).create_with_context(WatchContext(watch.clone())).map_err(fail)?;
    // The admin client's errors are never polled; a producer that sends nothing connects too,
    // and its own thread hands its errors (TLS, SASL) to the watch.
    let _probe: ThreadedProducer<WatchContext> =
        base(conn).create_with_context(WatchContext(watch.clone())).map_err(fail)?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|t| NewTopic::new(t, spec.partitions, TopicReplication::Fixed(spec.replication_factor)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))).request_timeout(Some(limit));
    let refused_or = |watch: &Arc<Watch>| match watch.refused(conn) {
        Some(e) => Attempt::Failed(e),
        None => Attempt::Unreachable(watch.clone()),
    };
    let results = tokio::select! {
        r = tokio::time::timeout(limit, admin.create_topics(&new, &opts)) => r,
        _ = watch.wake.notified() => return Err(refused_or(&watch)),
    };
    let results = match results {
        Err(_) | Ok(Err(KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut))) => return Err(refused_or(&watch)),
        Ok(r) => r.map_err(fail)?,
    };
    for res in results {
        match res {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, code)) => return Err(Attempt::Failed(TopicsError::Create(t, code))),
        }
    }
    Ok(())
}
