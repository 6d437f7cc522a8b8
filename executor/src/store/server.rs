//! The store's server side, on the launcher's tokio runtime: the handshake, the bounds, the
//! write-once keys.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use super::auth::{self, Secret, HANDSHAKE_TIMEOUT, NONCE_LEN, STORE_LABEL};
use super::limits::{Bounds, KEY_OVERHEAD};
use super::relay::{Relay, Route};
use super::{
    Hello, Reply, Request, ALREADY_SET, HANDSHAKE_LINE, MAX_BATCH, MAX_IN_FLIGHT, MAX_KEY, MAX_LINE, MAX_VALUE,
    MAX_WAIT, RELAY_PREFIX, WRITE_ONCE,
};

/// How long the accept loop pauses after an accept error (out of file descriptors...).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How many peers' refusals are remembered (each logged once).
const REFUSED_PEERS: usize = 1024;

#[derive(Default)]
struct Data {
    map: HashMap<String, String>,
    /// Bytes of keys and values in `map`, and [`KEY_OVERHEAD`] per key.
    bytes: usize,
    /// Who waits for a key not set yet. One wake-up per key, not one per set for every
    /// waiter: a thousand ranks at one barrier would otherwise wake a million times.
    waiting: HashMap<String, Arc<Notify>>,
}

struct State {
    secret: Option<Secret>,
    bounds: Bounds,
    data: Mutex<Data>,
    refused: Mutex<HashSet<IpAddr>>,
    /// A node store's relay to node 0's store, for the keys under [`RELAY_PREFIX`].
    relay: Option<Relay>,
}

impl State {
    /// Logs a refused connection, once per peer address.
    fn refuse(&self, peer: SocketAddr, why: &str) {
        let first = self.refused.lock().map(|mut s| s.len() < REFUSED_PEERS && s.insert(peer.ip())).unwrap_or(false);
        if first {
            tracing::warn!(
                "rendezvous store: closed a connection from {peer}: {why} (not logged again for this address)"
            );
        } else {
            tracing::debug!("rendezvous store: closed a connection from {peer}: {why}");
        }
    }
}

/// Serves the store on `listener` until the task is dropped, within the bounds of a run of one
/// node. With a secret, only peers that prove they hold it are served.
pub async fn serve(listener: TcpListener, secret: Option<Secret>) {
    serve_within(listener, secret, Bounds::default()).await
}

/// [`serve`] within `bounds`, which the caller may grow while the store serves.
pub async fn serve_within(listener: TcpListener, secret: Option<Secret>, bounds: Bounds) {
    serve_relaying(listener, secret, bounds, None).await
}

/// [`serve_within`], forwarding the keys under [`RELAY_PREFIX`] through `relay` (a node store's).
pub(super) async fn serve_relaying(
    listener: TcpListener,
    secret: Option<Secret>,
    bounds: Bounds,
    relay: Option<Relay>,
) {
    let slots = bounds.slots();
    let state = Arc::new(State { secret, bounds, data: Mutex::default(), refused: Mutex::default(), relay });
    let mut last_error: Option<Instant> = None;
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let (sock, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors (EMFILE) and the like: pause rather than spin.
                if last_error.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    tracing::warn!("rendezvous store: accept failed: {e}; retrying");
                    last_error = Some(Instant::now());
                }
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        state.bounds.note_connections();
        let state = state.clone();
        tokio::spawn(async move {
            if let Err(why) = connection(state.clone(), sock).await {
                state.refuse(peer, &why);
            }
            drop(slot);
        });
    }
}

enum Line {
    Got,
    End,
    TooLong,
}

/// Reads one line of at most `max` bytes into `buf` (without its newline).
async fn read_line<R: AsyncBufRead + Unpin>(r: &mut R, buf: &mut Vec<u8>, max: usize) -> Line {
    buf.clear();
    let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    match (&mut *r).take(limit).read_until(b'\n', buf).await {
        Ok(0) | Err(_) => Line::End,
        Ok(_) if buf.last() == Some(&b'\n') => {
            buf.pop();
            Line::Got
        }
        Ok(_) if buf.len() > max => Line::TooLong,
        // The last line, without a newline.
        Ok(_) => Line::Got,
    }
}

async fn send<W: AsyncWrite + Unpin, T: Serialize>(w: &mut W, msg: &T) -> std::io::Result<()> {
    let mut out = serde_json::to_vec(msg).map_err(std::io::Error::other)?;
    out.push(b'\n');
    w.write_all(&out).await
}

