//! The agents of N nodes, simulated in one process as async work speaking the real agent
//! protocol over Kafka (service/src/agent/): each node beats with an agent identity of its
//! own and signs with the key the keyring gives it (a node key, or the cluster key); its task
//! is opened as an agent opens it (signature, freshness, replay, the key covering the node, the
//! sealed rendezvous secret), node 0 answers `Started` with a rendezvous port, the others
//! `Started` and their `Result`, and once every node holds its task node 0 sends its report:
//! a real one, built by the launcher's `gather::build_report` (with the diagnosis) over the
//! synthetic ranks of `sim_ranks.rs`, inline or in chunks exactly as the agent decides.
//!
//! Shared by bench/service_scale.rs and tests/service/scale_job.rs, which include this file as
//! a module (a simulator is no part of the service's library).

#[path = "sim_ranks.rs"]
pub mod sim_ranks;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpusanity_bus::kafka::KafkaConn;
use gpusanity_common::config::CheckConfigs;
use gpusanity_common::report::{DeviceKind, NodeInfo, Report};
use gpusanity_common::wire::agent::{AgentCommand, AgentReport, CommandBody, NodeResult, ReportBody};
use gpusanity_common::wire::watch::{GpuTelemetry, Telemetry, WatchTask};
use gpusanity_common::wire::WIRE_VERSION;
use gpusanity_executor::launcher::gather;
use gpusanity_executor::launcher::outcome::Heard;
use gpusanity_service::auth::keyring::Key;
use gpusanity_service::auth::{envelope, rdzv, Direction, Keyring, Verifier};
use gpusanity_service::report_chunks;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::watch;

/// The rendezvous port node 0 announces (no launcher listens on it: nothing connects).
const MASTER_PORT: u16 = 29500;

/// The name of node `k`, as the job event names it and the report's nodes are called.
pub fn node_name(k: usize) -> String {
    node_info(k, 1).hostname
}

pub use sim_ranks::node_info;

/// Node 0's report of a run of `nnodes` nodes of `gpus` ranks each: every rank passes the
/// default check with H200-like figures, diagnosed by the real code.
pub fn report(nnodes: usize, gpus: usize) -> Result<Report> {
    let nodes: Vec<NodeInfo> = (0..nnodes).map(|k| node_info(k, gpus)).collect();
    let outcomes: Vec<_> = (0..nnodes).map(|k| Heard::Outcome(Box::new(sim_ranks::outcome(k, &nodes, gpus)))).collect();
    let mut configs = CheckConfigs::defaults(DeviceKind::Cuda);
    configs.apply_params(&[])?;
    let meta = gather::RunMeta {
        run_id: String::new(),
        started_at: chrono::Utc::now(),
        settings: Default::default(),
        backend: DeviceKind::Cuda,
        configs,
        checks: sim_ranks::CHECKS.to_vec(),
    };
    Ok(gather::build_report(&meta, &nodes, &outcomes, None))
}

/// What the simulated agents saw and did; read by the caller while they run.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// Nodes that received their task.
    pub tasked: usize,
    /// Tasks received again for a node that had its task.
    pub repeated: usize,
    pub cancels: usize,
    /// Watch commands (first ones and renewals) and Unwatch commands received.
    pub watches: usize,
    pub unwatches: usize,
    /// Commands about a simulated node that did not open (signature, freshness, replay, key)
    /// or whose rendezvous secret did not unseal.
    pub refused: usize,
    pub heartbeats: u64,
    /// The run the tasks named.
    pub run_id: Option<String>,
    pub first_task: Option<Instant>,
    pub all_tasks: Option<Instant>,
    /// When the broker had node 0's result (and its chunks).
    pub report_sent: Option<Instant>,
    pub report_json_bytes: usize,
    /// Chunks node 0's report went in (0: inline).
    pub report_chunks: u32,
    /// A delivery the broker refused, or a report that could not be split.
    pub errors: Vec<String>,
}

/// The simulated nodes and where they talk.
pub struct Fleet {
    pub nnodes: usize,
    pub conn: KafkaConn,
    pub agent_tasks: String,
    pub agent_reports: String,
    pub ring: Keyring,
    pub heartbeat: Duration,
    /// How old a task may be (the agent's `--max-age`).
    pub max_age: Duration,
    /// Once watched (docs/watch.md), each node publishes synthetic telemetry here; None: the
    /// nodes only count their watches.
    pub telemetry: Option<SimTelemetry>,
}

/// Synthetic telemetry of a watched job: `gpus` busy GPUs per node at about 1980 MHz, each
/// with a small offset of its own and per-sample noise; from `onset_s` after the watch's first
/// sample, GPU 0 of node `slow_node` runs at `factor` of its clock.
#[derive(Debug, Clone)]
pub struct SimTelemetry {
    pub topic: String,
    pub gpus: usize,
    pub slow_node: usize,
    pub onset_s: u64,
    pub factor: f64,
}

