//! The host-side probes of `network-connectivity`: the front-end echo server and its TCP
//! probe, and the RDMA ports under /sys/class/infiniband.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

/// One RDMA port under /sys/class/infiniband.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IbPort {
    pub device: String,
    pub port: String,
    /// E.g. `ACTIVE`, `DOWN`, `INIT`.
    pub state: String,
    /// E.g. `400 Gb/sec (4X NDR)`.
    pub rate: String,
}

/// Connects to `addr`, sends this node's rank and waits for the echo, all within `timeout`.
/// Returns the round trip in milliseconds.
pub(super) fn probe_front(addr: &str, me: usize, timeout: Duration) -> Result<f64, String> {
    let start = Instant::now();
    let sock = addr
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve: {e}"))?
        .next()
        .ok_or_else(|| "no address".to_string())?;
    let mut s = TcpStream::connect_timeout(&sock, timeout).map_err(|e| format!("connect: {e}"))?;
    let left = timeout.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
    s.set_read_timeout(Some(left)).and_then(|_| s.set_write_timeout(Some(left))).map_err(|e| e.to_string())?;
    let hello = (me as u64).to_le_bytes();
    s.write_all(&hello).map_err(|e| format!("send: {e}"))?;
    let mut echo = [0u8; 8];
    s.read_exact(&mut echo).map_err(|e| format!("no echo: {e}"))?;
    if echo != hello {
        return Err("wrong echo".into());
    }
    Ok(start.elapsed().as_secs_f64() * 1e3)
}

/// The front-end listener: echoes 8 bytes on every connection until dropped.
pub(super) struct EchoServer {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EchoServer {
    /// With `closed`, the port is bound and released at once: a closed port (injected fault).
    pub fn start(timeout: Duration, closed: bool) -> std::io::Result<EchoServer> {
        let listener = TcpListener::bind("0.0.0.0:0")?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        if closed {
            return Ok(EchoServer { port, stop, thread: None });
        }
        listener.set_nonblocking(true)?;
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let _ = s.set_nonblocking(false);
                        let _ = s.set_read_timeout(Some(timeout));
                        let mut b = [0u8; 8];
                        if s.read_exact(&mut b).is_ok() {
                            let _ = s.write_all(&b);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Ok(EchoServer { port, stop, thread: Some(thread) })
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The RDMA ports under `root` (`/sys/class/infiniband/DEV/ports/N/{state,rate}`); empty where
/// there is none.
pub fn ib_ports(root: &Path) -> Vec<IbPort> {
    let read = |p: &Path| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let mut out = Vec::new();
    let Ok(devs) = std::fs::read_dir(root) else { return out };
    for dev in devs.flatten() {
        let Ok(ports) = std::fs::read_dir(dev.path().join("ports")) else { continue };
        for port in ports.flatten() {
            let state = read(&port.path().join("state"));
            // "4: ACTIVE" -> "ACTIVE"
            let state = state.split_once(':').map_or(state.as_str(), |(_, s)| s.trim()).to_string();
            out.push(IbPort {
                device: dev.file_name().to_string_lossy().into_owned(),
                port: port.file_name().to_string_lossy().into_owned(),
                state,
                rate: read(&port.path().join("rate")),
            });
        }
    }
    out.sort_by(|a, b| (&a.device, &a.port).cmp(&(&b.device, &b.port)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ib_ports_are_read_and_a_port_not_active_shows() {
        let root = std::env::temp_dir().join(format!("gpusanity-ib-{}", std::process::id()));
        for (dev, port, state) in [("mlx5_0", "1", "4: ACTIVE"), ("mlx5_1", "1", "1: DOWN")] {
            let d = root.join(dev).join("ports").join(port);
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("state"), format!("{state}\n")).unwrap();
            std::fs::write(d.join("rate"), "400 Gb/sec (4X NDR)\n").unwrap();
        }
        let ports = ib_ports(&root);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(ports.len(), 2);
        assert_eq!((ports[0].state.as_str(), ports[1].state.as_str()), ("ACTIVE", "DOWN"));
        assert_eq!(ports[0].rate, "400 Gb/sec (4X NDR)");
        assert!(ib_ports(Path::new("/nonexistent/infiniband")).is_empty());
    }

    #[test]
    fn front_probe_of_a_closed_port_fails_fast_and_an_echo_passes() {
        let closed = EchoServer::start(Duration::from_secs(1), true).unwrap();
        let t = Instant::now();
        let e = probe_front(&format!("127.0.0.1:{}", closed.port), 0, Duration::from_secs(2)).unwrap_err();
        assert!(e.contains("connect"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(1));
        let open = EchoServer::start(Duration::from_secs(1), false).unwrap();
        assert!(probe_front(&format!("127.0.0.1:{}", open.port), 3, Duration::from_secs(2)).is_ok());
    }
}