/// Serves one connection; an error is why it was closed on the peer (to be logged). Untagged
/// requests are served one at a time, in order; tagged ones beside each other (at most
/// [`MAX_IN_FLIGHT`] at once), each reply sent when ready. Those still in flight when the
/// connection ends are dropped with it.
async fn connection(state: Arc<State>, sock: TcpStream) -> Result<(), String> {
    let (r, mut w) = sock.into_split();
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    let handshake = handshake(&state, &mut r, &mut w, &mut buf);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Err(_) => return Err(format!("no handshake within {} s", HANDSHAKE_TIMEOUT.as_secs())),
        Ok(res) => res?,
    }
    let w = Arc::new(tokio::sync::Mutex::new(w));
    let mut in_flight = tokio::task::JoinSet::new();
    loop {
        match read_line(&mut r, &mut buf, MAX_LINE).await {
            Line::Got => {}
            Line::End => return Ok(()),
            Line::TooLong => return Err(format!("a request line over {MAX_LINE} bytes")),
        }
        while in_flight.try_join_next().is_some() {}
        let reply = match serde_json::from_slice::<Request>(&buf) {
            Ok(Request::Auth { .. }) => Reply::err("already authenticated"),
            Ok(Request::Tagged { id, req }) => {
                if matches!(*req, Request::Auth { .. } | Request::Tagged { .. }) {
                    Reply { id: Some(id), ..Reply::err("a tagged request holds a set, get or getmany") }
                } else {
                    if in_flight.len() >= MAX_IN_FLIGHT {
                        in_flight.join_next().await;
                    }
                    let (state, w) = (state.clone(), w.clone());
                    in_flight.spawn(async move {
                        let reply = Reply { id: Some(id), ..handle(&state, *req).await };
                        let _ = send(&mut *w.lock().await, &reply).await;
                    });
                    continue;
                }
            }
            Ok(req) => handle(&state, req).await,
            Err(e) => Reply::err(format!("bad request: {e}")),
        };
        if send(&mut *w.lock().await, &reply).await.is_err() {
            return Ok(());
        }
    }
}

/// The challenge and its answer (see the module doc of [`super`]).
async fn handshake<R, W>(state: &State, r: &mut R, w: &mut W, buf: &mut Vec<u8>) -> Result<(), String>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let ours = auth::nonce();
    let hello = Hello {
        hello: String::from_utf8_lossy(STORE_LABEL).into_owned(),
        nonce: hex::encode(ours),
        auth: state.secret.is_some(),
    };
    send(w, &hello).await.map_err(|e| format!("sending the challenge: {e}"))?;
    match read_line(r, buf, HANDSHAKE_LINE).await {
        Line::Got => {}
        Line::End => return Err("closed before the handshake".into()),
        Line::TooLong => return Err(format!("a handshake line over {HANDSHAKE_LINE} bytes")),
    }
    let (theirs, proof) = match serde_json::from_slice::<Request>(buf) {
        Ok(Request::Auth { nonce, proof }) => (nonce, proof),
        _ => {
            let _ = send(w, &Reply::err("expected the handshake (op auth) first")).await;
            return Err("a request before the handshake".into());
        }
    };
    let theirs = hex::decode(theirs).ok().filter(|n| n.len() == NONCE_LEN);
    let proof = hex::decode(proof).unwrap_or_default();
    let Some(theirs) = theirs else {
        let _ = send(w, &Reply::err("malformed handshake nonce")).await;
        return Err("a malformed handshake".into());
    };
    let secret = state.secret.as_ref();
    if secret.is_some() && !auth::verify(secret, &[STORE_LABEL, b"client", &ours, &theirs], &proof) {
        let _ = send(w, &Reply::err("wrong proof: this rendezvous needs the run's secret")).await;
        return Err("a wrong proof of the run's secret".into());
    }
    let back = match secret {
        Some(_) => hex::encode(auth::prove(secret, &[STORE_LABEL, b"server", &ours, &theirs])),
        None => String::new(),
    };
    send(w, &Reply::ok(back)).await.map_err(|e| format!("answering the handshake: {e}"))
}

async fn handle(state: &State, req: Request) -> Reply {
    let req = match (Relay::route(req), &state.relay) {
        (Err(e), _) => return Reply::err(e),
        (Ok(Route::Node0(up)), Some(relay)) => return relay.forward(up).await,
        (Ok(Route::Node0(_)), None) => {
            return Reply::err(format!("this store relays nothing: a key under `{RELAY_PREFIX}`"))
        }
        (Ok(Route::Here(req)), _) => req,
    };
    match req {
        Request::Auth { .. } => Reply::err("already authenticated"),
        Request::Tagged { .. } => Reply::err("a tagged request holds a set, get or getmany"),
        Request::Set { key, value } => set(state, key, value),
        Request::Get { key, timeout_ms } => {
            if key.len() > MAX_KEY {
                return Reply::err(format!("key over {MAX_KEY} bytes"));
            }
            match wait_for(state, &key, deadline(timeout_ms)).await {
                Got::Value(v) => Reply::ok(v),
                Got::Timeout => Reply::err("timeout"),
                Got::Poisoned => Reply::err("store poisoned"),
            }
        }
        Request::GetMany { keys, timeout_ms } => get_many(state, keys, deadline(timeout_ms)).await,
    }
}

fn deadline(timeout_ms: u64) -> tokio::time::Instant {
    tokio::time::Instant::now() + Duration::from_millis(timeout_ms).min(MAX_WAIT)
}

enum Got {
    Value(String),
    Timeout,
    Poisoned,
}

