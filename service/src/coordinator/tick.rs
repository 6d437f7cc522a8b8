//! The coordinator's clock: on every tick, the deadlines of the active runs (the whole-run
//! limit, waiting for agents, node 0's rendezvous port, silent or replaced agents) and the
//! dispatches that are due. Every wait is counted on the clock of the service's hearing
//! ([`super::hearing`]): while the service cannot hear its agents, nothing is judged or sent,
//! and the whole-run limit moves by the time it could not.

use anyhow::Result;

use gpusanity_common::fleet::file::BaselineFile;
use gpusanity_common::report::{Finding, Scope, Severity};
use gpusanity_common::wire::agent::{AgentCommand, CommandBody};

use super::*;
use super::{gpu_queue, overrun};

/// What one tick decided, carried out once every run is looked at.
#[derive(Default)]
struct Due {
    /// Runs whose wait for GPUs began, changed or ended: the run, why it waits, its deadline.
    gpu_waits: Vec<(String, Option<String>, i64)>,
    /// Node 0's tasks.
    sends: Vec<AgentCommand>,
    /// Runs that end now: the run, why, the summary, the findings.
    ends: Vec<(String, Stop, String, Vec<Finding>)>,
    /// Runs whose node 0 has ended and whose other nodes are heard or lost: the run and the
    /// findings of its lost nodes.
    concludes: Vec<(String, Vec<Finding>)>,
}

/// What a tick judges each run by: the agents as heard, the GPUs other runs hold, the fleet
/// baseline, the waits and the time.
struct Clock<'a> {
    agents: &'a Agents,
    hearing: &'a Hearing,
    /// Why each run waits for GPUs another run holds.
    blockers: &'a HashMap<String, String>,
    baseline: Option<Arc<BaselineFile>>,
    /// How long an agent stays live without being heard.
    timeout: Duration,
    /// How long a run waits for its agents, or for node 0 to start it.
    wait: Duration,
    now_ms: i64,
    grace_ms: i64,
}

impl Coordinator {
    pub(super) async fn tick(&mut self) -> Result<()> {
        self.hearing.update();
        if self.hearing.blind() {
            return Ok(());
        }
        let blockers = self.gpu_blockers().await?;
        let clock = Clock {
            agents: &self.agents,
            hearing: &self.hearing,
            blockers: &blockers,
            baseline: self.baseline.borrow().clone(),
            timeout: self.config.agent_timeout(),
            wait: self.config.agent_wait(),
            now_ms: gpusanity_db::now_ms(),
            grace_ms: (self.config.deadline_grace_s * 1000.0) as i64,
        };
        let mut due = Due::default();
        // Runs whose lease was not renewed in time are not acted on (the lease round drops them).
        let now = Instant::now();
        for (id, a) in self.active.iter_mut().filter(|(_, a)| a.trusted_until > now) {
            clock.judge(id, a, &mut due);
        }
        self.carry_out(due).await
    }

    /// Records the GPU waits, sends the tasks, ends and concludes the runs a tick decided on.
    async fn carry_out(&mut self, due: Due) -> Result<()> {
        for (id, why, deadline_at) in due.gpu_waits {
            self.record_gpu_wait(&id, why.as_deref(), deadline_at).await?;
        }
        for c in due.sends {
            self.send(&c);
        }
        for (id, v, summary, findings) in due.ends {
            self.end(&id, v, &summary, None, findings).await?;
        }
        for (id, lost) in due.concludes {
            self.conclude(&id, lost).await?;
        }
        Ok(())
    }
}

