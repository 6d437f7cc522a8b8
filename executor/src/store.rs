//! The rendezvous store: a tiny key-value server hosted by node 0's launcher, in the spirit of
//! torch.distributed's TCPStore. Launchers register their nodes and exchange results through
//! it; workers use it to exchange what their backend needs (NCCL unique id, ring addresses) and
//! for barriers.
//!
//! Written here rather than taken from a crate: it is ~150 lines, has to speak the same protocol
//! from blocking workers and the async launcher, and no maintained crate offers a TCPStore.
//!
//! Wire: one JSON object per line each way. Requests `{"op":"set","key":K,"value":V}` and
//! `{"op":"get","key":K,"timeout_ms":T}` (waits until K exists); replies `{"ok":true,"value":V}`
//! or `{"ok":false,"error":E}`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader as ABufReader};
use tokio::net::TcpListener;
use tokio::sync::Notify;

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
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
enum Request {
    Set { key: String, value: String },
    Get { key: String, timeout_ms: u64 },
}

#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    ok: bool,
    #[serde(default)]
    value: String,
    #[serde(default)]
    error: String,
}

#[derive(Default)]
struct State {
    map: Mutex<HashMap<String, String>>,
    changed: Notify,
}

/// Serves the store on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener) {
    let state = Arc::new(State::default());
    loop {
        let Ok((sock, _)) = listener.accept().await else { continue };
        let _ = sock.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let (r, mut w) = sock.into_split();
            let mut lines = ABufReader::new(r).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let reply = match serde_json::from_str::<Request>(&line) {
                    Ok(req) => handle(&state, req).await,
                    Err(e) => Reply { ok: false, value: String::new(), error: format!("bad request: {e}") },
                };
                let mut out = serde_json::to_string(&reply).unwrap_or_default();
                out.push('\n');
                if w.write_all(out.as_bytes()).await.is_err() {
                    break;
                }
            }
        });
    }
}

async fn handle(state: &State, req: Request) -> Reply {
    match req {
        Request::Set { key, value } => {
            if let Ok(mut m) = state.map.lock() {
                m.insert(key, value);
            }
            state.changed.notify_waiters();
            Reply { ok: true, value: String::new(), error: String::new() }
        }
        Request::Get { key, timeout_ms } => {
            let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms);
            loop {
                // Register interest before looking, so a set between the look and the wait
                // is not missed.
                let notified = state.changed.notified();
                if let Some(v) = state.map.lock().ok().and_then(|m| m.get(&key).cloned()) {
                    return Reply { ok: true, value: v, error: String::new() };
                }
                if tokio::time::timeout_at(deadline, notified).await.is_err() {
                    return Reply { ok: false, value: String::new(), error: "timeout".into() };
                }
            }
        }
    }
}

/// How long past a request's own wait its reply may take before the master counts as gone.
const REPLY_MARGIN: Duration = Duration::from_secs(10);

/// A blocking client; one connection, one request at a time.
pub struct StoreClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// Put before every key (see [`StoreClient::set_namespace`]).
    namespace: String,
}

