//! World-wide rounds in two levels: a rank's own node first, then one voice per node in node 0's
//! store.
//!
//! Every node's launcher hosts a store of its own on loopback for its ranks (same secret, same
//! handshake). A world-wide round (a barrier, a gather to rank 0, a broadcast from rank 0) runs:
//!
//! 1. in the node store, among the node's ranks: each sets `local/{node}/...` keys there and its
//!    local rank 0 (the node's *leader*) reads them;
//! 2. in node 0's store, among the nodes' leaders, keyed by node rank: rank 0 (node 0's leader)
//!    reads one key per node, not one per rank;
//! 3. back the same way: the leaders read node 0's answer and publish it in their node store,
//!    where their ranks read it.
//!
//! Node 0's store so sees O(nodes) operations per round, not O(ranks). A node of one rank has no
//! node store and skips step 1 (it is its own leader). Without a node store (a worker spec that
//! names none) the node-level keys go to node 0's store under the same names: the rounds stay
//! correct, only node 0 carries the node-level traffic too.
//!
//! [`Rounds`] derefs to node 0's client for everything else (the backends' set-up, point-to-point
//! keys); on a node with a node store that client goes through the node store's relay
//! ([`super::relay`]). [`Rounds::set_namespace`] applies to both connections.

use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};

use super::client::{arrivals, StoreClient};
use super::{barrier_key, StoreError, MAX_VALUE};

/// Where a rank sits: what the rounds need to know of the run's shape.
#[derive(Debug, Clone)]
pub struct Member {
    pub rank: usize,
    pub node_rank: usize,
    pub local_rank: usize,
    /// Ranks per node, by node rank; ranks are numbered node by node.
    pub node_sizes: Vec<usize>,
}

/// Node 0's client and, where the node has more than one rank, its node store's client.
pub struct Rounds {
    world: StoreClient,
    node: Option<StoreClient>,
    me: Member,
    /// The node of rank 0, which answers the node-level rounds.
    root: usize,
}

impl Rounds {
    /// The rounds of `me`, through node 0's store (`world`) and its node's (`node`).
    pub fn new(world: StoreClient, node: Option<StoreClient>, me: Member) -> Result<Rounds, StoreError> {
        let bad = |why: String| Err(StoreError::Protocol(format!("rank {}: {why}", me.rank)));
        let Some(&local_n) = me.node_sizes.get(me.node_rank) else {
            return bad(format!("node {} is not among {} nodes", me.node_rank, me.node_sizes.len()));
        };
        if me.local_rank >= local_n {
            return bad(format!("local rank {} on a node of {local_n}", me.local_rank));
        }
        let root = me.node_sizes.iter().position(|&k| k > 0).unwrap_or(0);
        let rounds = Rounds { world, node, me, root };
        let first = rounds.first_rank(rounds.me.node_rank);
        if first.and_then(|o| o.checked_add(rounds.me.local_rank)) != Some(rounds.me.rank) {
            return Err(StoreError::Protocol(format!("rank {}: ranks are not numbered node by node", rounds.me.rank)));
        }
        Ok(rounds)
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.me.rank
    }

    /// Prefixes every key of later calls, on both connections (see [`StoreClient::set_namespace`]).
    pub fn set_namespace(&mut self, namespace: &str) {
        self.world.set_namespace(namespace);
        if let Some(n) = &mut self.node {
            n.set_namespace(namespace);
        }
    }

    /// The client of this node's store (node 0's without one): for rounds among the node's ranks.
    pub fn local(&mut self) -> &mut StoreClient {
        self.node.as_mut().unwrap_or(&mut self.world)
    }

    fn local_n(&self) -> usize {
        self.me.node_sizes.get(self.me.node_rank).copied().unwrap_or(1)
    }

    fn leader(&self) -> bool {
        self.me.local_rank == 0
    }

    /// The nodes other than rank 0's that have ranks: the leaders rank 0 hears from.
    fn other_nodes(&self) -> Vec<usize> {
        (0..self.me.node_sizes.len()).filter(|&k| k != self.root && self.me.node_sizes[k] > 0).collect()
    }

    /// The first rank of node `k`.
    fn first_rank(&self, k: usize) -> Option<usize> {
        self.me.node_sizes.get(..k)?.iter().try_fold(0usize, |a, &n| a.checked_add(n))
    }

