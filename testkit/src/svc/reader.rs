//! A reader of one topic from its beginning, for the tests' assertions.

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

use super::broker;

/// Reads a topic from its beginning, keeping everything seen.
pub struct Reader {
    consumer: BaseConsumer,
    pub seen: Vec<Value>,
    /// When each message of `seen` was read.
    pub arrived: Vec<Instant>,
    /// Each message's timestamp (Unix ms; CreateTime: when its producer sent it), if it has one.
    pub created: Vec<Option<i64>>,
}

impl Reader {
    pub fn new(topic: &str) -> Reader {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", broker());
        Reader::with_config(c, topic)
    }

    /// A reader through a client of `config` (bootstrap servers and security properties).
    pub fn with_config(mut config: ClientConfig, topic: &str) -> Reader {
        let consumer: BaseConsumer = config
            .set("group.id", format!("reader-{}", std::process::id()))
            .set("enable.auto.commit", "false")
            .set("allow.auto.create.topics", "true")
            // As the service's consumers: a message is read within 10 ms of reaching the broker
            // (the default, 500 ms, would show in the latency the tests measure).
            .set("fetch.wait.max.ms", "10")
            .create()
            .expect("consumer");
        // Every partition the topic has now (one if it does not exist yet: created on first use).
        let partitions: Vec<i32> = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .ok()
            .and_then(|m| m.topics().first().map(|t| t.partitions().iter().map(|p| p.id()).collect()))
            .filter(|p: &Vec<i32>| !p.is_empty())
            .unwrap_or_else(|| vec![0]);
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning).expect("partition");
        }
        consumer.assign(&tpl).expect("assign");
        Reader { consumer, seen: Vec::new(), arrived: Vec::new(), created: Vec::new() }
    }

    /// Reads whatever arrives within `d`.
    pub fn drain(&mut self, d: Duration) {
        let end = Instant::now() + d;
        while Instant::now() < end {
            if let Some(Ok(m)) = self.consumer.poll(Duration::from_millis(50)) {
                if let Some(p) = m.payload() {
                    self.seen.push(
                        serde_json::from_slice(p)
                            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(p).into_owned())),
                    );
                    self.arrived.push(Instant::now());
                    self.created.push(m.timestamp().to_millis());
                }
            }
        }
    }

    /// Waits for the first message (seen before or arriving) that matches `pred`.
    pub fn wait_for(&mut self, limit: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            if let Some(v) = self.seen.iter().find(|v| pred(v)) {
                return v.clone();
            }
            assert!(start.elapsed() < limit, "no {what} within {limit:?}; seen: {:#?}", self.seen);
            self.drain(Duration::from_millis(100));
        }
    }

    /// Messages of `type` about `job`.
    pub fn of(&self, job: &str, kind: &str) -> Vec<Value> {
        self.seen.iter().filter(|v| v["job_id"] == job && v["type"] == kind).cloned().collect()
    }
}
