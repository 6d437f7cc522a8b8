//! The agents' reports: opened and checked (authentic, fresh, of this version, from the agent
//! that holds that node of the run), then taken in: a heartbeat proves its agent alive, node
//! 0's `Started` sends the other nodes their tasks, a `Result` is kept and may conclude the run.

use anyhow::Result;
use gpusanity_bus::kafka::KafkaConn;
use gpusanity_common::wire::agent::{AgentCommand, AgentReport, ReportBody};
use rdkafka::consumer::{Consumer, StreamConsumer};

use super::*;
use crate::auth::Direction;

impl Coordinator {
    /// The report in `bytes` if it is authentic, fresh, of this version and signed by a key
    /// that may speak for its node; anything else is refused with a warning.
    pub(super) fn authentic(&mut self, bytes: &[u8]) -> Option<AgentReport> {
        match self.auth.open_as::<AgentReport>(Direction::Report, bytes) {
            Ok((r, _)) => Some(r),
            Err(e) => {
                tracing::warn!("agent report refused: {e}");
                None
            }
        }
    }

    /// Whether a report about `node_rank` of run `a` comes from that node, from the agent its
    /// task went to: a report about another node's part, or from another agent, is refused.
    pub(super) fn holds(a: &Active, node: &str, agent_id: &str, node_rank: usize) -> bool {
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

    /// Node 0's report in chunks: a chunk from the agent holding node 0 of an active run is
    /// joined to the run's stream; a `Result` announcing chunks gets the joined report, or,
    /// when the stream is broken or incomplete, an error saying so (the run then ends without
    /// a report, as an error: never silently). Anything else passes unchanged.
    pub(super) fn join_report(&mut self, r: &mut AgentReport) {
        let (node, agent_id) = (r.node.as_str(), r.agent_id.as_str());
        match &mut r.body {
            ReportBody::ReportChunk(c) => {
                let Some(a) = self.active.get_mut(&c.run_id) else { return };
                if c.node_rank != 0 || !Self::holds(a, node, agent_id, c.node_rank) {
                    return;
                }
                if let Err(e) = a.report_chunks.push(c) {
                    tracing::warn!(run_id = c.run_id, seq = c.seq, "chunk of node 0's report refused: {e}");
                }
            }
            ReportBody::Result(res) => {
                let Some(meta) = res.report_chunks.take() else { return };
                let Some(a) = self.active.get_mut(&res.run_id) else { return };
                if res.node_rank != 0 || !Self::holds(a, node, agent_id, res.node_rank) {
                    return;
                }
                match std::mem::take(&mut a.report_chunks).finish(&meta) {
                    Ok(report) => res.report = Some(Box::new(report)),
                    Err(e) => {
                        tracing::warn!(run_id = res.run_id, "node 0's report arrived incomplete: {e}");
                        let why = format!("node 0's report arrived incomplete ({} chunks announced): {e}", meta.chunks);
                        res.error = Some(match res.error.take() {
                            Some(prev) => format!("{prev}; {why}"),
                            None => why,
                        });
                    }
                }
            }
            ReportBody::Heartbeat { .. } | ReportBody::Started { .. } => {}
        }
    }

    pub(super) async fn report(&mut self, r: AgentReport) -> Result<()> {
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
            // Joined by `join_report` before; it proves its agent alive like a heartbeat.
            ReportBody::Heartbeat { .. } | ReportBody::ReportChunk(_) => {}
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
                if !Self::holds(a, &node, &agent_id, res.node_rank) {
                    return Ok(());
                }
                // A result already in is not taken again, but it may conclude the run: the
                // same report handled again after its run's end failed (a database outage).
                if !a.results.contains_key(&res.node_rank) {
                    if res.node_rank == 0 {
                        a.node0_done = Some(Instant::now());
                    }
                    a.results.insert(res.node_rank, res);
                }
                if a.evidence_complete() {
                    self.conclude(&run_id, vec![]).await?;
                }
            }
        }
        Ok(())
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