impl Clock<'_> {
    /// Judges one run: unreadable settings, the whole-run limit, then the deadline of its phase.
    fn judge(&self, id: &str, a: &mut Active, due: &mut Due) {
        if let Some(e) = &a.unreadable {
            let f = Finding::new(Severity::Critical, Code::SettingsUnreadable, Scope::Service, e.to_string());
            due.ends.push((id.to_string(), Stop::DataPlane, e.to_string(), vec![f]));
            return;
        }
        if self.overran(id, a, due) {
            return;
        }
        match a.phase {
            Phase::WaitAgents => self.wait_agents(id, a, due),
            Phase::WaitMaster | Phase::Running => self.watch_agents(id, a, due),
        }
    }

    /// Ends the run if it is past its whole-run limit (moved by the grace and the service's
    /// blind time); whether it did.
    fn overran(&self, id: &str, a: &mut Active, due: &mut Due) -> bool {
        let blind_ms = i64::try_from(a.blind(self.hearing).as_millis()).unwrap_or(i64::MAX);
        if self.now_ms <= a.run.deadline_at.saturating_add(self.grace_ms).saturating_add(blind_ms) {
            return false;
        }
        let (summary, findings) = overrun::ending(a, self.agents);
        let unfinished: Vec<usize> = (0..a.run.nodes.len()).filter(|k| !a.results.contains_key(k)).collect();
        for k in unfinished {
            self.withhold_if_overlapped(a, k);
        }
        due.ends.push((id.to_string(), Stop::Overran, summary, findings));
        true
    }

    /// `WaitAgents`: starts the run once every node has a live agent, or ends it when some
    /// have none after the wait.
    fn wait_agents(&self, id: &str, a: &mut Active, due: &mut Due) {
        let names = node_names(a);
        let missing: Vec<usize> =
            (0..names.len()).filter(|&k| self.agents.live(&names[k], self.timeout, self.hearing).is_none()).collect();
        if missing.is_empty() {
            self.start(id, a, &names[0], due);
        } else if self.hearing.silence(a.since) > self.wait {
            for &k in &missing {
                self.withhold_if_overlapped(a, k);
            }
            let findings = missing
                .iter()
                .map(|&k| {
                    node_finding(&a.run, k, Code::NoAgent, format!("node {} has no live gpusanity agent", names[k]))
                })
                .collect();
            let list: Vec<&str> = missing.iter().map(|&k| names[k].as_str()).collect();
            let summary = format!("no live agent on node(s) {}", list.join(", "));
            due.ends.push((id.to_string(), Stop::Agents, summary, findings));
        }
    }

    /// Sends node 0 its task, unless the run waits for GPUs another run holds (a change of
    /// that wait is recorded).
    fn start(&self, id: &str, a: &mut Active, node0: &str, due: &mut Due) {
        if let Some(why) = self.blockers.get(id) {
            if a.gpus_busy.as_ref() != Some(why) {
                a.gpus_busy = Some(why.clone());
                due.gpu_waits.push((id.to_string(), Some(why.clone()), a.run.deadline_at));
            }
            return;
        }
        if a.gpus_busy.take().is_some() {
            gpu_queue::restart_clock(a, self.now_ms);
            due.gpu_waits.push((id.to_string(), None, a.run.deadline_at));
        }
        if let Some(s) = self.agents.live(node0, self.timeout, self.hearing) {
            a.assigned.insert(0, s.agent_id.clone());
        }
        let mut first = task(a, 0, None);
        if let (CommandBody::Task(t), Some(b)) = (&mut first.body, &self.baseline) {
            t.baseline = Some(BaselineFile::clone(b.as_ref()));
        }
        due.sends.push(first);
        a.phase = Phase::WaitMaster;
        a.since = Instant::now();
    }

    /// `WaitMaster` and `Running`: concludes the run once node 0 has ended and the others are
    /// in or lost, ends it on a lost agent, or when node 0 did not start it in time.
    fn watch_agents(&self, id: &str, a: &mut Active, due: &mut Due) {
        let names = node_names(a);
        let lost = self.lost(a, &names);
        if let Some(done) = a.node0_done {
            if !lost.is_empty() || self.hearing.silence(done) > self.timeout {
                due.concludes.push((id.to_string(), lost));
            }
        } else if !lost.is_empty() {
            let list: Vec<&str> = lost.iter().filter_map(|f| f.host.as_deref()).collect();
            let summary = format!("lost the agent of node(s) {}", list.join(", "));
            due.ends.push((id.to_string(), Stop::Agents, summary, lost));
        } else if a.phase == Phase::WaitMaster && self.hearing.silence(a.since) > self.wait {
            self.withhold_if_overlapped(a, 0);
            let f = node_finding(
                &a.run,
                0,
                Code::AgentNoStart,
                format!("the agent of node {} did not start the run", names[0]),
            );
            let summary = format!("node {} did not start the run", names[0]);
            due.ends.push((id.to_string(), Stop::Agents, summary, vec![f]));
        }
    }

    /// The findings of the nodes whose agent went silent, or was replaced, before its launcher
    /// ended, in node order.
    fn lost(&self, a: &mut Active, names: &[String]) -> Vec<Finding> {
        let mut lost: Vec<usize> = a
            .assigned
            .iter()
            .filter(|(k, agent_id)| {
                !a.results.contains_key(k)
                    && self
                        .agents
                        .live(&names[**k], self.timeout, self.hearing)
                        .is_none_or(|s| &s.agent_id != *agent_id)
            })
            .map(|(k, _)| *k)
            .collect();
        for &k in &lost {
            self.withhold_if_overlapped(a, k);
        }
        lost.sort_unstable();
        lost.iter()
            .map(|&k| {
                let what = format!("the agent of node {} went silent during the run", names[k]);
                node_finding(&a.run, k, Code::AgentLost, what)
            })
            .collect()
    }

    /// Names node `k` rather than isolating it where its silence overlapped a blind spell of
    /// the service's own.
    fn withhold_if_overlapped(&self, a: &mut Active, k: usize) {
        if a.overlapped(k, self.agents, self.hearing) {
            a.withheld.insert(k);
        }
    }
}

/// The run's node names, node 0 first.
fn node_names(a: &Active) -> Vec<String> {
    a.run.nodes.iter().map(|n| n.name.clone()).collect()
}
