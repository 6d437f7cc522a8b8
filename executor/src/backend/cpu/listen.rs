//! The listening side of the CPU transport: a listener on the address this node publishes, and
//! accepting a peer with a deadline and the run's proof (see [`crate::store::auth`]).

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::backend::{BackendError, WorkerPlace};
use crate::store::auth::{self, Secret};

/// A listener on this node's address (the one its peers are told), any free port. A node
/// address that is not an IP (it always is, coming from the store connection) binds all
/// interfaces.
pub fn bind(place: &WorkerPlace, what: &str) -> Result<TcpListener, BackendError> {
    let ip = place.node_addr.parse::<IpAddr>().unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    TcpListener::bind(SocketAddr::new(ip, 0))
        .map_err(|e| BackendError::Comm(format!("bind {what} listener on {ip}: {e}")))
}

/// Accepts the next peer that proves it belongs to this run, by `deadline`; returns its
/// connection and the index it says it has. A connection that fails the hello is closed and
/// logged (once per address), and accepting goes on.
pub fn accept(
    listener: &TcpListener,
    secret: Option<&Secret>,
    ctx: &str,
    deadline: Instant,
    refused: &mut HashSet<IpAddr>,
) -> Result<(TcpStream, u64), BackendError> {
    let err = |e: std::io::Error| BackendError::Comm(format!("{ctx}: accept: {e}"));
    listener.set_nonblocking(true).map_err(err)?;
    loop {
        match listener.accept() {
            Ok((mut s, peer)) => {
                s.set_nonblocking(false).map_err(err)?;
                match auth::hello_accept(&mut s, secret, ctx) {
                    Ok(index) => return Ok((s, index)),
                    Err(e) => {
                        if refused.insert(peer.ip()) {
                            tracing::warn!("{ctx}: closed a connection from {peer}: {e}");
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // Nobody yet (or out of file descriptors): wait a little, up to the deadline.
            Err(e) => {
                if Instant::now() >= deadline {
                    let why = if e.kind() == std::io::ErrorKind::WouldBlock {
                        "no peer connected".into()
                    } else {
                        e.to_string()
                    };
                    return Err(BackendError::Timeout(format!("{ctx}: {why} by the set-up deadline")));
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
}
