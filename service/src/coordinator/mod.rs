//! The coordinator of `gpusanity serve`: takes the runs the ingest stored, dispatches them to
//! the agents of the job's nodes, supervises agent liveness and the whole-run deadline, and
//! ends every run with a verdict: CheckPassed, CheckFailed, or a KeepJobHang hold.
//!
//! One task owns every active run, so there is no locking: it reacts to notices from the
//! ingest, to agent reports, and to a clock tick. Its state is rebuilt from the database at
//! start-up ([`Coordinator::resume`]); agents ignore a task they already have and answer it
//! again, so re-dispatching after a crash is harmless.

mod agents;
pub mod config;
mod events;
pub mod finish;
mod hearing;
pub mod lease;
mod overrun;
mod poison;
mod tick;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use gpusanity_bus::kafka::KafkaConn;
use gpusanity_common::report::{Code, Report};
use gpusanity_common::verdict::{run_verdict, ServiceFacts};
use gpusanity_common::wire::agent::{AgentCommand, AgentReport, CommandBody, NodeResult, ReportBody, Task};
use gpusanity_common::wire::output::FailReason;
use gpusanity_common::wire::{Topics, WIRE_VERSION};
use gpusanity_common::{Settings, TimeoutOps};
use gpusanity_db::lease::Fence;
use gpusanity_db::runs::{RunRow, ServiceRunState};
use gpusanity_db::Db;
use gpusanity_ingest::Notice;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::sync::Notify;

use crate::auth::{envelope, rdzv, Direction, Verifier};
use agents::Agents;
pub use config::CoordinatorConfig;
use finish::{node_finding, Ending, Verdict};
use hearing::Hearing;
use lease::LeaseState;
pub use lease::Replica;

/// Where a run is.
#[derive(Debug, Clone, PartialEq)]
enum Phase {
    /// Waiting until every node has a live agent.
    WaitAgents,
    /// Node 0 got its task; waiting for its rendezvous port.
    WaitMaster,
    /// Every node got its task.
    Running,
}

