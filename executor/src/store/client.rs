//! The store's blocking client: one connection, one request at a time.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::auth::{self, Secret, HANDSHAKE_TIMEOUT, NONCE_LEN, SECRET_ENV, STORE_LABEL};
use super::{
    barrier_key, Hello, Reply, Request, StoreError, ALREADY_SET, HANDSHAKE_LINE, MAX_BATCH, MAX_LINE, RELAY_PREFIX,
};

/// How long past a request's own wait its reply may take before the master counts as gone.
const REPLY_MARGIN: Duration = Duration::from_secs(10);

pub struct StoreClient {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    /// Put before every key (see [`StoreClient::set_namespace`]).
    namespace: String,
    /// Put before the namespace: [`RELAY_PREFIX`] once [`StoreClient::through_relay`].
    route: &'static str,
    /// The run's secret, which the CPU transport's hellos use too.
    secret: Option<Secret>,
}

impl StoreClient {
    /// Connects to `addr`, retrying until `timeout` (the master may start after us), and
    /// completes the handshake with `secret`. A refused handshake is not retried.
    pub fn connect(addr: &str, timeout: Duration, secret: Option<Secret>) -> Result<StoreClient, StoreError> {
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
                    let mut c = StoreClient {
                        reader: BufReader::new(stream),
                        writer,
                        namespace: String::new(),
                        route: "",
                        secret: secret.clone(),
                    };
                    // A refusal is final; a handshake cut short (a master with a thousand
                    // ranks arriving at once accepts them a little later) is tried again.
                    match c.handshake(addr) {
                        Ok(()) => return Ok(c),
                        Err(e @ (StoreError::Auth { .. } | StoreError::Protocol(_))) => return Err(e),
                        Err(e) => last = format!("handshake: {e}"),
                    }
                }
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(StoreError::Unreachable { addr: addr.into(), secs: timeout.as_secs_f64(), last })
    }

    fn handshake(&mut self, addr: &str) -> Result<(), StoreError> {
        self.writer.set_write_timeout(Some(HANDSHAKE_TIMEOUT))?;
        self.reader.get_ref().set_read_timeout(Some(HANDSHAKE_TIMEOUT))?;
        let line = self.read_line(HANDSHAKE_LINE)?;
        let (request, answer) = Answer::to_hello(&line, self.secret.as_ref(), addr)?;
        let reply = self.send(&request, HANDSHAKE_LINE)?;
        answer.check(&reply)
    }

    /// The run's secret this client authenticated with.
    pub fn secret(&self) -> Option<&Secret> {
        self.secret.as_ref()
    }

    /// The local address of this connection: the address the master's network reaches us at.
    pub fn local_ip(&self) -> Result<std::net::IpAddr, StoreError> {
        Ok(self.writer.local_addr()?.ip())
    }

    /// One reply line, at most `max` bytes.
    fn read_line(&mut self, max: usize) -> Result<String, StoreError> {
        let mut buf = Vec::new();
        let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
        let n = (&mut self.reader).take(limit).read_until(b'\n', &mut buf)?;
        if n == 0 {
            return Err(StoreError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        if buf.last() != Some(&b'\n') {
            return Err(StoreError::Protocol(format!("a reply line over {max} bytes or cut short")));
        }
        String::from_utf8(buf).map_err(|e| StoreError::Protocol(e.to_string()))
    }

    fn send(&mut self, req: &Request, max: usize) -> Result<Reply, StoreError> {
        let mut line = serde_json::to_string(req).map_err(|e| StoreError::Protocol(e.to_string()))?;
        if line.len() > max {
            return Err(StoreError::Protocol(format!("a request of {} bytes, over the store's {max}", line.len())));
        }
        line.push('\n');
        self.writer.write_all(line.as_bytes())?;
        // A reply holds at most a value the server accepted, escaped as the request was.
        let reply = self.read_line(MAX_LINE.saturating_mul(4))?;
        serde_json::from_str(&reply).map_err(|e| StoreError::Protocol(e.to_string()))
    }

    fn call(&mut self, req: &Request) -> Result<Reply, StoreError> {
        // A master cut off by the network must not hold us for TCP's retransmission timeout
        // (many minutes): a reply is due within the request's own wait plus a margin.
        let wait = match req {
            Request::Get { timeout_ms, .. } | Request::GetMany { timeout_ms, .. } => Duration::from_millis(*timeout_ms),
            _ => Duration::ZERO,
        };
        let due = wait.saturating_add(REPLY_MARGIN);
        self.writer.set_write_timeout(Some(REPLY_MARGIN))?;
        self.reader.get_ref().set_read_timeout(Some(due))?;
        self.send(req, MAX_LINE)
    }

    /// Prefixes every key of later calls with `namespace` ("" for none): a check run a second
    /// time gets fresh keys (its barriers synchronize again) without knowing it.
    pub fn set_namespace(&mut self, namespace: &str) {
        self.namespace = namespace.to_string();
    }

    /// Sends every later request through the relay of the node store this client is connected
    /// to: its keys are node 0's (see [`super::relay`]).
    pub fn through_relay(mut self) -> StoreClient {
        self.route = RELAY_PREFIX;
        self
    }

    /// `key` as it travels: routed and namespaced.
    fn full_key(&self, key: &str) -> String {
        format!("{}{}{key}", self.route, self.namespace)
    }

    pub fn set(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        let key = self.full_key(key);
        let r = self.call(&Request::Set { key: key.clone(), value: value.into() })?;
        match (r.ok, r.error.as_str()) {
            (true, _) => Ok(()),
            (false, ALREADY_SET) => Err(StoreError::AlreadySet(key)),
            (false, e) => Err(StoreError::Protocol(e.into())),
        }
    }

    /// Waits up to `timeout` for `key` to be set and returns its value.
    pub fn get(&mut self, key: &str, timeout: Duration) -> Result<String, StoreError> {
        let r = self.call(&Request::Get { key: self.full_key(key), timeout_ms: millis(timeout) })?;
        match (r.ok, r.error.as_str()) {
            (true, _) => Ok(r.value),
            (false, "timeout") => Err(StoreError::Timeout(timeout.as_secs_f64(), key.into())),
            (false, e) => Err(StoreError::Protocol(e.into())),
        }
    }

    /// Waits up to `timeout` for every key of `keys` and returns their values in order: one
    /// round trip per [`MAX_BATCH`] keys (or per [`super::MAX_VALUE`] bytes of values), not one
    /// per key.
    pub fn get_many(&mut self, keys: &[String], timeout: Duration) -> Result<Vec<String>, StoreError> {
        let start = Instant::now();
        let keys: Vec<String> = keys.iter().map(|k| self.full_key(k)).collect();
        let mut values = Vec::with_capacity(keys.len());
        while values.len() < keys.len() {
            let left = timeout.saturating_sub(start.elapsed());
            let batch = &keys[values.len()..keys.len().min(values.len() + MAX_BATCH)];
            let reply = self.call(&Request::GetMany { keys: batch.to_vec(), timeout_ms: millis(left) })?;
            values.extend(batch_values(reply, batch, left)?);
        }
        Ok(values)
    }

    /// All `n` participants (`me` in 0..n) wait until every one has arrived. Participant 0
    /// reads the others' keys in batches, then sets the barrier's `done`, which the others
    /// wait for: O(n) store operations in all, not n² (a thousand ranks would make a million),
    /// and n / [`MAX_BATCH`] round trips of participant 0, not n.
    pub fn barrier(&mut self, name: &str, me: usize, n: usize, timeout: Duration) -> Result<(), StoreError> {
        if me == 0 {
            self.get_many(&arrivals(name, n), timeout)?;
            self.set(&barrier_key(name, None), "1")
        } else {
            self.set(&barrier_key(name, Some(me)), "1")?;
            self.get(&barrier_key(name, None), timeout).map(|_| ())
        }
    }
}

/// A wait in milliseconds, as the protocol carries it.
pub(super) fn millis(wait: Duration) -> u64 {
    u64::try_from(wait.as_millis()).unwrap_or(u64::MAX)
}

/// The keys participants 1..n of barrier `name` set on arrival.
pub(super) fn arrivals(name: &str, n: usize) -> Vec<String> {
    (1..n).map(|i| barrier_key(name, Some(i))).collect()
}

/// The values a `getmany` reply carries for `batch`: at least one, at most one per key.
pub(super) fn batch_values(reply: Reply, batch: &[String], waited: Duration) -> Result<Vec<String>, StoreError> {
    match (reply.ok, reply.error.as_str()) {
        (true, _) if !reply.values.is_empty() && reply.values.len() <= batch.len() => Ok(reply.values),
        (true, _) => Err(StoreError::Protocol(format!(
            "{} values in the reply to a batch of {} keys",
            reply.values.len(),
            batch.len()
        ))),
        (false, "timeout") => {
            let key = batch.get(reply.values.len()).cloned().unwrap_or_default();
            Err(StoreError::Timeout(waited.as_secs_f64(), key))
        }
        (false, e) => Err(StoreError::Protocol(e.into())),
    }
}

/// The client's half of the handshake, shared by the blocking and the async client: the answer
/// to the server's challenge, and the check of the server's proof in its reply.
pub(super) struct Answer {
    addr: String,
    secret: Option<Secret>,
    theirs: Vec<u8>,
    ours: [u8; NONCE_LEN],
}

impl Answer {
    /// The answer to the challenge line `line` of the store at `addr`.
    pub(super) fn to_hello(line: &str, secret: Option<&Secret>, addr: &str) -> Result<(Request, Answer), StoreError> {
        let refused = |why: String| StoreError::Auth { addr: addr.into(), why };
        let hello: Hello = serde_json::from_str(line)
            .ok()
            .filter(|h: &Hello| h.hello.as_bytes() == STORE_LABEL)
            .ok_or_else(|| refused("it does not speak the gpusanity rendezvous protocol".into()))?;
        match (hello.auth, secret.is_some()) {
            (true, false) => {
                return Err(refused(format!(
                    "it needs the run's secret: give every node the same --rdzv-secret-file or {SECRET_ENV}"
                )))
            }
            (false, true) => {
                return Err(refused(format!(
                    "it has no secret but this node has one: give node 0 the same --rdzv-secret-file or {SECRET_ENV}"
                )))
            }
            _ => {}
        }
        let theirs = hex::decode(&hello.nonce)
            .ok()
            .filter(|n| n.len() == NONCE_LEN)
            .ok_or_else(|| refused("a malformed challenge".into()))?;
        let ours = auth::nonce();
        let proof = match secret {
            Some(_) => hex::encode(auth::prove(secret, &[STORE_LABEL, b"client", &theirs, &ours])),
            None => String::new(),
        };
        let request = Request::Auth { nonce: hex::encode(ours), proof };
        Ok((request, Answer { addr: addr.into(), secret: secret.cloned(), theirs, ours }))
    }

    /// Whether the server accepted the answer and proved it holds the secret too.
    pub(super) fn check(&self, reply: &Reply) -> Result<(), StoreError> {
        let refused = |why: String| StoreError::Auth { addr: self.addr.clone(), why };
        if !reply.ok {
            return Err(refused(reply.error.clone()));
        }
        if self.secret.is_some() {
            let back = hex::decode(&reply.value).unwrap_or_default();
            let parts: [&[u8]; 4] = [STORE_LABEL, b"server", &self.theirs, &self.ours];
            if !auth::verify(self.secret.as_ref(), &parts, &back) {
                return Err(refused("its proof is wrong: it does not hold the run's secret".into()));
            }
        }
        Ok(())
    }
}