impl SimTelemetry {
    /// Node `k`'s summary of the period from `from` (sample `k0` of the watch on).
    fn summary(&self, n: &Node, k: usize, w: &WatchTask, from: chrono::DateTime<chrono::Utc>, k0: u64) -> Telemetry {
        let per = (w.period_ms / w.interval_ms).max(1) as u64;
        let gpus = (0..self.gpus)
            .map(|g| {
                let offset = 1.0 + 0.01 * ((((k * self.gpus + g) * 7919) % 17) as f64 / 17.0 - 0.5);
                let mut t = GpuTelemetry {
                    gpu: format!("GPU-{}-{g}", n.name),
                    power_limit_w: Some(700.0),
                    ..Default::default()
                };
                for i in 0..per {
                    let slow =
                        k == self.slow_node && g == 0 && (k0 + i) * u64::from(w.interval_ms) >= self.onset_s * 1000;
                    let noise = 1.0 + 0.006 * (rand::random::<f64>() - 0.5);
                    let mhz = 1980.0 * offset * noise * if slow { self.factor } else { 1.0 };
                    t.sm_mhz.push(Some(mhz.round() as u32));
                    t.power_w.push(Some((640.0 * noise) as f32));
                    t.util_pct.push(Some(100));
                }
                t
            })
            .collect();
        Telemetry {
            version: WIRE_VERSION,
            node: n.name.clone(),
            agent_id: n.agent_id.clone(),
            job_id: w.job_id.clone(),
            run_id: w.run_id.clone(),
            from,
            interval_ms: w.interval_ms,
            gpus,
        }
    }

    /// Publishes every watched node's summaries, period after period on multiples of the
    /// period, until `stop`.
    async fn run(self, nodes: Vec<Node>, w: WatchTask, producer: FutureProducer, mut stop: watch::Receiver<bool>) {
        let period = i64::from(w.period_ms);
        let mut from_ms = (chrono::Utc::now().timestamp_millis() / period + 1) * period;
        let mut k0 = 0u64;
        loop {
            let wait = from_ms + period - chrono::Utc::now().timestamp_millis();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(u64::try_from(wait).unwrap_or(0))) => {}
                _ = stop.changed() => return,
            }
            let from = chrono::DateTime::from_timestamp_millis(from_ms).unwrap_or_else(chrono::Utc::now);
            for (k, n) in nodes.iter().enumerate() {
                let t = self.summary(n, k, &w, from, k0);
                let Ok(json) = serde_json::to_string(&t) else { continue };
                let payload = envelope::seal(&n.key, Direction::Telemetry, json);
                let _ = producer.send_result(FutureRecord::to(&self.topic).key(&w.job_id).payload(&payload));
            }
            k0 += (w.period_ms / w.interval_ms).max(1) as u64;
            from_ms += period;
        }
    }
}

#[derive(Clone)]
struct Node {
    name: String,
    agent_id: String,
    key: Key,
    tasked: bool,
}

/// Seals and queues reports for the broker; the delivery futures say when the broker has them.
#[derive(Clone)]
struct Out {
    producer: FutureProducer,
    topic: String,
}

impl Out {
    fn send(&self, n: &Node, body: ReportBody) -> Result<rdkafka::producer::DeliveryFuture> {
        let r = AgentReport {
            version: WIRE_VERSION,
            node: n.name.clone(),
            agent_id: n.agent_id.clone(),
            at: chrono::Utc::now(),
            body,
        };
        let payload = envelope::seal(&n.key, Direction::Report, serde_json::to_string(&r)?);
        self.producer
            .send_result(FutureRecord::to(&self.topic).key(&n.name).payload(&payload))
            .map_err(|(e, _)| anyhow::anyhow!("queueing a report of {}: {e}", n.name))
    }
}