/// A run whose stored settings do not parse (a corrupt row): its timeout policy (MarkJobFail or
/// KeepJobHang) is unknown and is not guessed; the run ends failed at the next tick, saying why.
#[derive(Debug, thiserror::Error)]
#[error("the run's stored settings do not parse, so its timeout policy is unknown: {0}")]
struct UnreadableSettings(#[from] serde_json::Error);

struct Active {
    run: RunRow,
    /// Read only when `unreadable` is None.
    settings: Settings,
    unreadable: Option<UnreadableSettings>,
    phase: Phase,
    /// When the current phase began.
    since: Instant,
    /// The agent instance each node's task went to.
    assigned: HashMap<usize, String>,
    /// Nodes whose launcher has ended.
    results: BTreeMap<usize, NodeResult>,
    /// When node 0's result came; the others get one agent timeout more to report or be lost.
    node0_done: Option<Instant>,
    /// This replica's hold on the run: named by the write that ends it.
    fence: Fence,
    /// The job-events partition the run's event came from.
    partition: Option<i32>,
    /// Until when the last renewal of the lease lets this replica act on the run.
    trusted_until: Instant,
    /// Nodes found out of contact whose silence overlapped a blind spell of the service's own:
    /// named, not isolated on that evidence alone.
    withheld: BTreeSet<usize>,
}

impl Active {
    /// The blind time of the service since the run was created: its deadline moves by it.
    fn blind(&self, hearing: &Hearing) -> Duration {
        hearing.blind_since(self.run.created_at)
    }

    /// Whether node `k`'s silence overlapped a blind spell: its agent last heard before the
    /// spell, or never heard and the service blind since the run was created.
    fn overlapped(&self, k: usize, agents: &Agents, hearing: &Hearing) -> bool {
        let Some(node) = self.run.nodes.get(k) else { return false };
        match agents.known(&node.name) {
            Some(s) => hearing.overlapped(s.last_seen),
            None => !hearing.spells_since(self.run.created_at).is_empty(),
        }
    }
}

pub struct Coordinator {
    pub db: Db,
    pub topics: Topics,
    pub config: CoordinatorConfig,
    pub producer: FutureProducer,
    pub outbox_wake: Arc<Notify>,
    agents: Agents,
    active: HashMap<String, Active>,
    /// Opens the agents' reports and signs the tasks.
    auth: Verifier,
    /// This replica, for the leases of its runs.
    pub replica: Replica,
    lease_state: LeaseState,
    /// The job-events consumer, whose assignment says which runs this replica may take over.
    events: Option<Arc<StreamConsumer>>,
    /// Whether the agent reports can reach this replica now, and since when.
    hearing: Hearing,
}

impl Coordinator {
    pub fn new(
        db: Db,
        topics: Topics,
        config: CoordinatorConfig,
        producer: FutureProducer,
        outbox_wake: Arc<Notify>,
        auth: Verifier,
        replica: Replica,
    ) -> Self {
        Coordinator {
            db,
            topics,
            config,
            producer,
            outbox_wake,
            agents: Agents::default(),
            active: HashMap::new(),
            auth,
            replica,
            lease_state: LeaseState::default(),
            events: None,
            hearing: Hearing::new(tokio::sync::watch::channel(None).1),
        }
    }

    /// Takes up the runs left in Checking (not held) by an earlier process of this replica,
    /// and those whose lease ran out long ago; the others are taken once the consumer group
    /// has given this replica their partitions.
    pub async fn resume(&mut self) -> Result<()> {
        self.claim(true, &[]).await
    }

    fn admit(&mut self, run: RunRow, fence: Fence, partition: Option<i32>, trusted_until: Instant) {
        let (settings, unreadable) = match serde_json::from_value::<Settings>(run.settings.clone()) {
            Ok(s) => (s, None),
            Err(e) => {
                let e = UnreadableSettings::from(e);
                tracing::error!(run_id = run.run_id, "{e}");
                (Settings::default(), Some(e))
            }
        };
        let a = Active {
            run,
            settings,
            unreadable,
            phase: Phase::WaitAgents,
            since: Instant::now(),
            assigned: HashMap::new(),
            results: BTreeMap::new(),
            node0_done: None,
            fence,
            partition,
            trusted_until,
            withheld: BTreeSet::new(),
        };
        self.active.insert(a.run.run_id.clone(), a);
    }

    /// The report in `bytes` if it is authentic, fresh, of this version and signed by a key
    /// that may speak for its node; anything else is refused with a warning.
    fn authentic(&mut self, bytes: &[u8]) -> Option<AgentReport> {
        let (payload, key) = match self.auth.open(Direction::Report, bytes) {
            Ok(opened) => opened,
            Err(e) => {
                tracing::warn!("agent report refused: {e}");
                return None;
            }
        };
        match serde_json::from_str::<AgentReport>(&payload) {
            Ok(r) if !key.covers(&r.node) => {
                tracing::warn!(node = r.node, key = key.id, "agent report refused: the key may not speak for its node");
                None
            }
            Ok(r) if r.version == WIRE_VERSION => Some(r),
            Ok(r) => {
                tracing::warn!(node = r.node, version = r.version, "agent report of another version ignored");
                None
            }
            Err(e) => {
                tracing::warn!("malformed agent report ignored: {e}");
                None
            }
        }
    }

    /// Whether a report about `node_rank` of run `a` comes from that node, from the agent its
    /// task went to: a report about another node's part, or from another agent, is refused.
    fn holds(a: &Active, node: &str, agent_id: &str, node_rank: usize) -> bool {
        let ok = a.run.nodes.get(node_rank).is_some_and(|n| n.name == node)
            && a.assigned.get(&node_rank).is_some_and(|id| id == agent_id);
        if !ok {
            tracing::warn!(
                run_id = a.run.run_id,
                node,
                node_rank,
                agent_id,
                "agent report refused: not from the agent that holds that node of the run"
            );
        }
        ok
    }

    async fn report(&mut self, r: AgentReport) -> Result<()> {
        let address = match &r.body {
            ReportBody::Heartbeat { address, .. } => Some(address.as_str()),
            _ => None,
        };
        if !self.agents.seen(&r.node, &r.agent_id, address, r.at) {
            tracing::warn!(node = r.node, "agent report older than one already seen from that node ignored");
            return Ok(());
        }
        let (node, agent_id) = (r.node.clone(), r.agent_id.clone());
        match r.body {
            ReportBody::Heartbeat { .. } => {}
            ReportBody::Started { run_id, node_rank, master_port } => {
                let Some(a) = self.active.get_mut(&run_id) else { return Ok(()) };
                if !Self::holds(a, &node, &agent_id, node_rank) {
                    return Ok(());
                }
                if node_rank == 0 && a.phase == Phase::WaitMaster {
                    let Some(port) = master_port else { return Ok(()) };
                    let addr = self.agents.known(&r.node).map(|s| s.address.clone()).unwrap_or_default();
                    a.phase = Phase::Running;
                    a.since = Instant::now();
                    let others: Vec<usize> = (1..a.run.nodes.len()).collect();
                    let cmds: Vec<AgentCommand> =
                        others.iter().map(|&k| task(a, k, Some((addr.clone(), port)))).collect();
                    for (k, c) in others.iter().zip(&cmds) {
                        // An agent unknown here counts as lost at the next tick.
                        let id = self.agents.known(&c.node).map(|s| s.agent_id.clone()).unwrap_or_default();
                        a.assigned.insert(*k, id);
                    }
                    for c in cmds {
                        self.send(&c);
                    }
                }
            }
            ReportBody::Result(res) => {
                let run_id = res.run_id.clone();
                let Some(a) = self.active.get_mut(&run_id) else { return Ok(()) };
                if !Self::holds(a, &node, &agent_id, res.node_rank) || a.results.contains_key(&res.node_rank) {
                    return Ok(());
                }
                if res.node_rank == 0 {
                    a.node0_done = Some(Instant::now());
                }
                a.results.insert(res.node_rank, res);
                if a.results.len() == a.run.nodes.len() {
                    self.conclude(&run_id, vec![]).await?;
                }
            }
        }
        Ok(())
    }

    /// Node 0's launcher ended: its report decides the verdict, with `lost` (findings about
    /// nodes whose agent was lost meanwhile) making it a failure.
    async fn conclude(&mut self, run_id: &str, lost: Vec<gpusanity_common::report::Finding>) -> Result<()> {
        let Some(a) = self.active.get(run_id) else { return Ok(()) };
        let Some(res) = a.results.get(&0).cloned() else { return Ok(()) };
        match res.report.as_deref() {
            Some(report) => {
                let keep_job_hang = a.settings.timeout_ops == TimeoutOps::KeepJobHang;
                let verdict = run_verdict(Some(report), ServiceFacts { own: &lost, keep_job_hang });
                let mut summary = report.summary.clone();
                if !lost.is_empty() {
                    let names: Vec<&str> = lost.iter().filter_map(|f| f.host.as_deref()).collect();
                    summary = format!("lost the agent of node(s) {}; {summary}", names.join(", "));
                }
                self.end(run_id, verdict, &summary, Some(report), lost).await
            }
            None => {
                let why = res.error.clone().unwrap_or_else(|| format!("exit code {:?}", res.exit_code));
                let mut findings = lost;
                findings.push(node_finding(
                    &a.run,
                    0,
                    Code::DataPlaneError,
                    format!("node 0's launcher ended without a report: {why}"),
                ));
                self.end(
                    run_id,
                    run_verdict(None, ServiceFacts { own: &findings, keep_job_hang: false }),
                    &format!("the check could not run: {why}"),
                    None,
                    findings,
                )
                .await
            }
        }
    }

    /// Ends a run (stored with its output events), stops its agents, forgets it.
    async fn end(
        &mut self,
        run_id: &str,
        verdict: Verdict,
        summary: &str,
        report: Option<&Report>,
        extra: Vec<gpusanity_common::report::Finding>,
    ) -> Result<()> {
        self.hearing.update();
        let Some(a) = self.active.get(run_id) else { return Ok(()) };
        let mut extra = extra;
        let mut summary = summary.to_string();
        // A verdict reached across a blind spell of the service's own says so, in the event and
        // in the stored findings; nodes whose only evidence is a silence that overlapped it are
        // named but not isolated.
        let across = hearing::across(&self.hearing.spells_with_current(a.run.created_at));
        if let Some(note) = &across {
            summary = format!("{summary}; {note}");
            extra.push(gpusanity_common::report::Finding::new(
                gpusanity_common::report::Severity::Warning,
                Code::ServiceBlind,
                gpusanity_common::report::Scope::Service,
                note.clone(),
            ));
        }
        let withheld: Vec<String> =
            a.withheld.iter().filter_map(|&k| a.run.nodes.get(k).map(|n| n.name.clone())).collect();
        if !withheld.is_empty() && matches!(verdict, Verdict::Failed(_)) {
            summary = format!(
                "{summary}; not isolated: node(s) {}, whose only evidence is a silence that overlapped the service's own outage",
                withheld.join(", ")
            );
        }
        tracing::info!(run_id, ?verdict, summary, "run ends");
        // The run stays active until it is stored: a retry after a database outage finds it.
        let label = verdict.label();
        let end = Ending {
            verdict,
            summary: &summary,
            report,
            extra: &extra,
            fence: Some(&a.fence),
            withheld: &withheld,
            across: across.as_deref(),
        };
        let changed = self.finish_checked(&a.run, end).await?;
        if changed {
            crate::ops::metrics::METRICS.verdict(label.0, &label.1, a.run.created_at);
        }
        let Some(a) = self.active.remove(run_id) else { return Ok(()) };
        if !changed && self.db.get_run(run_id).await?.is_some_and(|r| r.state == ServiceRunState::Checking && !r.held) {
            tracing::warn!(run_id, "the run was taken over by another replica before it ended here: left to it");
            return Ok(());
        }
        self.outbox_wake.notify_one();
        let pending = (0..a.run.nodes.len()).any(|k| !a.results.contains_key(&k));
        if pending {
            self.cancel_agents(&a, &summary);
        }
        Ok(())
    }

    fn cancel_agents(&self, a: &Active, reason: &str) {
        for n in &a.run.nodes {
            let c = AgentCommand {
                version: WIRE_VERSION,
                node: n.name.clone(),
                body: CommandBody::Cancel { run_id: a.run.run_id.clone(), reason: reason.into() },
            };
            self.send(&c);
        }
    }

    /// Queues a command for its node's agent and returns at once (the loop must not wait on
    /// the broker); a failed delivery is logged (the agent then times out).
    /// Tasks carry the run's rendezvous secret, sealed for their node; every command is signed
    /// with the key that covers its node (none: not sent, and the node's agent times out).
    fn send(&self, c: &AgentCommand) {
        let ring = &self.auth.ring;
        let Some(key) = ring.signer_for(&c.node) else {
            tracing::warn!(node = c.node, "no agent key covers this node: its command is not sent");
            return;
        };
        let mut c = c.clone();
        if let CommandBody::Task(t) = &mut c.body {
            let secret = rdzv::run_secret(ring.first(), &t.run_id);
            t.rdzv_secret = Some(rdzv::seal(key, &t.run_id, &c.node, &secret));
        }
        let Ok(payload) = serde_json::to_string(&c) else { return };
        let payload = envelope::seal(key, Direction::Task, payload);
        let rec = FutureRecord::to(&self.topics.agent_tasks).key(&c.node).payload(&payload);
        match self.producer.send_result(rec) {
            Ok(delivery) => {
                let node = c.node.clone();
                tokio::spawn(async move {
                    if let Ok(Err((e, _))) = delivery.await {
                        tracing::warn!(node, "could not send a command to the agent: {e}");
                    }
                });
            }
            Err((e, _)) => tracing::warn!(node = c.node, "could not queue a command for the agent: {e}"),
        }
    }
}

fn task(a: &Active, k: usize, master: Option<(String, u16)>) -> AgentCommand {
    let deadline =
        chrono::DateTime::<chrono::Utc>::from_timestamp_millis(a.run.deadline_at).unwrap_or_else(chrono::Utc::now);
    AgentCommand {
        version: WIRE_VERSION,
        node: a.run.nodes[k].name.clone(),
        body: CommandBody::Task(Task {
            run_id: a.run.run_id.clone(),
            nnodes: a.run.nodes.len(),
            node_rank: k,
            master,
            sanity_check_args: a.run.check_args.clone(),
            deadline,
            rdzv_secret: None,
            gpus: Some(a.run.nodes[k].gpus).filter(|g| *g > 0),
        }),
    }
}

/// Subscribes the coordinator's consumer to the agent-reports topic. Every replica reads every
/// report (a group of its own, `group` being this replica's): a run's reports reach its owner
/// wherever the node's partition is, and every replica knows which agents are alive. A new
/// replica reads the topic once from its start (reports older than `agent_auth.max_age_s` are
/// refused as stale); a restarted one goes on from its committed offsets.
pub fn subscribe(conn: &KafkaConn, group: &str, topic: &str) -> Result<StreamConsumer> {
    let c = gpusanity_bus::kafka::group_consumer(conn, group)?;
    c.subscribe(&[topic])?;
    Ok(c)
}