    fn local_name(&self, name: &str) -> String {
        local_key(self.me.node_rank, name)
    }

    /// Every rank of the world waits until every one has arrived at barrier `name`, within
    /// `timeout` in all.
    pub fn barrier_all(&mut self, name: &str, timeout: Duration) -> Result<(), StoreError> {
        let deadline = Deadline::new(timeout);
        let local = self.local_name(name);
        let local_n = self.local_n();
        if local_n > 1 {
            let me = self.me.local_rank;
            let node = self.local();
            if me != 0 {
                node.set(&barrier_key(&local, Some(me)), "1")?;
                return node.get(&barrier_key(&local, None), deadline.left()).map(|_| ());
            }
            node.get_many(&arrivals(&local, local_n), deadline.left())?;
        }
        if self.me.node_rank == self.root {
            let keys: Vec<String> = self.other_nodes().into_iter().map(|k| nodes_barrier_key(name, Some(k))).collect();
            self.world.get_many(&keys, deadline.left())?;
            self.world.set(&nodes_barrier_key(name, None), "1")?;
        } else {
            self.world.set(&nodes_barrier_key(name, Some(self.me.node_rank)), "1")?;
            self.world.get(&nodes_barrier_key(name, None), deadline.left())?;
        }
        if local_n > 1 {
            self.local().set(&barrier_key(&local, None), "1")?;
        }
        Ok(())
    }

    /// Every rank gives `value` for round `name`; rank 0 gets them all, by rank (`None` on the
    /// others), within `timeout`. A node's values travel to node 0 as one value; a node whose
    /// values would not fit in one (over [`MAX_VALUE`] once escaped in a request) gives them
    /// rank by rank instead, as a flat round would.
    pub fn gather(&mut self, name: &str, value: &str, timeout: Duration) -> Result<Option<Vec<String>>, StoreError> {
        let deadline = Deadline::new(timeout);
        let local = self.local_name(&format!("gather/{name}"));
        let local_n = self.local_n();
        let mut values = vec![value.to_string()];
        if local_n > 1 {
            let me = self.me.local_rank;
            let node = self.local();
            if me != 0 {
                node.set(&format!("{local}/{me}"), value)?;
                return Ok(None);
            }
            let keys: Vec<String> = (1..local_n).map(|l| format!("{local}/{l}")).collect();
            values.extend(node.get_many(&keys, deadline.left())?);
        }
        let key = |k: usize| gather_key(name, k);
        if self.me.node_rank != self.root {
            let mut packed = serde_json::to_string(&values).map_err(|e| StoreError::Protocol(e.to_string()))?;
            if escaped_len(&packed)? > MAX_VALUE {
                // Too big for one value: each rank's under a key of its own, as a flat round.
                let first = self.me.rank;
                for (i, v) in values.iter().enumerate() {
                    self.world.set(&rank_key(name, first.saturating_add(i)), v)?;
                }
                packed = serde_json::to_string(&Packed::PerRank { first })
                    .map_err(|e| StoreError::Protocol(e.to_string()))?;
            }
            self.world.set(&key(self.me.node_rank), &packed)?;
            return Ok(None);
        }
        let nodes = self.other_nodes();
        let keys: Vec<String> = nodes.iter().map(|&k| key(k)).collect();
        for (k, packed) in nodes.into_iter().zip(self.world.get_many(&keys, deadline.left())?) {
            let want = self.me.node_sizes[k];
            let theirs = match serde_json::from_str(&packed) {
                Ok(Packed::Values(v)) => v,
                Ok(Packed::PerRank { first }) if Some(first) == self.first_rank(k) => {
                    let keys: Vec<String> = (0..want).map(|i| rank_key(name, first.saturating_add(i))).collect();
                    self.world.get_many(&keys, deadline.left())?
                }
                Ok(Packed::PerRank { first }) => {
                    return Err(StoreError::Protocol(format!("node {k} places its values of `{name}` at rank {first}")))
                }
                Err(e) => return Err(StoreError::Protocol(format!("node {k}'s values of `{name}`: {e}"))),
            };
            if theirs.len() != want {
                return Err(StoreError::Protocol(format!(
                    "node {k} gave {} values of `{name}` for its {want} ranks",
                    theirs.len()
                )));
            }
            values.extend(theirs);
        }
        Ok(Some(values))
    }

