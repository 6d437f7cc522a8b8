//! `gpusanity agent --node NAME`: runs on every node, beats, takes the tasks for its node from
//! Kafka, runs this node's part of the data plane — the launcher of `gpusanity check`, as a
//! child process it can stop — and reports progress and results back.
//!
//! The launcher runs as a child process, not in-process: it owns signal handlers, worker
//! processes tied to its thread and its own deadlines, and a child is what the agent can
//! cancel (SIGTERM, then SIGKILL) without ending itself. The launcher's code is unchanged.

pub mod kubelet;
mod launch;
pub mod watch;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use gpusanity_common::device::DeviceChoice;
use gpusanity_common::envs::EnvPolicy;
use gpusanity_common::report::DeviceKind;
use gpusanity_common::wire::agent::{AgentCommand, AgentReport, CommandBody, NodeResult, ReportBody, Task};
use gpusanity_common::wire::{Topics, WIRE_VERSION};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::{mpsc, oneshot};

use crate::auth::envelope;
use crate::auth::keyring::Key;
use crate::auth::{rdzv, Direction, Keyring, Refused, Verifier};
use crate::report_chunks;
pub use kubelet::KubeletGpus;
use launch::{Bound, Launch};

/// Results kept to answer a repeated task (after a service restart).
const KEEP_DONE: usize = 64;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub node: String,
    /// The brokers and the client properties (TLS, SASL).
    pub kafka: gpusanity_bus::kafka::KafkaConn,
    pub topics: Topics,
    /// The address the other nodes reach this node at (node 0 hosts the rendezvous on it).
    pub address: String,
    /// Passed to the launcher as `--device`.
    pub device: DeviceChoice,
    pub nproc_per_node: Option<usize>,
    /// Each run's report and launcher log go under `work_dir/RUN_ID/`.
    pub work_dir: PathBuf,
    pub heartbeat: Duration,
    /// Signs the reports, opens the tasks.
    pub ring: Keyring,
    /// How old a task may be.
    pub max_age: Duration,
    /// Passed to each launcher (--allow-env, --test-faults).
    pub env_policy: EnvPolicy,
    /// How the agent's topics are created if missing, and how long start-up waits for the broker.
    pub topic_spec: gpusanity_bus::kafka::TopicSpec,
    /// Node 0's rendezvous ports; `None`: any free port.
    pub rdzv_ports: Option<gpusanity_common::wire::launcher::PortRange>,
    /// The operator's check parameters, passed to each launcher after the job's (validated by
    /// [`validate_check_params`]).
    pub check_params: Vec<String>,
    /// Ask the kubelet for a job's GPUs when its event names none ([`kubelet`]).
    pub kubelet: Option<KubeletGpus>,
}

/// The most `--check-param` values an agent takes, and the longest one.
const MAX_CHECK_PARAMS: usize = 256;
const MAX_CHECK_PARAM_LEN: usize = 4096;

/// The operator's `--check-param` values, checked at the agent's start as its launchers will
/// apply them (the configuration of the backend `device` gives): an unknown key or a bad value
/// stops the agent there, not every run later.
pub fn validate_check_params(device: DeviceChoice, params: &[String]) -> Result<(), String> {
    if params.len() > MAX_CHECK_PARAMS {
        return Err(format!("--check-param: {} given, at most {MAX_CHECK_PARAMS}", params.len()));
    }
    if let Some(p) = params.iter().find(|p| p.len() > MAX_CHECK_PARAM_LEN) {
        let head: String = p.chars().take(64).collect();
        return Err(format!("--check-param {head}...: longer than {MAX_CHECK_PARAM_LEN} bytes"));
    }
    let kind = if device == DeviceChoice::Cpu { DeviceKind::Cpu } else { DeviceKind::Cuda };
    let mut configs = gpusanity_common::config::CheckConfigs::defaults(kind);
    configs.apply_params(params).map_err(|e| e.to_string())
}

struct Running {
    node_rank: usize,
    started: Instant,
    master_port: Option<u16>,
    cancel: Option<oneshot::Sender<()>>,
}

