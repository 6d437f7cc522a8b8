//! What the coordinator knows about the agents: who is alive, where, and since when.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::hearing::Hearing;

#[derive(Debug, Clone)]
pub struct AgentSeen {
    pub agent_id: String,
    pub address: String,
    pub last_seen: Instant,
    /// The newest `at` of the node's reports.
    pub last_at: DateTime<Utc>,
}

#[derive(Debug, Default)]
pub struct Agents {
    by_node: HashMap<String, AgentSeen>,
}

impl Agents {
    /// Any message from an agent proves it alive; false (and nothing recorded) for a message
    /// older than one already seen from the node, so that an old agent instance's messages
    /// replayed within the freshness window cannot pass for a replacement of the live one.
    pub fn seen(&mut self, node: &str, agent_id: &str, address: Option<&str>, at: DateTime<Utc>) -> bool {
        let e = self.by_node.entry(node.to_string()).or_insert_with(|| AgentSeen {
            agent_id: agent_id.into(),
            address: address.unwrap_or_default().into(),
            last_seen: Instant::now(),
            last_at: at,
        });
        if at < e.last_at && e.agent_id != agent_id {
            return false;
        }
        e.last_at = e.last_at.max(at);
        e.agent_id = agent_id.into();
        if let Some(a) = address {
            e.address = a.into();
        }
        e.last_seen = Instant::now();
        true
    }

    /// The node's agent if it was heard from within `timeout` of the time the service could
    /// hear ([`Hearing::silence`]: a blind spell of the service's own is no silence of the agent).
    pub fn live(&self, node: &str, timeout: Duration, hearing: &Hearing) -> Option<&AgentSeen> {
        self.by_node.get(node).filter(|a| hearing.silence(a.last_seen) <= timeout)
    }

    /// The node's agent, however long ago it was heard from.
    pub fn known(&self, node: &str) -> Option<&AgentSeen> {
        self.by_node.get(node)
    }

    /// How many agents were heard from within `timeout` (as [`Agents::live`]).
    pub fn live_count(&self, timeout: Duration, hearing: &Hearing) -> usize {
        self.by_node.values().filter(|a| hearing.silence(a.last_seen) <= timeout).count()
    }
}
