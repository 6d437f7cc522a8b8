//! The coordinator of `gpusanity serve`: takes the runs the ingest stored, dispatches them to
//! the agents of the job's nodes, supervises agent liveness and the whole-run deadline, and
//! ends every run with a verdict: CheckPassed, CheckFailed, or a KeepJobHang hold.
//!
//! One task owns every active run, so there is no locking: it reacts to notices from the
//! ingest, to agent reports, and to a clock tick. Its state is rebuilt from the database at
//! start-up ([`Coordinator::resume`]); agents ignore a task they already have and answer it
//! again, so re-dispatching after a crash is harmless.

mod agents;
mod baseline;
pub mod config;
mod events;
pub mod finish;
mod gpu_queue;
mod hearing;
pub mod lease;
mod overrun;
mod poison;
mod recheck;
mod reports;
pub(crate) mod tasks;
mod tick;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use gpusanity_common::report::{Code, Report};
use gpusanity_common::verdict::{run_verdict, ServiceFacts, Stop};
use gpusanity_common::wire::agent::NodeResult;
use gpusanity_common::wire::Topics;
use gpusanity_common::{Settings, TimeoutOps};
use gpusanity_db::lease::Fence;
use gpusanity_db::rows::{RunRow, ServiceRunState};
use gpusanity_db::Db;
use gpusanity_ingest::Notice;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::producer::FutureProducer;
use tokio::sync::Notify;

use crate::auth::Verifier;
use agents::Agents;
pub use config::CoordinatorConfig;
use finish::{node_finding, Ending, Verdict};
use hearing::Hearing;
use lease::LeaseState;
pub use lease::Replica;
pub use reports::subscribe;
use tasks::task;

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
    /// Node 0's report as its chunks arrive (`reports.rs`).
    report_chunks: crate::report_chunks::Joiner,
    /// Why the run waits for GPUs another run holds (`gpu_queue.rs`); None once it started.
    gpus_busy: Option<String>,
}

impl Active {
    /// The blind time of the service since the run was created: its deadline moves by it.
    fn blind(&self, hearing: &Hearing) -> Duration {
        hearing.blind_since(self.run.created_at)
    }

    /// Whether every result that can still come is in: node 0's, and that of every node that
    /// got its task from this replica. Once node 0's launcher has ended before the run started
    /// (its result came in `WaitMaster`: it failed before binding its port, or it had finished
    /// before this replica took the run over), no other node gets a task (a task for them
    /// needs node 0's rendezvous port), so none of theirs is waited for: node 0's result
    /// decides the verdict alone.
    fn evidence_complete(&self) -> bool {
        self.results.contains_key(&0) && self.assigned.keys().all(|k| self.results.contains_key(k))
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
    /// The fleet's baselines node 0 of a new run judges with (set when the loop starts).
    baseline: baseline::Latest,
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
            baseline: tokio::sync::watch::channel(None).1,
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
            report_chunks: Default::default(),
            gpus_busy: None,
        };
        self.active.insert(a.run.run_id.clone(), a);
    }

    /// Node 0's launcher ended: its report decides the verdict, with `lost` (findings about
    /// nodes whose agent was lost meanwhile) making it a failure.
    async fn conclude(&mut self, run_id: &str, lost: Vec<gpusanity_common::report::Finding>) -> Result<()> {
        let Some(a) = self.active.get(run_id) else { return Ok(()) };
        let Some(res) = a.results.get(&0).cloned() else { return Ok(()) };
        match res.report.as_deref() {
            Some(report) => {
                let mut summary = report.summary.clone();
                if !lost.is_empty() {
                    let names: Vec<&str> = lost.iter().filter_map(|f| f.host.as_deref()).collect();
                    summary = format!("lost the agent of node(s) {}; {summary}", names.join(", "));
                }
                self.end(run_id, Stop::DataPlane, &summary, Some(report), lost).await
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
                self.end(run_id, Stop::DataPlane, &format!("the check could not run: {why}"), None, findings).await
            }
        }
    }

    /// Ends a run (stored with its output events), stops its agents, forgets it. Its verdict
    /// is [`run_verdict`] of `report`, the service's own findings `extra`, `stop` and the
    /// run's timeout policy.
    async fn end(
        &mut self,
        run_id: &str,
        stop: Stop,
        summary: &str,
        report: Option<&Report>,
        extra: Vec<gpusanity_common::report::Finding>,
    ) -> Result<()> {
        self.hearing.update();
        let Some(a) = self.active.get(run_id) else { return Ok(()) };
        let keep_job_hang = a.settings.timeout_ops == TimeoutOps::KeepJobHang;
        let verdict = run_verdict(report, ServiceFacts { own: &extra, keep_job_hang, stop });
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
        let failed = matches!(verdict, Verdict::Failed(_));
        let end = Ending {
            verdict,
            summary: &summary,
            report,
            extra: &extra,
            fence: Some(&a.fence),
            withheld: &withheld,
            across: across.as_deref(),
            recheck: Some(&self.config.recheck),
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
        // A failed run may have stored re-checks of its nodes: taken up now.
        if failed {
            if let Err(e) = self.claim_now().await {
                tracing::warn!(run_id, "claiming re-checks: {e:#}; taken at the next lease round");
            }
        }
        Ok(())
    }
}