/// What sending a report needs, detached from the agent for background deliveries.
struct Sender {
    producer: FutureProducer,
    topic: String,
    node: String,
    id: String,
    key: Key,
}

impl Sender {
    /// Queues `body` now (in order); the future resolves when the broker has it.
    fn enqueue(&self, body: &ReportBody) -> Option<impl std::future::Future<Output = Result<(), String>>> {
        let r = AgentReport {
            version: WIRE_VERSION,
            node: self.node.clone(),
            agent_id: self.id.clone(),
            at: chrono::Utc::now(),
            body: body.clone(),
        };
        let payload = envelope::seal(&self.key, Direction::Report, serde_json::to_string(&r).ok()?);
        match self.producer.send_result(FutureRecord::to(&self.topic).key(&self.node).payload(&payload)) {
            Ok(delivery) => Some(async move {
                match delivery.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err((e, _))) => Err(e.to_string()),
                    Err(_) => Err("the producer was dropped".to_string()),
                }
            }),
            Err((e, _)) => {
                tracing::warn!("could not queue a report for the service: {e}");
                None
            }
        }
    }
}

struct Agent {
    cfg: AgentConfig,
    id: String,
    /// The key that signs this node's reports.
    key: Key,
    /// Opens the tasks: signature, freshness, replay.
    verifier: Verifier,
    producer: FutureProducer,
    running: HashMap<String, Running>,
    done: VecDeque<NodeResult>,
    exits: mpsc::UnboundedSender<NodeResult>,
    bound: mpsc::UnboundedSender<Bound>,
    /// Tasks waiting for the kubelet's answer: run id, node rank.
    looking_up: HashMap<String, usize>,
    looked: mpsc::UnboundedSender<kubelet::Looked>,
    /// The GPUs the kubelet gave recent runs here.
    learnt: kubelet::Learnt,
    /// Watches waiting for the kubelet, by job.
    watch_lookups: HashMap<String, gpusanity_common::wire::watch::WatchTask>,
    /// The jobs whose GPUs this node watches while they run.
    watches: watch::Watches,
}

/// An unreachable broker, or one that refuses the client (TLS, SASL), is bad input (exit 2), like an unreachable master for `check`.
pub fn topics_error(e: gpusanity_bus::kafka::TopicsError) -> anyhow::Error {
    match e {
        gpusanity_bus::kafka::TopicsError::Unreachable(..) | gpusanity_bus::kafka::TopicsError::Refused(..) => {
            crate::UsageError(e.to_string()).into()
        }
        e => anyhow::Error::from(e).context("creating the Kafka topics"),
    }
}

/// The recording the watch replays in place of the GPUs: test rigs only (`--test-faults`).
fn replay_file(cfg: &AgentConfig) -> Option<PathBuf> {
    let path = std::env::var_os(watch::replay::REPLAY_ENV)?;
    if !cfg.env_policy.test_faults {
        tracing::warn!("{} ignored: the agent was not started with --test-faults", watch::replay::REPLAY_ENV);
        return None;
    }
    Some(PathBuf::from(path))
}

