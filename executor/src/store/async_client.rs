//! The store's async client, for callers on a tokio runtime that hold many connections at once
//! (node 0's gathering, the scale simulator's thousands of ranks): the same protocol and
//! handshake as [`super::StoreClient`], without a thread per connection.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpSocket, TcpStream};

use super::auth::{Secret, HANDSHAKE_TIMEOUT};
use super::client::{arrivals, batch_values, millis, Answer};
use super::{barrier_key, Reply, Request, StoreError, ALREADY_SET, HANDSHAKE_LINE, MAX_BATCH, MAX_LINE};

/// How long past a request's own wait its reply may take before the master counts as gone.
const REPLY_MARGIN: Duration = Duration::from_secs(10);

pub struct AsyncStoreClient {
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    line: Vec<u8>,
}

impl AsyncStoreClient {
    /// Connects to `addr` once (no retry) and completes the handshake with `secret`.
    pub async fn connect(addr: &str, secret: Option<&Secret>) -> Result<AsyncStoreClient, StoreError> {
        let sock = TcpStream::connect(addr).await?;
        Self::handshake(sock, addr, secret).await
    }

    /// [`Self::connect`] from the local address `from` (port 0: any), as a peer on a host of its
    /// own would: the scale simulator's nodes each speak from an address of their own.
    pub async fn connect_from(
        addr: SocketAddr,
        from: IpAddr,
        secret: Option<&Secret>,
    ) -> Result<AsyncStoreClient, StoreError> {
        let socket = if from.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.bind(SocketAddr::new(from, 0))?;
        let sock = socket.connect(addr).await?;
        Self::handshake(sock, &addr.to_string(), secret).await
    }

    /// Runs `attempt` (a connect) again until `within` while the connection or its handshake is
    /// cut short (a node 0 accepting thousands of peers at once accepts some a little later);
    /// a refusal (a wrong secret, another protocol) is final.
    pub async fn retrying<F, Fut>(within: Duration, mut attempt: F) -> Result<AsyncStoreClient, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<AsyncStoreClient, StoreError>>,
    {
        let start = Instant::now();
        loop {
            match attempt().await {
                Ok(c) => return Ok(c),
                Err(e @ (StoreError::Auth { .. } | StoreError::Protocol(_))) => return Err(e),
                Err(e) if start.elapsed() >= within => return Err(e),
                Err(e) => tracing::debug!("connecting to the store again: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn handshake(sock: TcpStream, addr: &str, secret: Option<&Secret>) -> Result<AsyncStoreClient, StoreError> {
        sock.set_nodelay(true)?;
        let (r, writer) = sock.into_split();
        let mut c = AsyncStoreClient { reader: BufReader::new(r), writer, line: Vec::new() };
        let handshake = async {
            let line = c.read_line(HANDSHAKE_LINE).await?;
            let (request, answer) = Answer::to_hello(&line, secret, addr)?;
            let reply = c.send(&request, HANDSHAKE_LINE).await?;
            answer.check(&reply)
        };
        match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
            Ok(res) => res.map(|()| c),
            Err(_) => Err(StoreError::Io(std::io::ErrorKind::TimedOut.into())),
        }
    }

    /// The connection's two halves, handshake done: for a caller that reads and writes them
    /// apart (the node store's relay).
    pub(super) fn into_parts(self) -> (BufReader<OwnedReadHalf>, OwnedWriteHalf) {
        (self.reader, self.writer)
    }

    async fn read_line(&mut self, max: usize) -> Result<String, StoreError> {
        self.line.clear();
        let limit = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
        let n = (&mut self.reader).take(limit).read_until(b'\n', &mut self.line).await?;
        if n == 0 {
            return Err(StoreError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
        if self.line.last() != Some(&b'\n') {
            return Err(StoreError::Protocol(format!("a reply line over {max} bytes or cut short")));
        }
        String::from_utf8(std::mem::take(&mut self.line)).map_err(|e| StoreError::Protocol(e.to_string()))
    }

    async fn send(&mut self, req: &Request, max: usize) -> Result<Reply, StoreError> {
        let mut line = serde_json::to_vec(req).map_err(|e| StoreError::Protocol(e.to_string()))?;
        if line.len() > max {
            return Err(StoreError::Protocol(format!("a request of {} bytes, over the store's {max}", line.len())));
        }
        line.push(b'\n');
        self.writer.write_all(&line).await?;
        // A reply holds at most a value the server accepted, escaped as the request was.
        let reply = self.read_line(MAX_LINE.saturating_mul(4)).await?;
        serde_json::from_str(&reply).map_err(|e| StoreError::Protocol(e.to_string()))
    }

    async fn call(&mut self, req: &Request, wait: Duration) -> Result<Reply, StoreError> {
        let due = wait.saturating_add(REPLY_MARGIN);
        match tokio::time::timeout(due, self.send(req, MAX_LINE)).await {
            Ok(reply) => reply,
            Err(_) => Err(StoreError::Io(std::io::ErrorKind::TimedOut.into())),
        }
    }

    pub async fn set(&mut self, key: &str, value: &str) -> Result<(), StoreError> {
        let r = self.call(&Request::Set { key: key.into(), value: value.into() }, Duration::ZERO).await?;
        match (r.ok, r.error.as_str()) {
            (true, _) => Ok(()),
            (false, ALREADY_SET) => Err(StoreError::AlreadySet(key.into())),
            (false, e) => Err(StoreError::Protocol(e.into())),
        }
    }

    /// Waits up to `timeout` for `key` to be set and returns its value.
    pub async fn get(&mut self, key: &str, timeout: Duration) -> Result<String, StoreError> {
        let r = self.call(&Request::Get { key: key.into(), timeout_ms: millis(timeout) }, timeout).await?;
        match (r.ok, r.error.as_str()) {
            (true, _) => Ok(r.value),
            (false, "timeout") => Err(StoreError::Timeout(timeout.as_secs_f64(), key.into())),
            (false, e) => Err(StoreError::Protocol(e.into())),
        }
    }

    /// Waits up to `timeout` for every key of `keys` and returns their values in order, in
    /// batches of at most [`MAX_BATCH`] keys (see [`super::StoreClient::get_many`]).
    pub async fn get_many(&mut self, keys: &[String], timeout: Duration) -> Result<Vec<String>, StoreError> {
        let start = Instant::now();
        let mut values = Vec::with_capacity(keys.len());
        while values.len() < keys.len() {
            let left = timeout.saturating_sub(start.elapsed());
            let batch = &keys[values.len()..keys.len().min(values.len() + MAX_BATCH)];
            let request = Request::GetMany { keys: batch.to_vec(), timeout_ms: millis(left) };
            let reply = self.call(&request, left).await?;
            values.extend(batch_values(reply, batch, left)?);
        }
        Ok(values)
    }

    /// The barrier of [`super::StoreClient::barrier`], with the same keys: both clients may
    /// meet at one.
    pub async fn barrier(&mut self, name: &str, me: usize, n: usize, timeout: Duration) -> Result<(), StoreError> {
        if me == 0 {
            self.get_many(&arrivals(name, n), timeout).await?;
            self.set(&barrier_key(name, None), "1").await
        } else {
            self.set(&barrier_key(name, Some(me)), "1").await?;
            self.get(&barrier_key(name, None), timeout).await.map(|_| ())
        }
    }
}
