//! The coordinator's clock: on every tick, the deadlines of the active runs (the whole-run
//! limit, waiting for agents, node 0's rendezvous port, silent or replaced agents) and the
//! dispatches that are due. Every wait is counted on the clock of the service's hearing
//! ([`super::hearing`]): while the service cannot hear its agents, nothing is judged or sent,
//! and the whole-run limit moves by the time it could not.

use anyhow::Result;

use gpusanity_common::fleet::file::BaselineFile;
use gpusanity_common::wire::agent::CommandBody;

use super::*;
use super::{gpu_queue, overrun};

impl Coordinator {
    pub(super) async fn tick(&mut self) -> Result<()> {
        self.hearing.update();
        if self.hearing.blind() {
            return Ok(());
        }
        let blockers = self.gpu_blockers().await?;
        let mut gpu_waits: Vec<(String, Option<String>, i64)> = Vec::new();
        let baseline = self.baseline.borrow().clone();
        let hearing = &self.hearing;
        let timeout = self.config.agent_timeout();
        let wait = self.config.agent_wait();
        let now_ms = gpusanity_db::now_ms();
        let grace_ms = (self.config.deadline_grace_s * 1000.0) as i64;
        let mut ends: Vec<(String, Stop, String, Vec<gpusanity_common::report::Finding>)> = Vec::new();
        let mut sends = Vec::new();
        let mut concludes = Vec::new();
        // Runs whose lease was not renewed in time are not acted on (the lease round drops them).
        let now = Instant::now();
        for (id, a) in self.active.iter_mut() {
            if a.trusted_until <= now {
                continue;
            }
            let names: Vec<String> = a.run.nodes.iter().map(|n| n.name.clone()).collect();
            if let Some(e) = &a.unreadable {
                let f = gpusanity_common::report::Finding::new(
                    gpusanity_common::report::Severity::Critical,
                    gpusanity_common::report::Code::SettingsUnreadable,
                    gpusanity_common::report::Scope::Service,
                    e.to_string(),
                );
                ends.push((id.clone(), Stop::DataPlane, e.to_string(), vec![f]));
                continue;
            }
            let blind_ms = i64::try_from(a.blind(hearing).as_millis()).unwrap_or(i64::MAX);
            if now_ms > a.run.deadline_at.saturating_add(grace_ms).saturating_add(blind_ms) {
                let (summary, findings) = overrun::ending(a, &self.agents);
                for k in (0..names.len()).filter(|k| !a.results.contains_key(k)) {
                    if a.overlapped(k, &self.agents, hearing) {
                        a.withheld.insert(k);
                    }
                }
                ends.push((id.clone(), Stop::Overran, summary, findings));
                continue;
            }
            match a.phase {
                Phase::WaitAgents => {
                    let missing: Vec<usize> =
                        (0..names.len()).filter(|&k| self.agents.live(&names[k], timeout, hearing).is_none()).collect();
                    if missing.is_empty() {
                        if let Some(why) = blockers.get(id) {
                            if a.gpus_busy.as_ref() != Some(why) {
                                a.gpus_busy = Some(why.clone());
                                gpu_waits.push((id.clone(), Some(why.clone()), a.run.deadline_at));
                            }
                            continue;
                        }
                        if a.gpus_busy.take().is_some() {
                            gpu_queue::restart_clock(a, now_ms);
                            gpu_waits.push((id.clone(), None, a.run.deadline_at));
                        }
                        if let Some(s) = self.agents.live(&names[0], timeout, hearing) {
                            a.assigned.insert(0, s.agent_id.clone());
                        }
                        let mut first = task(a, 0, None);
                        if let (CommandBody::Task(t), Some(b)) = (&mut first.body, &baseline) {
                            t.baseline = Some(BaselineFile::clone(b.as_ref()));
                        }
                        sends.push(first);
                        a.phase = Phase::WaitMaster;
                        a.since = Instant::now();
                    } else if hearing.silence(a.since) > wait {
                        for &k in &missing {
                            if a.overlapped(k, &self.agents, hearing) {
                                a.withheld.insert(k);
                            }
                        }
                        let findings = missing
                            .iter()
                            .map(|&k| {
                                node_finding(
                                    &a.run,
                                    k,
                                    Code::NoAgent,
                                    format!("node {} has no live gpusanity agent", names[k]),
                                )
                            })
                            .collect();
                        let list: Vec<&str> = missing.iter().map(|&k| names[k].as_str()).collect();
                        ends.push((
                            id.clone(),
                            Stop::Agents,
                            format!("no live agent on node(s) {}", list.join(", ")),
                            findings,
                        ));
                    }
                }
                Phase::WaitMaster | Phase::Running => {
                    // A node whose agent went silent, or was replaced, before its launcher ended.
                    let lost: Vec<usize> = a
                        .assigned
                        .iter()
                        .filter(|(k, agent_id)| {
                            !a.results.contains_key(k)
                                && self
                                    .agents
                                    .live(&names[**k], timeout, hearing)
                                    .is_none_or(|s| &s.agent_id != *agent_id)
                        })
                        .map(|(k, _)| *k)
                        .collect();
                    for &k in &lost {
                        if a.overlapped(k, &self.agents, hearing) {
                            a.withheld.insert(k);
                        }
                    }
                    let lost_findings: Vec<gpusanity_common::report::Finding> = {
                        let mut lost = lost;
                        lost.sort_unstable();
                        lost.iter()
                            .map(|&k| {
                                node_finding(
                                    &a.run,
                                    k,
                                    Code::AgentLost,
                                    format!("the agent of node {} went silent during the run", names[k]),
                                )
                            })
                            .collect()
                    };
                    if let Some(done) = a.node0_done {
                        if !lost_findings.is_empty() || hearing.silence(done) > timeout {
                            concludes.push((id.clone(), lost_findings));
                        }
                    } else if !lost_findings.is_empty() {
                        let list: Vec<&str> = lost_findings.iter().filter_map(|f| f.host.as_deref()).collect();
                        let summary = format!("lost the agent of node(s) {}", list.join(", "));
                        ends.push((id.clone(), Stop::Agents, summary, lost_findings));
                    } else if a.phase == Phase::WaitMaster && hearing.silence(a.since) > wait {
                        if a.overlapped(0, &self.agents, hearing) {
                            a.withheld.insert(0);
                        }
                        let f = node_finding(
                            &a.run,
                            0,
                            Code::AgentNoStart,
                            format!("the agent of node {} did not start the run", names[0]),
                        );
                        ends.push((
                            id.clone(),
                            Stop::Agents,
                            format!("node {} did not start the run", names[0]),
                            vec![f],
                        ));
                    }
                }
            }
        }
        for (id, why, deadline_at) in gpu_waits {
            self.record_gpu_wait(&id, why.as_deref(), deadline_at).await?;
        }
        for c in sends {
            self.send(&c);
        }
        for (id, v, summary, findings) in ends {
            self.end(&id, v, &summary, None, findings).await?;
        }
        for (id, lost) in concludes {
            self.conclude(&id, lost).await?;
        }
        Ok(())
    }
}
