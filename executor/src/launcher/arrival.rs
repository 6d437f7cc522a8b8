//! Waiting for every node at the rendezvous, and what happens when one never arrives. Node 0
//! waits until its deadline (the smaller of `--rdzv-timeout` and what is left of
//! `--sanity-check-max-time`), then declares the nodes still missing in the store, so that the
//! nodes that did arrive stop waiting and share node 0's verdict: a missing node is a finding,
//! not a usage error.

use std::time::{Duration, Instant};

use gpusanity_common::report::DeviceKind;
use serde::{Deserialize, Serialize};

use crate::store::{StoreClient, StoreError, MISSING_KEY};

/// Where each node that arrived acknowledges node 0's list.
const ACK_KEY: &str = "rdzv/missing-ack";
/// How long node 0 waits for those acknowledgements.
const ACK_WAIT: Duration = Duration::from_secs(5);
/// How long one wait for a registration lasts before the deadlines are looked at again.
const POLL: Duration = Duration::from_millis(250);
/// How long a node past its own deadline waits for node 0's word (node 0 decides).
const GRACE: Duration = Duration::from_secs(10);

/// Every node's registration (node 0), node 0's roster (the other nodes), or the node ranks
/// that never registered.
#[derive(Debug)]
pub enum Arrival {
    All(Vec<String>),
    Roster(Roster),
    /// `present[k]` is node k's registration, `None` for the missing ones (listed, ascending).
    Missing {
        present: Vec<Option<String>>,
        missing: Vec<usize>,
    },
}

/// Where node 0 publishes its [`Roster`] once every node has come: the number of pieces, the
/// pieces under `rdzv/nodes/I`; or [`MISSING_WORD`] once it has declared nodes missing. The
/// other nodes wait on this one key, without polling: 2,048 nodes asking every 250 ms were
/// 16,000 requests a second at node 0 while it waited for the last of them.
pub const LIST_KEY: &str = "rdzv/nodes";
/// The value of [`LIST_KEY`] when node 0 declared nodes missing ([`MISSING_KEY`] lists them).
const MISSING_WORD: &str = "missing";
/// The longest piece of the roster's text, in bytes (under the store's value bound).
const PIECE: usize = 256 * 1024;
/// The most pieces a roster may have (16 MiB: a million nodes' sizes).
const MAX_PIECES: usize = 64;
/// The longest summary of the nodes that are not ready that the roster carries, in bytes.
const MAX_SUMMARY: usize = 4096;

/// What a node other than node 0 needs of the others: their sizes, whether they all run node
/// 0's backend, whether any is not ready. Node 0 alone reads the registrations (hosts,
/// addresses, devices: it alone reports); every other node reads this, a few bytes a node, so
/// the rendezvous moves O(n) bytes per node rather than every registration to every node
/// (2,048 x 640 KB of doubly escaped JSON at 2,048 nodes, most of the rendezvous's time).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roster {
    /// Node 0's backend.
    pub device: DeviceKind,
    /// Each node's ranks, by node rank.
    pub sizes: Vec<usize>,
    /// The nodes whose backend is not node 0's, ascending.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub odd: Vec<(usize, DeviceKind)>,
    /// Node 0's summary of the findings of the nodes that cannot run the job; empty when every
    /// node can.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub not_ready: String,
}

impl Roster {
    /// The roster of `devices` (each node's backend and ranks, by node rank) with the summary
    /// `not_ready` (cut to [`MAX_SUMMARY`] bytes).
    pub fn new(devices: &[(DeviceKind, usize)], not_ready: &str) -> Roster {
        let device = devices.first().map_or(DeviceKind::Cpu, |d| d.0);
        let odd = devices.iter().enumerate().filter(|(_, d)| d.0 != device).map(|(k, d)| (k, d.0)).collect();
        let mut end = not_ready.len().min(MAX_SUMMARY);
        while !not_ready.is_char_boundary(end) {
            end -= 1;
        }
        Roster { device, sizes: devices.iter().map(|d| d.1).collect(), odd, not_ready: not_ready[..end].into() }
    }

    /// The roster of `nnodes` nodes from the pieces node 0 published, checked.
    pub fn from_pieces(pieces: &[String], nnodes: usize) -> Result<Roster, StoreError> {
        let roster: Roster = serde_json::from_str(&pieces.concat()).map_err(protocol)?;
        if roster.sizes.len() != nnodes {
            return Err(protocol(format!("node 0's roster lists {} nodes of {nnodes}", roster.sizes.len())));
        }
        if roster.odd.len() > nnodes || roster.odd.iter().any(|(k, _)| *k >= nnodes) {
            return Err(protocol("node 0's roster names nodes outside the run"));
        }
        if roster.not_ready.len() > MAX_SUMMARY {
            return Err(protocol(format!("node 0's roster has a summary over {MAX_SUMMARY} bytes")));
        }
        Ok(roster)
    }

    /// The roster's text in pieces of at most [`PIECE`] bytes.
    fn pieces(&self) -> Result<Vec<String>, StoreError> {
        let text = serde_json::to_string(self).map_err(protocol)?;
        let mut pieces = Vec::new();
        let mut rest = text.as_str();
        while !rest.is_empty() {
            let mut end = rest.len().min(PIECE);
            while !rest.is_char_boundary(end) {
                end -= 1;
            }
            let (piece, tail) = rest.split_at(end);
            pieces.push(piece.to_string());
            rest = tail;
        }
        if pieces.len() > MAX_PIECES {
            return Err(protocol(format!("a roster of {} bytes, over {MAX_PIECES} pieces", text.len())));
        }
        Ok(pieces)
    }
}