/// Waits until `key` is set or `deadline` passes.
async fn wait_for(state: &State, key: &str, deadline: tokio::time::Instant) -> Got {
    let notify = {
        let Ok(mut d) = state.data.lock() else { return Got::Poisoned };
        if let Some(v) = d.map.get(key) {
            return Got::Value(v.clone());
        }
        d.waiting.entry(key.to_string()).or_default().clone()
    };
    loop {
        // Interest is registered when the future is created, so a set between the look
        // below and the wait is not missed.
        let notified = notify.notified();
        if let Some(v) = state.data.lock().ok().and_then(|d| d.map.get(key).cloned()) {
            return Got::Value(v);
        }
        if tokio::time::timeout_at(deadline, notified).await.is_err() {
            if let Ok(mut d) = state.data.lock() {
                // The last waiter of a key never set takes its entry away.
                if d.waiting.get(key).is_some_and(|n| Arc::ptr_eq(n, &notify) && Arc::strong_count(n) <= 2) {
                    d.waiting.remove(key);
                }
            }
            return Got::Timeout;
        }
    }
}

/// The values of `keys` in order, each waited for until `deadline`: as many as fit in
/// [`MAX_VALUE`] bytes (at least one); the caller asks again for the rest.
async fn get_many(state: &State, keys: Vec<String>, deadline: tokio::time::Instant) -> Reply {
    if keys.len() > MAX_BATCH {
        return Reply::err(format!("a batch of {} keys, over {MAX_BATCH}", keys.len()));
    }
    if let Some(k) = keys.iter().find(|k| k.len() > MAX_KEY) {
        return Reply::err(format!("key of {} bytes in a batch, over {MAX_KEY}", k.len()));
    }
    let mut values = Vec::with_capacity(keys.len());
    let mut bytes = 0usize;
    for key in &keys {
        match wait_for(state, key, deadline).await {
            Got::Value(v) => {
                bytes = bytes.saturating_add(v.len());
                if bytes > MAX_VALUE && !values.is_empty() {
                    break;
                }
                values.push(v);
            }
            Got::Timeout => return Reply { values, ..Reply::err("timeout") },
            Got::Poisoned => return Reply::err("store poisoned"),
        }
    }
    Reply { ok: true, values, ..Reply::default() }
}

fn set(state: &State, key: String, value: String) -> Reply {
    if key.len() > MAX_KEY {
        return Reply::err(format!("key over {MAX_KEY} bytes"));
    }
    if value.len() > MAX_VALUE {
        return Reply::err(format!("value of `{key}` is {} bytes, over {MAX_VALUE}", value.len()));
    }
    let limits = state.bounds.limits();
    let Ok(mut d) = state.data.lock() else { return Reply::err("store poisoned") };
    let old = d.map.get(&key).map(|v| key.len() + v.len() + KEY_OVERHEAD);
    if old.is_some() && WRITE_ONCE.contains(&key.as_str()) {
        return Reply::err(ALREADY_SET);
    }
    if old.is_none() && d.map.len() >= limits.keys {
        return Reply::err(format!("the store is full ({} keys)", limits.keys));
    }
    let bytes = d.bytes.saturating_sub(old.unwrap_or(0)).saturating_add(key.len() + value.len() + KEY_OVERHEAD);
    if bytes > limits.bytes {
        return Reply::err(format!("the store is full ({} bytes)", limits.bytes));
    }
    d.bytes = bytes;
    if let Some(waiting) = d.waiting.remove(&key) {
        waiting.notify_waiters();
    }
    d.map.insert(key, value);
    Reply::ok(String::new())
}

#[cfg(test)]
mod tests {
    use super::super::limits::Limits;
    use super::*;

    fn state() -> State {
        State {
            secret: None,
            bounds: Bounds::default(),
            data: Mutex::default(),
            refused: Mutex::default(),
            relay: None,
        }
    }

    #[test]
    fn the_store_holds_at_most_its_keys_and_more_once_grown() {
        let s = state();
        let keys = s.bounds.limits().keys;
        for i in 0..keys {
            assert!(set(&s, format!("k{i}"), String::new()).ok);
        }
        let r = set(&s, "one-more".into(), String::new());
        assert!(!r.ok && r.error.contains("full"), "{}", r.error);
        // An existing key may still change.
        assert!(set(&s, "k7".into(), "v".into()).ok);
        // A run of 16,384 ranks: room for more than the old 100,000 keys.
        s.bounds.grow(Limits::for_run(2048, 16_384));
        assert!(set(&s, "one-more".into(), String::new()).ok);
        assert!(s.data.lock().unwrap().map.len() > 100_000);
    }

    #[test]
    fn the_store_holds_at_most_its_bytes() {
        let s = state();
        let max = s.bounds.limits().bytes;
        let v = "x".repeat(MAX_VALUE);
        let fit = max / (MAX_VALUE + 8 + KEY_OVERHEAD);
        for i in 0..fit {
            assert!(set(&s, format!("v{i:06}"), v.clone()).ok);
        }
        let r = set(&s, "over".into(), v.clone());
        assert!(!r.ok && r.error.contains("bytes"), "{}", r.error);
        // Replacing a value frees what it held.
        assert!(set(&s, "v000000".into(), String::new()).ok);
        assert!(set(&s, "over".into(), v).ok);
    }
}
