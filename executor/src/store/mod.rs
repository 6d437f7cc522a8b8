//! The rendezvous store: a tiny key-value server hosted by node 0's launcher, in the spirit of
//! torch.distributed's TCPStore. Launchers register their nodes and exchange results through
//! it; workers use it to exchange what their backend needs (NCCL unique id, ring addresses) and
//! for barriers.
//!
//! Who talks to whom: every launcher holds connections to node 0's store. Each node's launcher
//! with more than one rank also hosts a store of its own on loopback (127.0.0.1, a port the
//! system picks, the run's secret and the same handshake: [`NodeStore`]) for its own ranks,
//! which hold two connections to it and none to node 0's: requests for node 0's keys go to the
//! node store under [`RELAY_PREFIX`], and its relay ([`relay`]) forwards them, tagged, over one
//! connection to node 0's store. A rank of a node of one rank connects to node 0's store
//! itself. Node 0 so holds connections per node, not per rank. A world-wide round
//! (a check's start barrier, gemm's timed barrier, the re-measure's figure exchange,
//! network-connectivity's barriers and rows) is two-level ([`Rounds`]): a node's ranks meet in
//! their node store (keys naming `local/{node}`), its local rank 0 speaks for the node in node 0's
//! store (`barrier/{name}/nodes/{node}`, `gather/{name}/nodes/{node}` holding the node's
//! values, `bcast/{name}` read back), and rank 0 reads one key per node, not one per rank. The
//! backends' set-up (NCCL ids, the CPU transport's addresses) and the other point-to-point keys
//! are node 0's, reached through the relay.
//!
//! Written here rather than taken from a crate: it is small, has to speak the same protocol
//! from blocking workers and the async launcher, and no maintained crate offers a TCPStore.
//!
//! Wire: one JSON object per line each way. On connect the server sends
//! `{"hello":"gpusanity-store-v1","nonce":N,"auth":A}` (N: 32 fresh random bytes in hex; A:
//! whether the run has a secret). The client answers `{"op":"auth","nonce":C,"proof":P}` with
//! its own fresh nonce C and P = HMAC-SHA256(secret, "gpusanity-store-v1", "client", N, C); the
//! server replies `{"ok":true,"value":Q}` with Q = HMAC-SHA256(secret, ..., "server", N, C), which
//! the client checks (see [`auth`]). Every later request on that connection is trusted: a
//! connection is authenticated once, and a captured handshake is worthless on a new connection,
//! whose server nonce is new. A wrong or missing proof closes the connection. Without a secret
//! the same exchange runs with empty proofs.
//!
//! Then requests `{"op":"set","key":K,"value":V}` and `{"op":"get","key":K,"timeout_ms":T}`
//! (waits until K exists); replies `{"ok":true,"value":V}` or `{"ok":false,"error":E}`.
//! `{"op":"getmany","keys":[K...],"timeout_ms":T}` waits for each of at most [`MAX_BATCH`]
//! keys in turn and replies `{"ok":true,"values":[V...]}`: the values of the first keys, as many
//! as fit in [`MAX_VALUE`] bytes (at least one), the caller asking again for the rest; a wait
//! that runs out replies `{"ok":false,"error":"timeout","values":[...]}` with the values got.
//! Rank 0 of a barrier or of a figure exchange reads thousands of keys in a few round trips.
//! `{"op":"tagged","id":N,"req":R}` serves R (a set, get or getmany) beside the connection's
//! other tagged requests, at most [`MAX_IN_FLIGHT`] at once, and its reply carries `"id":N`:
//! one connection then carries many waits (a node store's relay).
//!
//! Bounds (the server is reachable by anything that reaches node 0): a handshake line of at
//! most [`HANDSHAKE_LINE`] bytes within [`auth::HANDSHAKE_TIMEOUT`], a request line of at most
//! [`MAX_LINE`] (a longer one closes its connection), a key of [`MAX_KEY`], a value of
//! [`MAX_VALUE`]; keys, bytes and connections at once within [`Limits`], which node 0 grows with
//! the run's nodes and ranks ([`limits`]). The keys in [`WRITE_ONCE`] (the verdict, the abort, the missing nodes) may be set once:
//! a second set is refused, so no one overwrites a verdict.
//!
//! The secret authenticates the peers; it does not encrypt or sign the bytes that follow, so
//! an attacker who can rewrite packets on the path between nodes is out of its reach.

mod async_client;
pub mod auth;
pub mod bind;
mod client;
pub mod limits;
mod relay;
mod rounds;
mod server;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use async_client::AsyncStoreClient;
pub use auth::{Secret, SecretError};
pub use bind::{listen, listen_on, BindError, Ports};
pub use client::StoreClient;
pub use limits::{Bounds, Limits};
pub use rounds::{broadcast_key, gather_key, local_key, nodes_barrier_key, Member, NodeStore, Rounds};
pub use server::{serve, serve_within};

