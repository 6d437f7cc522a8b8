//! A ring of TCP connections between the ranks and NCCL's ring all-reduce over it
//! (reduce-scatter then all-gather; each rank sends to `rank+1` and receives from `rank-1`).
//!
//! Sums are taken in a fixed order per chunk, so integer-valued inputs give exact results.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::backend::{BackendError, WorkerPlace};
use crate::store::StoreClient;

/// How long ring set-up waits for peers.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Ring {
    rank: usize,
    world: usize,
    /// To `rank + 1`.
    next: Option<TcpStream>,
    /// From `rank - 1`.
    prev: Option<TcpStream>,
}

fn comm(what: &str, e: impl std::fmt::Display) -> BackendError {
    BackendError::Comm(format!("{what}: {e}"))
}

impl Ring {
    /// Publishes this rank's listening address and connects the ring.
    pub fn connect(place: &WorkerPlace, store: &mut StoreClient) -> Result<Ring, BackendError> {
        let (rank, world) = (place.rank, place.world);
        if world <= 1 {
            return Ok(Ring { rank, world, next: None, prev: None });
        }
        let listener = TcpListener::bind("0.0.0.0:0").map_err(|e| comm("bind ring listener", e))?;
        let port = listener.local_addr().map_err(|e| comm("ring listener", e))?.port();
        store.set(&format!("cpu/ring/{rank}"), &format!("{}:{port}", place.node_addr))?;
        let next_rank = (rank + 1) % world;
        let next_addr = store.get(&format!("cpu/ring/{next_rank}"), CONNECT_TIMEOUT)?;

        // Connect forward on a thread while accepting from behind, so no order can deadlock.
        let connector = std::thread::spawn(move || -> Result<TcpStream, BackendError> {
            let start = Instant::now();
            loop {
                match TcpStream::connect(&next_addr) {
                    Ok(mut s) => {
                        s.write_all(&(rank as u64).to_le_bytes()).map_err(|e| comm("ring hello", e))?;
                        return Ok(s);
                    }
                    Err(e) if start.elapsed() > CONNECT_TIMEOUT => {
                        return Err(comm(&format!("connect to rank {next_rank} at {next_addr}"), e))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        let prev_rank = (rank + world - 1) % world;
        let (mut prev, _) = listener.accept().map_err(|e| comm("accept ring peer", e))?;
        let mut hello = [0u8; 8];
        prev.read_exact(&mut hello).map_err(|e| comm("ring hello", e))?;
        if u64::from_le_bytes(hello) != prev_rank as u64 {
            return Err(BackendError::Comm(format!(
                "ring peer says rank {}, expected {prev_rank}",
                u64::from_le_bytes(hello)
            )));
        }
        let next = connector.join().map_err(|_| BackendError::Comm("ring connector panicked".into()))??;
        for s in [&next, &prev] {
            s.set_nodelay(true).map_err(|e| comm("set_nodelay", e))?;
            s.set_nonblocking(true).map_err(|e| comm("set_nonblocking", e))?;
        }
        Ok(Ring { rank, world, next: Some(next), prev: Some(prev) })
    }

    /// `recv = sum over ranks of send`, element-wise.
    pub fn all_reduce_sum(&mut self, send: &[f32], recv: &mut [f32]) -> Result<(), BackendError> {
        recv.copy_from_slice(send);
        let (w, r) = (self.world, self.rank);
        if w <= 1 {
            return Ok(());
        }
        let n = recv.len();
        let bounds = |c: usize| (c * n / w, (c + 1) * n / w);
        let mut scratch = vec![0f32; n.div_ceil(w)];
        // Reduce-scatter: after step s, chunk (r - s - 1) holds the sum of s + 2 ranks.
        for s in 0..w - 1 {
            let (ss, se) = bounds((r + w - s) % w);
            let (rs, re) = bounds((r + 2 * w - s - 1) % w);
            self.exchange(&recv[ss..se], &mut scratch[..re - rs])?;
            for (d, x) in recv[rs..re].iter_mut().zip(&scratch) {
                *d += *x;
            }
        }
        // All-gather: rank r now owns the full sum of chunk (r + 1); pass the sums around.
        for s in 0..w - 1 {
            let (ss, se) = bounds((r + 1 + w - s) % w);
            let (rs, re) = bounds((r + w - s) % w);
            self.exchange(&recv[ss..se], &mut scratch[..re - rs])?;
            recv[rs..re].copy_from_slice(&scratch[..re - rs]);
        }
        Ok(())
    }

    /// Sends `out` to the next rank while receiving `inp` from the previous one, on one thread:
    /// both sockets are non-blocking and poll(2) says which one can make progress, so neither
    /// side can deadlock on a full socket buffer.
    fn exchange(&mut self, out: &[f32], inp: &mut [f32]) -> Result<(), BackendError> {
        use std::io::ErrorKind::{Interrupted, WouldBlock};
        use std::os::fd::AsFd;

        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

        let (Some(next), Some(prev)) = (self.next.as_mut(), self.prev.as_mut()) else {
            return Err(BackendError::Comm("ring not connected".into()));
        };
        let out: &[u8] = bytemuck::cast_slice(out);
        let inp: &mut [u8] = bytemuck::cast_slice_mut(inp);
        let (mut sent, mut got) = (0usize, 0usize);
        while sent < out.len() || got < inp.len() {
            let (want_out, want_in) = (sent < out.len(), got < inp.len());
            let (out_ready, in_ready) = {
                let mut fds = [
                    PollFd::new(next.as_fd(), if want_out { PollFlags::POLLOUT } else { PollFlags::empty() }),
                    PollFd::new(prev.as_fd(), if want_in { PollFlags::POLLIN } else { PollFlags::empty() }),
                ];
                match poll(&mut fds, PollTimeout::NONE) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(comm("poll", e)),
                }
                let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
                (ready(&fds[0]), ready(&fds[1]))
            };
            if want_out && out_ready {
                match next.write(&out[sent..]) {
                    Ok(0) => return Err(comm("send to next rank", "connection closed")),
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == WouldBlock || e.kind() == Interrupted => {}
                    Err(e) => return Err(comm("send to next rank", e)),
                }
            }
            if want_in && in_ready {
                match prev.read(&mut inp[got..]) {
                    Ok(0) => return Err(comm("receive from previous rank", "connection closed")),
                    Ok(n) => got += n,
                    Err(e) if e.kind() == WouldBlock || e.kind() == Interrupted => {}
                    Err(e) => return Err(comm("receive from previous rank", e)),
                }
            }
        }
        Ok(())
    }
}
