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

/// Waits up to `wait` for the registrations of `nnodes` nodes (`node/K`); `me` is this node.
pub fn wait_all(c: &mut StoreClient, nnodes: usize, wait: Duration, me: usize) -> Result<Arrival, StoreError> {
    let is_master = me == 0;
    let deadline = Instant::now() + wait;
    let mut got: Vec<Option<String>> = vec![None; nnodes];
    loop {
        // Block on the first node still missing; those that came meanwhile answer at once.
        if let Some(k) = got.iter().position(Option::is_none) {
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
            return Ok(Arrival::All(got.into_iter().flatten().collect()));
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
            let k = got.iter().position(Option::is_none).unwrap_or(0);
            return Err(StoreError::Timeout((wait + GRACE).as_secs_f64(), format!("node/{k}")));
        }
    }
}