/// The longest handshake line, in bytes.
pub const HANDSHAKE_LINE: usize = 1024;
/// The longest request line, in bytes.
pub const MAX_LINE: usize = MAX_VALUE + MAX_VALUE / 2;
/// The longest key, in bytes.
pub const MAX_KEY: usize = 4096;
/// The longest value, in bytes.
pub const MAX_VALUE: usize = 1 << 20;
/// The most keys one `getmany` may ask for.
pub const MAX_BATCH: usize = 4096;
/// The longest wait a `get` or `getmany` may ask for (a longer one waits this long).
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(366 * 24 * 3600);
/// The most tagged requests one connection may have in flight; the next waits for one to end.
pub const MAX_IN_FLIGHT: usize = 1024;
/// Keys under this prefix, asked of a node store, are node 0's: the node store's relay strips
/// the prefix and forwards the request over its one connection to node 0's store.
pub const RELAY_PREFIX: &str = "relay/";
/// The key under which node 0 publishes the run's verdict.
pub const VERDICT_KEY: &str = "verdict";
/// The key under which the first node that stops tells the others.
pub const ABORT_KEY: &str = "abort";
/// The key under which node 0 lists the nodes that never arrived.
pub const MISSING_KEY: &str = "rdzv/missing";
/// Keys set once: a second set is refused.
pub const WRITE_ONCE: [&str; 3] = [VERDICT_KEY, ABORT_KEY, MISSING_KEY];

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("cannot reach the rendezvous at {addr} within {secs:.0} s: {last}")]
    Unreachable { addr: String, secs: f64, last: String },
    #[error("timed out after {0:.1} s waiting for `{1}` in the rendezvous store")]
    Timeout(f64, String),
    #[error("rendezvous connection lost: {0}")]
    Io(#[from] std::io::Error),
    #[error("rendezvous protocol error: {0}")]
    Protocol(String),
    #[error("rendezvous at {addr} refused: {why}")]
    Auth { addr: String, why: String },
    #[error("`{0}` is already set in the rendezvous store and may be set only once")]
    AlreadySet(String),
}

/// The key participant `me` of barrier `name` sets on arrival; `None`: the key participant 0
/// sets once every one has arrived.
fn barrier_key(name: &str, me: Option<usize>) -> String {
    match me {
        Some(me) => format!("barrier/{name}/{me}"),
        None => format!("barrier/{name}/done"),
    }
}

/// The error text of a refused second set of a [`WRITE_ONCE`] key.
const ALREADY_SET: &str = "already set";

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Request {
    Auth {
        nonce: String,
        proof: String,
    },
    Set {
        key: String,
        value: String,
    },
    Get {
        key: String,
        timeout_ms: u64,
    },
    GetMany {
        keys: Vec<String>,
        timeout_ms: u64,
    },
    /// `{"op":"tagged","id":N,"req":{...}}`: `req` (a set, get or getmany) served beside the
    /// connection's other tagged requests, its reply carrying `"id":N` and sent when ready, in
    /// any order. A node store's relay ([`relay`]) multiplexes its ranks' waits over one
    /// connection to node 0 this way.
    Tagged {
        id: u64,
        req: Box<Request>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct Hello {
    hello: String,
    nonce: String,
    auth: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Reply {
    ok: bool,
    #[serde(default)]
    value: String,
    #[serde(default)]
    error: String,
    /// A `getmany`'s values, in the order of its keys.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    values: Vec<String>,
    /// The id of the tagged request this answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    id: Option<u64>,
}

impl Reply {
    fn ok(value: String) -> Reply {
        Reply { ok: true, value, ..Reply::default() }
    }

    fn err(error: impl Into<String>) -> Reply {
        Reply { ok: false, error: error.into(), ..Reply::default() }
    }
}

/// A store served on a runtime of its own, for unit tests: keep the runtime alive while the
/// address is in use.
#[cfg(test)]
pub(crate) fn test_store() -> (tokio::runtime::Runtime, String) {
    test_store_with(None)
}

#[cfg(test)]
pub(crate) fn test_store_with(secret: Option<Secret>) -> (tokio::runtime::Runtime, String) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let listener = rt.block_on(async { listen(([127, 0, 0, 1], 0).into()) }).expect("bind a test store");
    let addr = listener.local_addr().expect("test store address").to_string();
    rt.spawn(serve(listener, secret));
    (rt, addr)
}

#[cfg(test)]
mod relay_tests;
#[cfg(test)]
mod rounds_tests;
#[cfg(test)]
mod tests;
