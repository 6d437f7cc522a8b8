//! Several replicas of `gpusanity serve` in one world: each with a configuration of its own
//! (its HTTP port, `[replica] id`), all on the world's database and topics.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

use super::{client_config, common, World};

impl World {
    /// Makes every topic of this world have `n` partitions (set before anything starts: the
    /// first process to start creates the topics).
    pub fn partitioned(&mut self, n: u32) {
        let text = std::fs::read_to_string(&self.config).expect("config");
        std::fs::write(&self.config, text.replacen("[kafka]\n", &format!("[kafka]\npartitions = {n}\n"), 1))
            .expect("config");
    }

    /// The configuration file and HTTP port of replica `i`, written at the first call with
    /// `replica` as its `[replica]` table and kept (the same port) across its restarts.
    pub fn replica_config(&self, i: usize, replica: &str) -> (PathBuf, u16) {
        let path = self.dir.path().join(format!("replica-{i}.toml"));
        if !path.exists() {
            // Replica 0 answers on the world's own port (World::http_call reaches it).
            let port = if i == 0 { self.http } else { common::free_port() };
            let text = std::fs::read_to_string(&self.config).expect("config");
            let text = text.replacen(
                &format!("listen = \"127.0.0.1:{}\"", self.http),
                &format!("listen = \"127.0.0.1:{port}\""),
                1,
            );
            std::fs::write(&path, format!("{text}\n[replica]\nid = \"r{i}\"\n{replica}\n")).expect("config");
        }
        let text = std::fs::read_to_string(&path).expect("config");
        let port = text
            .lines()
            .find_map(|l| l.strip_prefix("listen = \"127.0.0.1:"))
            .and_then(|p| p.trim_end_matches('"').parse().ok())
            .expect("a listen line");
        (path, port)
    }

    /// Starts replica `i` (process `serve-i`) and waits until its /health answers.
    pub fn serve_replica(&mut self, i: usize, replica: &str) {
        let (config, port) = self.replica_config(i, replica);
        let name = format!("serve-{i}");
        self.spawn_with(&name, &config, &[], &["serve"]);
        let start = Instant::now();
        while !matches!(self.http_call_on(port, "GET", "/health"), Some(200)) {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "replica {i} never became healthy:\n{}",
                self.log(&name)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every replica of `ids` answers /ready with 200 (among other things: the
    /// consumer group gave it partitions of the job-events topic).
    pub fn wait_replicas_ready(&self, ids: &[usize], replica: &str) {
        let start = Instant::now();
        for &i in ids {
            let (_, port) = self.replica_config(i, replica);
            while !matches!(self.http_call_on(port, "GET", "/ready"), Some(200)) {
                assert!(start.elapsed() < Duration::from_secs(60), "replica {i} never became ready");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    /// Whether process `name` of this world is still running.
    pub fn running_now(&mut self, name: &str) -> bool {
        self.children.iter_mut().any(|(n, c)| n == name && matches!(c.try_wait(), Ok(None)))
    }

    /// The status of one GET without a token on `port` (None: no answer).
    fn http_call_on(&self, port: u16, method: &str, path: &str) -> Option<u16> {
        super::bench::status(port, method, path)
    }

    /// A producer of this world's job events, keyed by job id as the platform keys them.
    pub fn job_producer(&self) -> KeyedProducer {
        let p = client_config(&self.client).set("linger.ms", "1").create().expect("producer");
        KeyedProducer { producer: p, topic: self.topic("job-events") }
    }
}

/// Publishes job events keyed by their job id.
pub struct KeyedProducer {
    producer: ThreadedProducer<DefaultProducerContext>,
    topic: String,
}

impl KeyedProducer {
    /// Sends one event and waits until the broker has it.
    pub fn send(&self, job: &str, payload: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        // While the broker is away the local queue holds it; a full queue is retried.
        while let Err((e, _)) = self.producer.send(BaseRecord::to(&self.topic).key(job).payload(payload)) {
            assert!(Instant::now() < deadline, "publishing a job event: {e}");
            std::thread::sleep(Duration::from_millis(50));
        }
        self.producer.flush(Duration::from_secs(60)).expect("flush");
    }
}
