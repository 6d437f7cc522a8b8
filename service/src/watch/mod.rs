//! The watch while a job runs (docs/watch.md), the service's half: the judgement. It reads the
//! agents' telemetry (a consumer group: a job's summaries are on one partition, so one replica
//! judges each job), opens and checks each summary (signed by a key that may speak for its
//! node, fresh, never seen, of this version, within bounds, about the watched run of a job not
//! stopped, from one of its nodes), feeds the run's [`JobJudge`], and hands each suspicion to the
//! [`record`]er, which stores it with its NodeSuspected in one transaction. It never isolates a
//! node.
//!
//! It also tells the agents what to watch: every `renew_s` a `Watch` with a lease of `lease_s`
//! to each node of each watched run, and an `Unwatch` to the nodes of a run no longer watched
//! (its job stopped or restarted) as soon as the database says so. Every replica does this (a
//! repeated `Watch` only renews the lease, and an agent refuses one of a run it was told to
//! unwatch); only the one that reads a job's partition judges it.

pub mod config;
mod record;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use gpusanity_bus::kafka::KafkaConn;
use gpusanity_common::wire::agent::{AgentCommand, CommandBody};
use gpusanity_common::wire::output::{OutputBody, OutputEvent};
use gpusanity_common::wire::watch::{Telemetry, WatchTask};
use gpusanity_common::wire::{Topics, WIRE_VERSION};
use gpusanity_db::rows::RunRow;
use gpusanity_db::Db;
use gpusanity_watch::{JobJudge, Suspicion};
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::Message;
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use crate::auth::{Direction, Verifier};
use crate::coordinator::tasks::send_command;
pub use config::WatchConfig;

/// How often the watched runs are read again from the database.
const REFRESH: Duration = Duration::from_secs(2);

pub struct Watcher {
    pub db: Db,
    /// Sends the agents their watches.
    pub producer: rdkafka::producer::FutureProducer,
    pub topics: Topics,
    pub config: WatchConfig,
    pub auth: Verifier,
    pub outbox_wake: Arc<Notify>,
}

struct Watched {
    run: RunRow,
    judge: JobJudge,
}

/// The telemetry consumer (group `group`).
pub fn subscribe(conn: &KafkaConn, group: &str, topic: &str) -> Result<StreamConsumer> {
    let c = gpusanity_bus::kafka::group_consumer(conn, group)?;
    c.subscribe(&[topic])?;
    Ok(c)
}

impl Watcher {
    pub async fn run(mut self, consumer: StreamConsumer) -> Result<()> {
        let mut runs: HashMap<String, Watched> = HashMap::new();
        // The watched runs are read on a task of their own: a database that does not answer
        // holds up neither the judgement nor the renewals.
        let (watched_tx, mut watched) = tokio::sync::watch::channel(Vec::new());
        // A JoinSet aborts its tasks when dropped: the reader ends with the watcher.
        let mut reader = tokio::task::JoinSet::new();
        reader.spawn(read_watched(self.db.clone(), watched_tx));
        let mut renew = tokio::time::interval(Duration::from_secs(self.config.renew_s));
        let mut read_errors = gpusanity_bus::kafka::ReadErrors::new("telemetry");
        let recorder = record::Recorder::spawn(&self.db, &self.topics.output, &self.outbox_wake);
        loop {
            tokio::select! {
                changed = watched.changed() => {
                    if changed.is_err() {
                        anyhow::bail!("the reader of the watched runs ended");
                    }
                    let now = watched.borrow_and_update().clone();
                    self.refresh(&mut runs, now);
                }
                _ = renew.tick() => self.renew(&runs),
                m = consumer.recv() => match m {
                    Ok(m) => {
                        read_errors.message();
                        if let Some(t) = m.payload().and_then(|p| self.authentic(p)) {
                            self.judge(&mut runs, &t, &recorder);
                        }
                    }
                    Err(e) => read_errors.error(&e),
                },
            }
        }
    }

    /// Keeps one judge per watched run: a new one for a run that became watched, none for a
    /// run no longer watched (its job stopped or restarted).
    fn refresh(&self, runs: &mut HashMap<String, Watched>, watched: Vec<RunRow>) {
        let mut next = HashMap::with_capacity(watched.len());
        for run in watched {
            if next.contains_key(&run.run_id) {
                continue;
            }
            let w = match runs.remove(&run.run_id) {
                Some(w) => w,
                None => {
                    self.start(&run);
                    Watched {
                        judge: JobJudge::new(self.config.judge.clone()).expecting(run.nodes.len()),
                        run: run.clone(),
                    }
                }
            };
            next.insert(run.run_id.clone(), w);
        }
        for (_, gone) in runs.drain() {
            if !next.contains_key(&gone.run.run_id) {
                let (job_id, run_id) = (&gone.run.job_id, &gone.run.run_id);
                self.command(&gone.run, |_| CommandBody::Unwatch { job_id: job_id.clone(), run_id: run_id.clone() });
            }
        }
        *runs = next;
    }