    /// Rank 0 publishes `value` for round `name` (the others pass `None`); every rank returns
    /// it, within `timeout`.
    pub fn broadcast(&mut self, name: &str, value: Option<&str>, timeout: Duration) -> Result<String, StoreError> {
        let deadline = Deadline::new(timeout);
        let local = self.local_name(&format!("bcast/{name}"));
        let local_n = self.local_n();
        if !self.leader() {
            return self.local().get(&local, deadline.left());
        }
        let world = broadcast_key(name);
        let value = if self.me.rank == 0 {
            let v =
                value.ok_or_else(|| StoreError::Protocol(format!("rank 0 has no value to broadcast for `{name}`")))?;
            self.world.set(&world, v)?;
            v.to_string()
        } else {
            self.world.get(&world, deadline.left())?
        };
        if local_n > 1 {
            self.local().set(&local, &value)?;
        }
        Ok(value)
    }
}

/// The key in node 0's store that node `node`'s leader sets on arriving at barrier `name`;
/// `None`: the key rank 0 sets once every node has arrived.
pub fn nodes_barrier_key(name: &str, node: Option<usize>) -> String {
    barrier_key(&format!("{name}/nodes"), node)
}

/// The key in node 0's store under which node `node`'s leader gives its ranks' values of
/// gather `name` (a JSON list of strings, by local rank).
pub fn gather_key(name: &str, node: usize) -> String {
    format!("gather/{name}/nodes/{node}")
}

/// What a node's leader gives for a gather: its ranks' values, or where they are when they do
/// not fit in one value.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(untagged)]
enum Packed {
    Values(Vec<String>),
    PerRank { first: usize },
}

/// The bytes of `value` escaped in a request line.
fn escaped_len(value: &str) -> Result<usize, StoreError> {
    serde_json::to_string(value).map(|s| s.len()).map_err(|e| StoreError::Protocol(e.to_string()))
}

/// The key of rank `rank`'s value of gather `name` when its node's do not fit in one value.
fn rank_key(name: &str, rank: usize) -> String {
    format!("gather/{name}/ranks/{rank}")
}

/// The key in node 0's store under which rank 0 publishes broadcast `name`.
pub fn broadcast_key(name: &str) -> String {
    format!("bcast/{name}")
}

/// The name of round `name` among node `node`'s ranks, in its node store.
pub fn local_key(node: usize, name: &str) -> String {
    format!("local/{node}/{name}")
}

impl Deref for Rounds {
    type Target = StoreClient;

    fn deref(&self) -> &StoreClient {
        &self.world
    }
}

impl DerefMut for Rounds {
    fn deref_mut(&mut self) -> &mut StoreClient {
        &mut self.world
    }
}

/// One round's time limit, shared by its steps.
struct Deadline(Option<Instant>, Duration);

impl Deadline {
    fn new(timeout: Duration) -> Deadline {
        Deadline(Instant::now().checked_add(timeout), timeout)
    }

    fn left(&self) -> Duration {
        match self.0 {
            Some(end) => end.saturating_duration_since(Instant::now()),
            None => self.1,
        }
    }
}

/// A node's own store, on loopback, for its ranks' rounds: same secret and handshake as node
/// 0's, served until dropped. Start it inside a tokio runtime.
pub struct NodeStore {
    addr: String,
    task: tokio::task::JoinHandle<()>,
}

impl NodeStore {
    /// Serves a store for `ranks` ranks on 127.0.0.1, on a port the system picks, relaying the
    /// keys under [`super::RELAY_PREFIX`] to node 0's store at `node0` (see [`super::relay`]).
    pub fn start(secret: Option<super::Secret>, ranks: usize, node0: &str) -> std::io::Result<NodeStore> {
        let listener = super::listen((std::net::Ipv4Addr::LOCALHOST, 0).into())?;
        let addr = listener.local_addr()?.to_string();
        let bounds = super::Bounds::new(super::Limits::for_run(1, ranks));
        let relay = super::relay::Relay::new(node0.to_string(), secret.clone());
        let task = tokio::spawn(super::server::serve_relaying(listener, secret, bounds, Some(relay)));
        Ok(NodeStore { addr, task })
    }

    /// Where the node's ranks connect.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

impl Drop for NodeStore {
    fn drop(&mut self) {
        self.task.abort();
    }
}
