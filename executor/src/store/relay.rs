//! A node store's relay to node 0's store: the node's ranks ask their own store for keys under
//! [`RELAY_PREFIX`], and the relay forwards each such request, prefix stripped, over one
//! connection to node 0's store, as a tagged request ([`Request::Tagged`]) beside the others
//! in flight; each reply goes back to the rank that asked. Node 0 so holds one connection per
//! node for its ranks' set-up and point-to-point keys (NCCL ids, the CPU transport's
//! addresses, the link test's figures), not one per rank.
//!
//! The connection is opened at the first forwarded request (node 0's store is up by then: the
//! launcher met it before starting its workers), authenticated with the run's secret like any
//! other, and opened again after it breaks. What node 0's store answers is bounded like any
//! reply ([`MAX_LINE`]); a reply to no request in flight is dropped.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::oneshot;

use super::auth::Secret;
use super::{AsyncStoreClient, Reply, Request, StoreError, MAX_LINE, MAX_WAIT, RELAY_PREFIX};

/// How long past a request's own wait its reply may take before node 0 counts as gone.
const REPLY_MARGIN: Duration = Duration::from_secs(10);
/// How long the relay tries to open its connection (node 0 accepting a thousand nodes at once
/// may cut a handshake short).
const CONNECT_FOR: Duration = Duration::from_secs(10);

/// Where a request to a node store is served.
pub(super) enum Route {
    /// In this store.
    Here(Request),
    /// In node 0's, through the relay (keys stripped of [`RELAY_PREFIX`]).
    Node0(Request),
}

/// The relay of one node store: where node 0's store is, and the connection to it.
pub struct Relay {
    addr: String,
    secret: Option<Secret>,
    link: tokio::sync::Mutex<Option<Link>>,
}

/// One open connection to node 0's store.
struct Link {
    writer: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
    shared: Arc<Shared>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// What the connection's reader and the callers share.
struct Shared {
    /// Cleared (before `pending` is emptied) once the connection broke.
    alive: AtomicBool,
    next: AtomicU64,
    /// Who waits for the reply to each tagged request in flight.
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
}

impl Relay {
    /// A relay to the store at `addr` (node 0's), authenticated with `secret`.
    pub fn new(addr: String, secret: Option<Secret>) -> Relay {
        Relay { addr, secret, link: tokio::sync::Mutex::new(None) }
    }

    /// Where `req` goes: to node 0, its keys stripped of the relay's prefix, when all carry it;
    /// else it stays in this store, unchanged. A batch mixing the two is an error.
    pub(super) fn route(req: Request) -> Result<Route, String> {
        let up = |k: &str| k.starts_with(RELAY_PREFIX);
        let strip = |k: String| k[RELAY_PREFIX.len()..].to_string();
        Ok(match req {
            Request::Set { key, value } if up(&key) => Route::Node0(Request::Set { key: strip(key), value }),
            Request::Get { key, timeout_ms } if up(&key) => Route::Node0(Request::Get { key: strip(key), timeout_ms }),
            Request::GetMany { keys, timeout_ms } if keys.iter().any(|k| up(k)) => {
                if !keys.iter().all(|k| up(k)) {
                    return Err(format!("a batch mixing keys under `{RELAY_PREFIX}` with others"));
                }
                Route::Node0(Request::GetMany { keys: keys.into_iter().map(strip).collect(), timeout_ms })
            }
            other => Route::Here(other),
        })
    }

    /// Forwards `req` (its keys stripped of the prefix) to node 0's store; its reply, or an
    /// error reply saying why node 0 did not answer.
    pub(super) async fn forward(&self, req: Request) -> Reply {
        let wait = match &req {
            Request::Get { timeout_ms, .. } | Request::GetMany { timeout_ms, .. } => {
                Duration::from_millis(*timeout_ms).min(MAX_WAIT)
            }
            _ => Duration::ZERO,
        };
        match self.call(req, wait).await {
            Ok(reply) => Reply { id: None, ..reply },
            Err(e) => Reply::err(format!("relaying to node 0's store at {}: {e}", self.addr)),
        }
    }

