//! Node 0's listening socket for the store: on one port (0: any free one), or on the first
//! free port of a range. The launcher binds it itself and keeps it, and tells its parent the
//! port it got: no port is chosen, dropped and bound again, so no other process can take it in
//! between.

use std::net::{IpAddr, SocketAddr};

use gpusanity_common::wire::launcher::PortRange;
use thiserror::Error;

/// Connections the store's listener queues before it accepts them: a thousand ranks arrive at
/// once, and the default queue of the platform may be shorter.
const BACKLOG: u32 = 4096;

/// Which ports node 0 may listen on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// This port; 0: any free one.
    One(u16),
    /// The first free port of the range.
    Range(PortRange),
}

#[derive(Debug, Error)]
pub enum BindError {
    #[error("every port of {0} is in use")]
    RangeBusy(PortRange),
    #[error("port {port}: {source}")]
    Port {
        port: u16,
        #[source]
        source: std::io::Error,
    },
}

impl BindError {
    /// The address is not one of this host's (the port itself may be free).
    pub fn address_not_here(&self) -> bool {
        matches!(self, BindError::Port { source, .. } if source.kind() == std::io::ErrorKind::AddrNotAvailable)
    }
}

/// The store's listening socket on `addr` (must be called inside a tokio runtime).
pub fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(BACKLOG)
}

/// A listening socket on `ip` and one of `ports` (inside a tokio runtime): a port of a range
/// that is in use is passed over; any other error ends the search.
pub fn listen_on(ip: IpAddr, ports: Ports) -> Result<tokio::net::TcpListener, BindError> {
    let range = match ports {
        Ports::One(port) => return listen((ip, port).into()).map_err(|source| BindError::Port { port, source }),
        Ports::Range(r) => r,
    };
    for port in range.ports() {
        match listen((ip, port).into()) {
            Ok(l) => return Ok(l),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {}
            Err(source) => return Err(BindError::Port { port, source }),
        }
    }
    Err(BindError::RangeBusy(range))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const LO: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    #[test]
    fn a_range_gives_its_first_free_port_and_a_busy_range_is_an_error() {
        let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
        let _in = rt.enter();
        let taken = listen_on(LO, Ports::One(0)).expect("any port");
        let busy = taken.local_addr().expect("address").port();
        assert_ne!(busy, 0);
        // The one port of the range is held: a typed error naming the range.
        let one = PortRange::new(busy, busy).expect("range");
        assert!(matches!(listen_on(LO, Ports::Range(one)), Err(BindError::RangeBusy(r)) if r == one));
        let e = listen_on(LO, Ports::One(busy)).expect_err("the held port");
        assert!(matches!(&e, BindError::Port { port, source } if *port == busy
            && source.kind() == std::io::ErrorKind::AddrInUse));
        assert!(!e.address_not_here());
        // A wider range passes over the held port, and the port it reports stays bound.
        if let Some(last) = busy.checked_add(20) {
            let l = listen_on(LO, Ports::Range(PortRange::new(busy, last).expect("range"))).expect("a free port");
            let got = l.local_addr().expect("address").port();
            assert!(got > busy && got <= last, "{got} outside {busy}-{last}");
            assert!(std::net::TcpListener::bind((LO, got)).is_err(), "port {got} was let go");
            assert!(std::net::TcpStream::connect((LO, got)).is_ok(), "nothing listens on {got}");
        }
    }

    #[test]
    fn an_address_of_another_host_is_told_apart() {
        let rt = tokio::runtime::Runtime::new().expect("tokio runtime");
        let _in = rt.enter();
        // TEST-NET-1 (RFC 5737): never an address of this host.
        let e = listen_on(IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1)), Ports::One(0)).expect_err("not ours");
        assert!(e.address_not_here(), "{e}");
    }
}
