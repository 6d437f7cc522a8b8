//! Waiting for every node at the rendezvous, and what happens when one never arrives. Node 0
//! waits until its deadline (the smaller of `--rdzv-timeout` and what is left of
//! `--sanity-check-max-time`), then declares the nodes still missing in the store, so that the
//! nodes that did arrive stop waiting and share node 0's verdict: a missing node is a finding,
//! not a usage error.

use std::time::{Duration, Instant};

use crate::store::{StoreClient, StoreError, MISSING_KEY};

/// Where each node that arrived acknowledges node 0's list.
const ACK_KEY: &str = "rdzv/missing-ack";
/// How long node 0 waits for those acknowledgements.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// How long one wait for a registration lasts before the deadlines are looked at again.
const POLL: Duration = Duration::from_millis(250);
/// How long a node past its own deadline waits for node 0's word (node 0 decides).
const GRACE: Duration = Duration::from_secs(10);

/// Every node's registration, or the node ranks that never registered.
#[derive(Debug)]
pub enum Arrival {
    All(Vec<String>),
    /// `present[k]` is node k's registration, `None` for the missing ones (listed, ascending).
    Missing {
        present: Vec<Option<String>>,
        missing: Vec<usize>,
    },
}

/// Where node 0 publishes every registration once all have come, [`CHUNK`] per key: a node
/// reads n / CHUNK keys instead of n (every node reading every registration would make n²
/// reads, 4 million at 2,048 nodes).
const LIST_KEY: &str = "rdzv/nodes";
/// Registrations per key of the list (a few hundred bytes each, under the store's value bound).
const CHUNK: usize = 256;

/// Waits up to `wait` for the registrations of `nnodes` nodes (`node/K`); `me` is this node.
/// Node 0 reads each, then publishes them all; the other nodes read that list.
pub fn wait_all(c: &mut StoreClient, nnodes: usize, wait: Duration, me: usize) -> Result<Arrival, StoreError> {
    let is_master = me == 0;
    let deadline = Instant::now() + wait;
    let mut got: Vec<Option<String>> = vec![None; nnodes];
    loop {
        if !is_master {
            let left = deadline.saturating_duration_since(Instant::now());
            match c.get(LIST_KEY, POLL.min(left).max(Duration::from_millis(1))) {
                Ok(chunks) => return read_list(c, &chunks, nnodes).map(Arrival::All),
                Err(StoreError::Timeout(..)) => {}
                Err(e) => return Err(e),
            }
        } else if let Some(k) = got.iter().position(Option::is_none) {
            // Block on the first node still missing; those that came meanwhile answer at once.
            let left = deadline.saturating_duration_since(Instant::now());
            match c.get(&format!("node/{k}"), POLL.min(left).max(Duration::from_millis(1))) {
                Ok(v) => {
                    got[k] = Some(v);
                    continue;
                }
                Err(StoreError::Timeout(..)) => {}
                Err(e) => return Err(e),
            }
        } else {
            let all: Vec<String> = got.into_iter().flatten().collect();
            publish_list(c, &all)?;
            return Ok(Arrival::All(all));
        }
        if !is_master {
            if let Ok(v) = c.get(MISSING_KEY, Duration::from_millis(1)) {
                let missing: Vec<usize> = serde_json::from_str(&v).map_err(|e| StoreError::Protocol(e.to_string()))?;
                // Node 0 keeps the store up until the nodes that arrived have read this.
                let _ = c.set(&format!("{ACK_KEY}/{me}"), "1");
                return Ok(Arrival::Missing { present: got, missing });
            }
        }
        let now = Instant::now();
        if is_master && now >= deadline {
            // One last look at every node still missing, then the decision.
            for (k, slot) in got.iter_mut().enumerate().filter(|(_, s)| s.is_none()) {
                if let Ok(v) = c.get(&format!("node/{k}"), Duration::from_millis(1)) {
                    *slot = Some(v);
                }
            }
            let missing: Vec<usize> = got.iter().enumerate().filter(|(_, s)| s.is_none()).map(|(k, _)| k).collect();
            if missing.is_empty() {
                continue;
            }
            c.set(MISSING_KEY, &serde_json::to_string(&missing).map_err(|e| StoreError::Protocol(e.to_string()))?)?;
            // Keep the store up until every node that arrived has read the decision.
            let until = Instant::now() + ACK_WAIT;
            for k in (1..nnodes).filter(|k| got[*k].is_some()) {
                let left = until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                let _ = c.get(&format!("{ACK_KEY}/{k}"), left);
            }
            return Ok(Arrival::Missing { present: got, missing });
        }
        if !is_master && now >= deadline + GRACE {
            return Err(StoreError::Timeout((wait + GRACE).as_secs_f64(), LIST_KEY.into()));
        }
    }
}

fn protocol(e: impl std::fmt::Display) -> StoreError {
    StoreError::Protocol(e.to_string())
}

/// Node 0: every registration, in chunks, then the number of chunks under [`LIST_KEY`].
fn publish_list(c: &mut StoreClient, all: &[String]) -> Result<(), StoreError> {
    let chunks: Vec<&[String]> = all.chunks(CHUNK).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        c.set(&format!("{LIST_KEY}/{i}"), &serde_json::to_string(chunk).map_err(protocol)?)?;
    }
    c.set(LIST_KEY, &chunks.len().to_string())
}

/// The list node 0 published: `chunks` keys holding `nnodes` registrations in all.
fn read_list(c: &mut StoreClient, chunks: &str, nnodes: usize) -> Result<Vec<String>, StoreError> {
    let chunks: usize = chunks.parse().map_err(protocol)?;
    if chunks != nnodes.div_ceil(CHUNK) {
        return Err(protocol(format!("node 0 lists {chunks} chunks of registrations for {nnodes} nodes")));
    }
    let mut all = Vec::with_capacity(nnodes);
    for i in 0..chunks {
        let part: Vec<String> = serde_json::from_str(&c.get(&format!("{LIST_KEY}/{i}"), GRACE)?).map_err(protocol)?;
        all.extend(part);
    }
    if all.len() != nnodes {
        return Err(protocol(format!("node 0 lists {} registrations for {nnodes} nodes", all.len())));
    }
    Ok(all)
}