/// The keys of the roster's pieces, from the count node 0 published under [`LIST_KEY`].
pub fn piece_keys(count: &str) -> Result<Vec<String>, StoreError> {
    let n: usize = count.parse().map_err(protocol)?;
    if n == 0 || n > MAX_PIECES {
        return Err(protocol(format!("node 0's roster in {n} pieces (1 to {MAX_PIECES})")));
    }
    Ok((0..n).map(|i| format!("{LIST_KEY}/{i}")).collect())
}

/// Waits up to `wait` for the registrations of `nnodes` nodes (`node/K`); `me` is this node.
/// Node 0 reads each (then publishes its roster, [`publish`]); the other nodes read the roster.
pub fn wait_all(c: &mut StoreClient, nnodes: usize, wait: Duration, me: usize) -> Result<Arrival, StoreError> {
    if me != 0 {
        return wait_roster(c, nnodes, wait + GRACE, me);
    }
    let deadline = Instant::now() + wait;
    let mut got: Vec<Option<String>> = vec![None; nnodes];
    loop {
        if let Some(k) = got.iter().position(Option::is_none) {
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
            return Ok(Arrival::All(got.into_iter().flatten().collect()));
        }
        if Instant::now() >= deadline {
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
            c.set(LIST_KEY, MISSING_WORD)?;
            // Keep the store up until every node that arrived has read the decision.
            let until = Instant::now() + ACK_WAIT;
            for k in (1..nnodes).filter(|k| got[*k].is_some()) {
                let left = until.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
                let _ = c.get(&format!("{ACK_KEY}/{k}"), left);
            }
            return Ok(Arrival::Missing { present: got, missing });
        }
    }
}

/// A node other than node 0: one wait of up to `wait` for node 0's word under [`LIST_KEY`],
/// then its roster, or the nodes it declared missing (acknowledged: node 0 keeps the store up
/// until the nodes that arrived have read them).
fn wait_roster(c: &mut StoreClient, nnodes: usize, wait: Duration, me: usize) -> Result<Arrival, StoreError> {
    let word = c.get(LIST_KEY, wait)?;
    if word == MISSING_WORD {
        let v = c.get(MISSING_KEY, GRACE)?;
        let missing: Vec<usize> = serde_json::from_str(&v).map_err(protocol)?;
        if missing.iter().any(|&k| k >= nnodes) {
            return Err(protocol(format!("node 0 declared missing a node outside the run of {nnodes}")));
        }
        let _ = c.set(&format!("{ACK_KEY}/{me}"), "1");
        return Ok(Arrival::Missing { present: vec![None; nnodes], missing });
    }
    let pieces = c.get_many(&piece_keys(&word)?, GRACE)?;
    Roster::from_pieces(&pieces, nnodes).map(Arrival::Roster)
}

fn protocol(e: impl std::fmt::Display) -> StoreError {
    StoreError::Protocol(e.to_string())
}

/// Node 0: its roster, in pieces, then their number under [`LIST_KEY`].
pub fn publish(c: &mut StoreClient, roster: &Roster) -> Result<(), StoreError> {
    let pieces = roster.pieces()?;
    for (i, piece) in pieces.iter().enumerate() {
        c.set(&format!("{LIST_KEY}/{i}"), piece)?;
    }
    c.set(LIST_KEY, &pieces.len().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_roster_goes_through_the_store_in_pieces_and_comes_back_whole() {
        let (_rt, addr) = crate::store::test_store();
        let mut c = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
        // 100,000 nodes (sizes alone past one piece) and a summary cut inside a wide character.
        let mut devices = vec![(DeviceKind::Cuda, 16); 100_000];
        devices[7] = (DeviceKind::Cpu, 1);
        let roster = Roster::new(&devices, &"é".repeat(MAX_SUMMARY));
        assert_eq!(roster.not_ready.len(), MAX_SUMMARY);
        assert_eq!(roster.odd, [(7, DeviceKind::Cpu)]);
        assert!(roster.pieces().unwrap().len() > 1);
        publish(&mut c, &roster).unwrap();
        match wait_all(&mut c, devices.len(), Duration::from_secs(5), 3).unwrap() {
            Arrival::Roster(got) => assert_eq!(got, roster),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_forged_or_oversized_roster_is_refused() {
        let ok = Roster::new(&[(DeviceKind::Cuda, 8); 4], "");
        let text = serde_json::to_string(&ok).unwrap();
        assert_eq!(Roster::from_pieces(std::slice::from_ref(&text), 4).unwrap(), ok);
        let refused = |pieces: &[String], nnodes| match Roster::from_pieces(pieces, nnodes) {
            Err(StoreError::Protocol(why)) => why,
            other => panic!("{other:?}"),
        };
        assert!(refused(std::slice::from_ref(&text), 5).contains("4 nodes of 5"));
        assert!(!refused(&[text[..10].to_string()], 4).is_empty(), "a piece missing");
        let odd = Roster { odd: vec![(4, DeviceKind::Cpu)], ..ok.clone() };
        assert!(refused(&[serde_json::to_string(&odd).unwrap()], 4).contains("outside the run"));
        let long = Roster { not_ready: "x".repeat(MAX_SUMMARY + 1), ..ok.clone() };
        assert!(refused(&[serde_json::to_string(&long).unwrap()], 4).contains("summary over"));
        for count in ["0", "65", "-1", "2x", ""] {
            assert!(matches!(piece_keys(count), Err(StoreError::Protocol(_))), "{count}");
        }
        assert_eq!(piece_keys("2").unwrap(), ["rdzv/nodes/0", "rdzv/nodes/1"]);
        let huge = Roster::new(&vec![(DeviceKind::Cuda, usize::MAX); 1_000_000], "");
        assert!(matches!(huge.pieces(), Err(StoreError::Protocol(_))), "over {MAX_PIECES} pieces");
    }
}