impl Fleet {
    /// Runs the agents until `stop` turns true; `tally` follows what they do.
    pub async fn run(self, report: Report, tally: Arc<Mutex<Tally>>, mut stop: watch::Receiver<bool>) -> Result<()> {
        let producer = gpusanity_bus::kafka::producer(&self.conn)?;
        let consumer = gpusanity_bus::kafka::tail_consumer(&self.conn, &self.agent_tasks)?;
        let mut nodes = Vec::with_capacity(self.nnodes);
        for k in 0..self.nnodes {
            let name = node_name(k);
            let key = self.ring.signer_for(&name).cloned().with_context(|| format!("no agent key covers {name}"))?;
            nodes.push(Node { name, agent_id: uuid::Uuid::new_v4().to_string(), key, tasked: false });
        }
        let index: HashMap<String, usize> = nodes.iter().enumerate().map(|(k, n)| (n.name.clone(), k)).collect();
        let out = Out { producer, topic: self.agent_reports.clone() };
        let mut verifier = Verifier::new(self.ring.clone(), self.max_age);
        let mut report = Some(report);
        let mut telemetry = self.telemetry.clone();
        let mut beat = tokio::time::interval(self.heartbeat);
        let count = |f: &dyn Fn(&mut Tally)| f(&mut tally.lock().unwrap_or_else(|p| p.into_inner()));
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                _ = beat.tick() => {
                    for n in &nodes {
                        let body = ReportBody::Heartbeat { address: "127.0.0.1".into(), run_id: None, elapsed_s: None };
                        // A beat's delivery is not awaited: the next one follows.
                        drop(out.send(n, body)?);
                    }
                    count(&|t| t.heartbeats += nodes.len() as u64);
                }
                m = consumer.recv() => {
                    let m = m.context("reading the agent-tasks topic")?;
                    let Some(bytes) = m.payload() else { continue };
                    let (payload, key) = match verifier.open(Direction::Task, bytes) {
                        Ok(opened) => opened,
                        Err(_) => {
                            count(&|t| t.refused += 1);
                            continue;
                        }
                    };
                    let c: AgentCommand = serde_json::from_str(&payload).context("a task that does not parse")?;
                    let Some(&k) = index.get(&c.node) else { continue };
                    if !key.covers(&c.node) || c.version != WIRE_VERSION {
                        count(&|t| t.refused += 1);
                        continue;
                    }
                    let t = match c.body {
                        CommandBody::Task(t) => t,
                        CommandBody::Cancel { .. } => {
                            count(&|t| t.cancels += 1);
                            continue;
                        }
                        CommandBody::Watch(w) => {
                            count(&|t| t.watches += 1);
                            if let Some(sim) = telemetry.take() {
                                tokio::spawn(sim.run(nodes.clone(), w, out.producer.clone(), stop.clone()));
                            }
                            continue;
                        }
                        CommandBody::Unwatch { .. } => {
                            count(&|t| t.unwatches += 1);
                            continue;
                        }
                    };
                    let sealed = t.rdzv_secret.as_deref().and_then(|s| rdzv::unseal(&key, &t.run_id, &c.node, s));
                    if sealed.is_none() {
                        count(&|t| t.refused += 1);
                    }
                    if std::mem::replace(&mut nodes[k].tasked, true) {
                        count(&|t| t.repeated += 1);
                        continue;
                    }
                    let n = &nodes[k];
                    let master_port = (k == 0).then_some(MASTER_PORT);
                    drop(out.send(n, ReportBody::Started { run_id: t.run_id.clone(), node_rank: k, master_port })?);
                    if k != 0 {
                        let res = NodeResult {
                            run_id: t.run_id.clone(),
                            node_rank: k,
                            exit_code: Some(0),
                            report: None,
                            report_chunks: None,
                            error: None,
                        };
                        drop(out.send(n, ReportBody::Result(res))?);
                    }
                    let now = Instant::now();
                    let all = {
                        let mut g = tally.lock().unwrap_or_else(|p| p.into_inner());
                        g.tasked += 1;
                        g.first_task.get_or_insert(now);
                        g.run_id.get_or_insert_with(|| t.run_id.clone());
                        if g.tasked == nodes.len() {
                            g.all_tasks = Some(now);
                        }
                        g.tasked == nodes.len()
                    };
                    if let Some(mut r) = report.take_if(|_| all) {
                        r.run_id = t.run_id.clone();
                        let (out, node0, tally) = (out.clone(), nodes[0].clone(), tally.clone());
                        tokio::spawn(async move {
                            let sent = send_report(&out, &node0, &t.run_id, r, &tally).await;
                            let mut g = tally.lock().unwrap_or_else(|p| p.into_inner());
                            match sent {
                                Ok(()) => g.report_sent = Some(Instant::now()),
                                Err(e) => g.errors.push(format!("{e:#}")),
                            }
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// Node 0's result with its report, as the agent sends it: inline up to
/// [`report_chunks::INLINE_MAX`] bytes of JSON, else its chunks first and a `Result` naming
/// them; returns once the broker has every message.
async fn send_report(out: &Out, n: &Node, run_id: &str, report: Report, tally: &Mutex<Tally>) -> Result<()> {
    let json_bytes = serde_json::to_vec(&report)?.len();
    let mut deliveries = Vec::new();
    let mut res = NodeResult {
        run_id: run_id.into(),
        node_rank: 0,
        exit_code: Some(0),
        report: None,
        report_chunks: None,
        error: None,
    };
    let mut chunks = 0;
    if json_bytes > report_chunks::INLINE_MAX {
        let (pieces, meta) = report_chunks::split(&report, run_id, 0)?;
        chunks = meta.chunks;
        for c in pieces {
            deliveries.push(out.send(n, ReportBody::ReportChunk(c))?);
        }
        res.report_chunks = Some(meta);
    } else {
        res.report = Some(Box::new(report));
    }
    deliveries.push(out.send(n, ReportBody::Result(res))?);
    {
        let mut g = tally.lock().unwrap_or_else(|p| p.into_inner());
        g.report_json_bytes = json_bytes;
        g.report_chunks = chunks;
    }
    for d in deliveries {
        match d.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => bail!("the broker refused a message of node 0's result: {e}"),
            Err(_) => bail!("the producer was dropped"),
        }
    }
    Ok(())
}