/// Runs the agent until SIGTERM/SIGINT; its launchers are stopped before it returns.
pub async fn run(cfg: AgentConfig) -> Result<()> {
    let k = &cfg.topics;
    gpusanity_bus::kafka::ensure_topics(&cfg.kafka, &[&k.agent_tasks, &k.agent_reports, &k.telemetry], &cfg.topic_spec)
        .await
        .map_err(topics_error)?;
    // Reports wait out a broker outage in the producer's queue, in order, for as long as the
    // service would take them (older ones it refuses as stale): a result made while the broker
    // was away reaches the service once it is back.
    let producer = gpusanity_bus::kafka::producer_with_timeout(&cfg.kafka, cfg.max_age)?;
    let consumer = gpusanity_bus::kafka::tail_consumer(&cfg.kafka, &cfg.topics.agent_tasks)
        .context("reading the agent-tasks topic")?;
    std::fs::create_dir_all(&cfg.work_dir).with_context(|| format!("creating {}", cfg.work_dir.display()))?;
    let (exits, mut exited) = mpsc::unbounded_channel();
    let (bound, mut bounds) = mpsc::unbounded_channel();
    let (looked, mut answers) = mpsc::unbounded_channel();
    let key = cfg.ring.signer_for(&cfg.node).cloned().context("no agent key covers this node")?;
    let verifier = Verifier::new(cfg.ring.clone(), cfg.max_age);
    let id = uuid::Uuid::new_v4().to_string();
    let (summaries, mut summarised) = mpsc::unbounded_channel();
    let watches = watch::Watches::new(&cfg.node, &id, replay_file(&cfg), summaries);
    let mut agent = Agent {
        id,
        key,
        verifier,
        cfg,
        producer,
        running: HashMap::new(),
        done: VecDeque::new(),
        exits,
        bound,
        looking_up: HashMap::new(),
        looked,
        learnt: kubelet::Learnt::default(),
        watch_lookups: HashMap::new(),
        watches,
    };
    tracing::info!(node = agent.cfg.node, agent_id = agent.id, "agent up");
    let mut beat = tokio::time::interval(agent.cfg.heartbeat);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut read_errors = gpusanity_bus::kafka::ReadErrors::new("agent tasks");
    loop {
        tokio::select! {
            _ = beat.tick() => {
                agent.heartbeat();
                agent.watches.expire();
            }
            Some(t) = summarised.recv() => agent.publish_telemetry(&t),
            m = consumer.recv() => {
                let m = match m {
                    Ok(m) => {
                        read_errors.message();
                        m
                    }
                    Err(e) => {
                        read_errors.error(&e);
                        continue;
                    }
                };
                if let Some((c, key)) = m.payload().and_then(|p| agent.authentic(p)) {
                    agent.command(c.body, &key);
                }
            }
            Some(res) = exited.recv() => agent.exited(res),
            Some(b) = bounds.recv() => agent.bound(b),
            Some(l) = answers.recv() => agent.looked_up(l),
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    // Stop every launcher and report how each ended before leaving (15 s at most), then leave
    // the broker (bounded too).
    crate::shutdown::exit_after(Duration::from_secs(18), "agent");
    agent.watches.stop_all();
    for r in agent.running.values_mut() {
        if let Some(c) = r.cancel.take() {
            let _ = c.send(());
        }
    }
    while !agent.running.is_empty() {
        match tokio::time::timeout(Duration::from_secs(15), exited.recv()).await {
            Ok(Some(res)) => agent.exited(res),
            _ => break,
        }
    }
    Ok(())
}

impl Agent {
    /// Queues a report for the service and returns at once (a slow or absent broker must not
    /// hold up the agent's loop); the delivery is awaited in the background. Node 0's report
    /// past [`report_chunks::INLINE_MAX`] goes ahead in chunks. A result whose report the broker
    /// refuses (too large) is sent again without it, with the reason.
    fn send(&self, body: ReportBody) {
        if let ReportBody::Result(res) = &body {
            let large = res
                .report
                .as_ref()
                .is_some_and(|r| serde_json::to_vec(r).map_or(true, |j| j.len() > report_chunks::INLINE_MAX));
            if large {
                return self.send_chunked(res.clone());
            }
        }
        let Some(delivery) = self.enqueue(&body) else { return };
        let slim = match body {
            ReportBody::Result(res) if res.report.is_some() => Some(res),
            _ => None,
        };
        let retry = slim.map(|res| (self.clone_sender(), res));
        tokio::spawn(async move {
            let Err(e) = delivery.await else { return };
            tracing::warn!("could not send a report to the service: {e}");
            if let Some((sender, res)) = retry {
                let error = Some(format!("node 0's report could not be sent: {e}"));
                if let Some(d) = sender.enqueue(&ReportBody::Result(NodeResult { report: None, error, ..res })) {
                    if let Err(e) = d.await {
                        tracing::warn!("could not send a result to the service: {e}");
                    }
                }
            }
        });
    }

    /// Node 0's report in chunks, in order on the node's partition, then its `Result` naming
    /// them. A chunk the broker does not take leaves a gap the service names when the `Result`
    /// comes (the run ends without a report, as an error).
    fn send_chunked(&self, res: NodeResult) {
        let Some(report) = res.report.as_deref() else { return };
        let (chunks, meta) = match report_chunks::split(report, &res.run_id, res.node_rank) {
            Ok(split) => split,
            Err(e) => {
                let error = Some(format!("node 0's report could not be compressed: {e}"));
                return self.send(ReportBody::Result(NodeResult { report: None, error, ..res }));
            }
        };
        let mut deliveries = Vec::with_capacity(chunks.len());
        for c in chunks {
            let seq = c.seq;
            match self.enqueue(&ReportBody::ReportChunk(c)) {
                Some(d) => deliveries.push((seq, d)),
                None => tracing::warn!(run_id = res.run_id, seq, "a chunk of the report could not be queued"),
            }
        }
        tracing::info!(
            run_id = res.run_id,
            chunks = meta.chunks,
            gzip_bytes = meta.gzip_bytes,
            "report sent in chunks"
        );
        self.send(ReportBody::Result(NodeResult { report: None, report_chunks: Some(meta), ..res }));
        tokio::spawn(async move {
            for (seq, d) in deliveries {
                if let Err(e) = d.await {
                    tracing::warn!(seq, "could not send a chunk of the report to the service: {e}");
                }
            }
        });
    }

    fn clone_sender(&self) -> Sender {
        Sender {
            producer: self.producer.clone(),
            topic: self.cfg.topics.agent_reports.clone(),
            node: self.cfg.node.clone(),
            id: self.id.clone(),
            key: self.key.clone(),
        }
    }

    fn enqueue(&self, body: &ReportBody) -> Option<impl std::future::Future<Output = Result<(), String>>> {
        self.clone_sender().enqueue(body)
    }

    fn heartbeat(&self) {
        let busy = self.running.iter().next();
        self.send(ReportBody::Heartbeat {
            address: self.cfg.address.clone(),
            run_id: busy.map(|(id, _)| id.clone()),
            elapsed_s: busy.map(|(_, r)| r.started.elapsed().as_secs_f64()),
        });
    }

    /// The command in `bytes` if it is for this node, authentic, fresh and of this version,
    /// with the key that signed it. Commands for other nodes are dropped silently (every agent
    /// reads the whole topic); a forgery or a replay for this node is logged.
    fn authentic(&mut self, bytes: &[u8]) -> Option<(AgentCommand, Key)> {
        let mine = self.cfg.node.as_str();
        match self.verifier.open_as::<AgentCommand>(Direction::Task, bytes) {
            Ok((c, key)) if c.node == mine => Some((c, key)),
            Ok(_) => None,
            Err(Refused::WrongNode { node, .. } | Refused::Version { node, .. }) if node != mine => None,
            // Another node's commands may be signed with a key this node does not hold: only a
            // message naming this node is worth a warning.
            Err(Refused::Auth(e)) => {
                if String::from_utf8_lossy(bytes).contains(mine) {
                    tracing::warn!("agent command refused: {e}");
                }
                None
            }
            Err(e) => {
                tracing::warn!("agent command refused: {e}");
                None
            }
        }
    }

    fn command(&mut self, c: CommandBody, key: &Key) {
        match c {
            CommandBody::Task(t) => self.task(t, key),
            CommandBody::Cancel { run_id, reason } => {
                if self.cancel_lookup(&run_id) {
                    tracing::info!(run_id, reason, "cancelled while waiting for the kubelet");
                } else if let Some(r) = self.running.get_mut(&run_id) {
                    tracing::info!(run_id, reason, "cancelling this node's part of the run");
                    if let Some(c) = r.cancel.take() {
                        let _ = c.send(());
                    }
                }
            }
            CommandBody::Watch(w) => self.watch(w),
            CommandBody::Unwatch { job_id, run_id } => self.unwatch(&job_id, &run_id),
        }
    }

    /// Signs one period's summary and queues it on the telemetry topic, keyed by job (one
    /// partition holds a job's summaries, for the one replica that judges it).
    fn publish_telemetry(&self, t: &gpusanity_common::wire::watch::Telemetry) {
        let Ok(json) = serde_json::to_string(t) else { return };
        let payload = envelope::seal(&self.key, Direction::Telemetry, json);
        let record = FutureRecord::to(&self.cfg.topics.telemetry).key(&t.job_id).payload(&payload);
        match self.producer.send_result(record) {
            Ok(delivery) => {
                tokio::spawn(async move {
                    if let Ok(Err((e, _))) = delivery.await {
                        tracing::warn!("could not send telemetry to the service: {e}");
                    }
                });
            }
            Err((e, _)) => tracing::warn!("could not queue telemetry for the service: {e}"),
        }
    }

    fn task(&mut self, t: Task, key: &Key) {
        // The run id names a folder under the work dir: a UUID and nothing else.
        if uuid::Uuid::parse_str(&t.run_id).map(|u| u.hyphenated().to_string() != t.run_id).unwrap_or(true) {
            tracing::warn!(run_id = t.run_id.escape_debug().to_string(), "task refused: its run id is not a UUID");
            return;
        }
        // A repeated task (the service restarted): answer it again, or wait for the kubelet.
        if self.looking_up.contains_key(&t.run_id) {
            return;
        }
        if let Some(r) = self.running.get(&t.run_id) {
            // Node 0 starts once its launcher has bound the rendezvous port (see `bound`).
            if r.node_rank == 0 && r.master_port.is_none() {
                return;
            }
            let body =
                ReportBody::Started { run_id: t.run_id.clone(), node_rank: r.node_rank, master_port: r.master_port };
            return self.send(body);
        }
        if let Some(res) = self.done.iter().find(|d| d.run_id == t.run_id).cloned() {
            return self.send(ReportBody::Result(res));
        }
        if t.deadline <= chrono::Utc::now() {
            tracing::warn!(run_id = t.run_id, "stale task ignored (its deadline has passed)");
            return;
        }
        let secret = t.rdzv_secret.as_deref().and_then(|s| rdzv::unseal(key, &t.run_id, &self.cfg.node, s));
        if t.rdzv_secret.is_some() && secret.is_none() {
            tracing::warn!(
                run_id = t.run_id,
                "the task's rendezvous secret does not open: the run goes unauthenticated"
            );
        }
        if self.needs_lookup(&t) {
            return self.look_up(t, secret);
        }
        self.launch(t, secret);
    }

    /// Starts this node's launcher for `t`.
    fn launch(&mut self, t: Task, secret: Option<[u8; rdzv::SECRET_LEN]>) {
        let (cancel_tx, cancel_rx) = oneshot::channel();
        match Launch::start(&self.cfg, &t, secret, cancel_rx, self.exits.clone(), self.bound.clone()) {
            Ok(announces) => {
                self.running.insert(
                    t.run_id.clone(),
                    Running {
                        node_rank: t.node_rank,
                        started: Instant::now(),
                        master_port: None,
                        cancel: Some(cancel_tx),
                    },
                );
                if !announces {
                    self.send(ReportBody::Started { run_id: t.run_id, node_rank: t.node_rank, master_port: None });
                }
            }
            Err(e) => {
                let res = NodeResult {
                    run_id: t.run_id,
                    node_rank: t.node_rank,
                    exit_code: None,
                    report: None,
                    report_chunks: None,
                    error: Some(format!("{e:#}")),
                };
                self.exited(res);
            }
        }
    }

    /// Node 0's launcher listens on `b.port`: the run has started, the other nodes may join.
    fn bound(&mut self, b: Bound) {
        let Some(r) = self.running.get_mut(&b.run_id) else { return };
        r.master_port = Some(b.port);
        let body = ReportBody::Started { run_id: b.run_id, node_rank: r.node_rank, master_port: Some(b.port) };
        self.send(body);
    }

    fn exited(&mut self, res: NodeResult) {
        self.running.remove(&res.run_id);
        tracing::info!(run_id = res.run_id, exit_code = ?res.exit_code, "this node's part of the run ended");
        self.done.push_back(res.clone());
        if self.done.len() > KEEP_DONE {
            self.done.pop_front();
        }
        self.send(ReportBody::Result(res));
    }
}
