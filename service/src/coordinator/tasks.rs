//! The coordinator's commands to the agents: a node's task (signed, with the run's rendezvous
//! secret sealed for the node) and the cancels of a run's parts.

use gpusanity_common::wire::agent::{AgentCommand, CommandBody, Task};
use gpusanity_common::wire::WIRE_VERSION;
use rdkafka::producer::FutureRecord;

use super::*;
use crate::auth::{envelope, rdzv, Direction};

impl Coordinator {
    /// Tells every node of run `a` to stop its part (an agent without it ignores the cancel).
    pub(super) fn cancel_agents(&self, a: &Active, reason: &str) {
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
    pub(super) fn send(&self, c: &AgentCommand) {
        send_command(&self.producer, &self.auth.ring, &self.topics.agent_tasks, c);
    }
}

/// Signs `c` with the key that covers its node (a task with the run's rendezvous secret sealed
/// for the node) and queues it on `topic`; returns at once, a failed delivery is logged.
pub(crate) fn send_command(
    producer: &rdkafka::producer::FutureProducer,
    ring: &crate::auth::Keyring,
    topic: &str,
    c: &AgentCommand,
) {
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
    let rec = FutureRecord::to(topic).key(&c.node).payload(&payload);
    match producer.send_result(rec) {
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

pub(super) fn task(a: &Active, k: usize, master: Option<(String, u16)>) -> AgentCommand {
    let deadline =
        chrono::DateTime::<chrono::Utc>::from_timestamp_millis(a.run.deadline_at).unwrap_or_else(chrono::Utc::now);
    AgentCommand {
        version: WIRE_VERSION,
        node: a.run.nodes[k].name.clone(),
        body: CommandBody::Task(Task {
            run_id: a.run.run_id.clone(),
            job_id: a.run.job_id.clone(),
            nnodes: a.run.nodes.len(),
            node_rank: k,
            master,
            sanity_check_args: a.run.check_args.clone(),
            deadline,
            rdzv_secret: None,
            gpus: Some(a.run.nodes[k].gpus).filter(|g| *g > 0),
            gpu_ids: a.run.nodes[k].gpu_ids.clone(),
            baseline: None,
        }),
    }
}