    /// A run newly watched: its agents start at once, not at the next renewal.
    fn start(&self, run: &RunRow) {
        tracing::info!(
            job_id = run.job_id,
            run_id = run.run_id,
            nodes = run.nodes.len(),
            "watching the job while it runs"
        );
        self.command(run, |node| CommandBody::Watch(self.task(run, node)));
    }

    fn renew(&self, runs: &HashMap<String, Watched>) {
        for w in runs.values() {
            self.command(&w.run, |node| CommandBody::Watch(self.task(&w.run, node)));
        }
    }

    fn task(&self, run: &RunRow, node: &gpusanity_common::wire::job::JobNode) -> WatchTask {
        let lease = chrono::Duration::seconds(i64::try_from(self.config.lease_s).unwrap_or(30));
        WatchTask {
            job_id: run.job_id.clone(),
            run_id: run.run_id.clone(),
            gpu_ids: node.gpu_ids.clone(),
            interval_ms: self.config.interval_ms(),
            period_ms: self.config.period_ms(),
            until: chrono::Utc::now() + lease,
        }
    }

    /// Sends each node of `run` the command `body` makes for it.
    fn command(&self, run: &RunRow, body: impl Fn(&gpusanity_common::wire::job::JobNode) -> CommandBody) {
        for node in &run.nodes {
            let c = AgentCommand { version: WIRE_VERSION, node: node.name.clone(), body: body(node) };
            send_command(&self.producer, &self.auth.ring, &self.topics.agent_tasks, &c);
        }
    }

    /// The summary in `bytes` if it is authentic, fresh, of this version, within bounds, and
    /// signed by a key that may speak for its node; anything else is refused with a warning.
    fn authentic(&mut self, bytes: &[u8]) -> Option<Telemetry> {
        let t = match self.auth.open_as::<Telemetry>(Direction::Telemetry, bytes) {
            Ok((t, _)) => t,
            Err(e) => {
                tracing::warn!("telemetry refused: {e}");
                return None;
            }
        };
        if let Err(e) = t.validate() {
            tracing::warn!(node = t.node.escape_debug().to_string(), "telemetry refused: {e}");
            return None;
        }
        Some(t)
    }

    fn judge(&self, runs: &mut HashMap<String, Watched>, t: &Telemetry, recorder: &record::Recorder) {
        let Some(w) = runs.get_mut(&t.run_id) else {
            return tracing::debug!(run_id = t.run_id, node = t.node, "telemetry of a run not watched ignored");
        };
        if w.run.job_id != t.job_id || !w.run.nodes.iter().any(|n| n.name == t.node) {
            return tracing::warn!(run_id = t.run_id, node = t.node, "telemetry refused: not a node of the run's job");
        }
        for s in w.judge.observe(t) {
            recorder.record(suspected(&w.run, &s));
        }
    }
}

/// Reads the watched runs every [`REFRESH`] into `tx` (a reading that fails is said, and the
/// last one stands).
async fn read_watched(db: Db, tx: tokio::sync::watch::Sender<Vec<RunRow>>) {
    loop {
        match db.watched_runs().await {
            Ok(w) => {
                if tx.send(w).is_err() {
                    return;
                }
            }
            Err(e) => tracing::warn!("reading the watched runs: {e}; tried again in {REFRESH:?}"),
        }
        tokio::time::sleep(REFRESH).await;
    }
}

/// The NodeSuspected of `s`; its id is the same for the same (run, node, code), so that a
/// replica that judges the run again after a restart publishes it once.
fn suspected(run: &RunRow, s: &Suspicion) -> OutputEvent {
    let digest = Sha256::digest(format!("{}\0{}\0{}", run.run_id, s.node, s.code));
    OutputEvent {
        version: WIRE_VERSION,
        event_id: format!("suspect-{}", hex::encode(&digest[..16])),
        job_id: run.job_id.clone(),
        workspace_id: run.workspace_id.clone(),
        run_id: Some(run.run_id.clone()),
        cause_event_id: run.cause_event_id.clone(),
        at: chrono::Utc::now(),
        body: OutputBody::NodeSuspected {
            node: s.node.clone(),
            gpu: s.gpu.clone(),
            code: s.code,
            evidence: s.evidence.clone(),
            since: s.since,
        },
    }
}