    async fn call(&self, req: Request, wait: Duration) -> Result<Reply, StoreError> {
        let (writer, shared) = self.link().await?;
        let (tx, rx) = oneshot::channel();
        let id = shared.next.fetch_add(1, Ordering::SeqCst);
        {
            let mut pending = shared.pending.lock().map_err(|_| StoreError::Protocol("relay poisoned".into()))?;
            if !shared.alive.load(Ordering::SeqCst) {
                return Err(lost());
            }
            pending.insert(id, tx);
        }
        let forget = || {
            if let Ok(mut p) = shared.pending.lock() {
                p.remove(&id);
            }
        };
        let mut line = serde_json::to_vec(&Request::Tagged { id, req: Box::new(req) })
            .map_err(|e| StoreError::Protocol(e.to_string()))?;
        if line.len() > MAX_LINE {
            forget();
            return Err(StoreError::Protocol(format!(
                "a request of {} bytes, over the store's {MAX_LINE}",
                line.len()
            )));
        }
        line.push(b'\n');
        let sent = tokio::time::timeout(REPLY_MARGIN, async { writer.lock().await.write_all(&line).await }).await;
        if !matches!(sent, Ok(Ok(()))) {
            forget();
            shared.alive.store(false, Ordering::SeqCst);
            return Err(lost());
        }
        match tokio::time::timeout(wait.saturating_add(REPLY_MARGIN), rx).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(_)) => Err(lost()),
            Err(_) => {
                forget();
                Err(StoreError::Io(std::io::ErrorKind::TimedOut.into()))
            }
        }
    }

    /// The open connection, opened (again) when there is none or it broke.
    async fn link(&self) -> Result<(Arc<tokio::sync::Mutex<OwnedWriteHalf>>, Arc<Shared>), StoreError> {
        let mut link = self.link.lock().await;
        if let Some(l) = link.as_ref().filter(|l| l.shared.alive.load(Ordering::SeqCst)) {
            return Ok((l.writer.clone(), l.shared.clone()));
        }
        let client = self.connect().await?;
        let (reader, writer) = client.into_parts();
        let shared =
            Arc::new(Shared { alive: AtomicBool::new(true), next: AtomicU64::new(0), pending: Mutex::default() });
        let l = Link {
            writer: Arc::new(tokio::sync::Mutex::new(writer)),
            shared: shared.clone(),
            reader: tokio::spawn(read_replies(reader, shared)),
        };
        let out = (l.writer.clone(), l.shared.clone());
        *link = Some(l);
        Ok(out)
    }

    async fn connect(&self) -> Result<AsyncStoreClient, StoreError> {
        AsyncStoreClient::retrying(CONNECT_FOR, || AsyncStoreClient::connect(&self.addr, self.secret.as_ref())).await
    }
}

fn lost() -> StoreError {
    StoreError::Io(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "the relay's connection to node 0 broke"))
}

/// Hands each reply to the request it answers, until the connection ends; then fails every
/// request still in flight.
async fn read_replies(mut reader: BufReader<OwnedReadHalf>, shared: Arc<Shared>) {
    let mut line = Vec::new();
    // A reply holds at most a value the server accepted, escaped as the request was.
    let limit = u64::try_from(MAX_LINE.saturating_mul(4)).unwrap_or(u64::MAX);
    loop {
        line.clear();
        match (&mut reader).take(limit).read_until(b'\n', &mut line).await {
            Ok(n) if n > 0 && line.last() == Some(&b'\n') => {}
            _ => break,
        }
        let Ok(reply) = serde_json::from_slice::<Reply>(&line) else { break };
        let waiter = reply.id.and_then(|id| shared.pending.lock().ok().and_then(|mut p| p.remove(&id)));
        if let Some(tx) = waiter {
            // The caller may have given up (its own timeout): nothing to do then.
            let _ = tx.send(reply);
        }
    }
    shared.alive.store(false, Ordering::SeqCst);
    if let Ok(mut p) = shared.pending.lock() {
        p.clear();
    }
}