impl StoreClient {
    /// Connects to `addr`, retrying until `timeout` (the master may start after us).
    pub fn connect(addr: &str, timeout: Duration) -> Result<StoreClient, StoreError> {
        let start = Instant::now();
        let mut last = String::from("no attempt");
        while start.elapsed() < timeout {
            let attempt = addr
                .to_socket_addrs()
                .map_err(|e| e.to_string())
                .and_then(|mut a| a.next().ok_or_else(|| "address resolves to nothing".to_string()))
                .and_then(|sa| {
                    let left = timeout.saturating_sub(start.elapsed()).max(Duration::from_millis(50));
                    TcpStream::connect_timeout(&sa, left.min(Duration::from_secs(2))).map_err(|e| e.to_string())
                });
            match attempt {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    let writer = stream.try_clone()?;
                    return Ok(StoreClient { reader: BufReader::new(stream), writer, namespace: String::new() });
                }
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(StoreError::Unreachable { addr: addr.into(), secs: timeout.as_secs_f64(), last })
    }

    /// The local address of this connection: the address the master's network reaches us at.
    pub fn local_ip(&self) -> Result<std::net::IpAddr, StoreError> {
        Ok(self.writer.local_addr()?.ip())
    }

    fn call(&mut self, req: &Request) -> Result<Reply, StoreError> {
        // A master cut off by the network must not hold us for TCP's retransmission timeout
        // (many minutes): a reply is due within the request's own wait plus a margin.
        let wait = match req {
            Request::Get { timeout_ms, .. } => Duration::from_millis(*timeout_ms),
            _ => Duration::ZERO,
        };
        let due = wait.saturating_add(REPLY_MARGIN);
        self.writer.set_write_timeout(Some(REPLY_MARGIN))?;
        self.reader.get_ref().set_read_timeout(Some(due))?;
        let mut line = serde_json::to_string(req).map_err(|e| StoreError::Protocol(e.to_string()))?;
        line.push('\n');
        self.writer.write_all(line.as_bytes())?;
        let mut buf = String::new();
        if self.reader.read_line(&mut buf)? == 0 {
            return Err(StoreError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        serde_json::from_str(&buf).map_err(|e| StoreError::Protocol(e.to_string()))
    }

    /// Prefixes every key of later calls with `namespace` ("" for none): a check run a second
    /// time gets fresh keys (its barriers synchronize again) without knowing it.
    pub fn set_namespace(&mut self, namespace: &str) {
        self.namespace = namespace.to_string();
    }

    pub fn set(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        let key = format!("{}{key}", self.namespace);
        let r = self.call(&Request::Set { key, value: value.into() })?;
        if r.ok {
            Ok(())
        } else {
            Err(StoreError::Protocol(r.error))
        }
    }

    /// Waits up to `timeout` for `key` to be set and returns its value.
    pub fn get(&mut self, key: &str, timeout: Duration) -> Result<String, StoreError> {
        let timeout_ms = timeout.as_millis().min(u64::MAX as u128) as u64;
        let r = self.call(&Request::Get { key: format!("{}{key}", self.namespace), timeout_ms })?;
        match (r.ok, r.error.as_str()) {
            (true, _) => Ok(r.value),
            (false, "timeout") => Err(StoreError::Timeout(timeout.as_secs_f64(), key.into())),
            (false, e) => Err(StoreError::Protocol(e.into())),
        }
    }

    /// All `n` participants set `{name}/{me}` and wait for the others'.
    pub fn barrier(&mut self, name: &str, me: usize, n: usize, timeout: Duration) -> Result<(), StoreError> {
        self.set(&format!("barrier/{name}/{me}"), "1")?;
        let start = Instant::now();
        for i in 0..n {
            let left = timeout.saturating_sub(start.elapsed());
            self.get(&format!("barrier/{name}/{i}"), left)?;
        }
        Ok(())
    }
}

/// A store served on a runtime of its own, for unit tests: keep the runtime alive while the
/// address is in use.
#[cfg(test)]
pub(crate) fn test_store() -> (tokio::runtime::Runtime, String) {
    let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
    let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).expect("bind a test store");
    let addr = listener.local_addr().expect("test store address").to_string();
    rt.spawn(serve(listener));
    (rt, addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_wait_and_timeout() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        rt.spawn(serve(listener));
        let mut a = StoreClient::connect(&addr, Duration::from_secs(5)).unwrap();
        let addr2 = addr.clone();
        let setter = std::thread::spawn(move || {
            let mut b = StoreClient::connect(&addr2, Duration::from_secs(5)).unwrap();
            std::thread::sleep(Duration::from_millis(100));
            b.set("k", "v\nwith newline").unwrap();
        });
        assert_eq!(a.get("k", Duration::from_secs(5)).unwrap(), "v\nwith newline");
        setter.join().unwrap();
        let err = a.get("missing", Duration::from_millis(100)).unwrap_err();
        assert!(matches!(err, StoreError::Timeout(..)), "{err}");
    }

    #[test]
    fn unreachable_master_is_a_clear_error() {
        // Bind then drop to find a closed port.
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let err = StoreClient::connect(&format!("127.0.0.1:{port}"), Duration::from_millis(300)).err().unwrap();
        assert!(err.to_string().contains("cannot reach the rendezvous"), "{err}");
    }
}
