//! A ring of TCP connections between the ranks and NCCL's ring all-reduce over it
//! (reduce-scatter then all-gather; each rank sends to `rank+1` and receives from `rank-1`).
//!
//! Sums are taken in a fixed order per chunk, so integer-valued inputs give exact results.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::listen;
use crate::backend::{BackendError, WorkerPlace};
use crate::store::{auth, StoreClient};

/// How long ring set-up waits for peers (to publish, connect and say hello).
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
    /// The ring of all ranks.
    pub fn connect(place: &WorkerPlace, store: &mut StoreClient) -> Result<Ring, BackendError> {
        let all: Vec<usize> = (0..place.world).collect();
        Ring::connect_group(place, store, "world", &all)
    }

    /// The ring of the group `members` (global ranks, in ring order), which must contain this
    /// rank. Every member calls this with the same `key`, unique per group in the run: it
    /// publishes its listening address under `cpu/ring/KEY/INDEX` and connects.
    pub fn connect_group(
        place: &WorkerPlace,
        store: &mut StoreClient,
        key: &str,
        members: &[usize],
    ) -> Result<Ring, BackendError> {
        let world = members.len();
        let rank = members.iter().position(|&r| r == place.rank).ok_or_else(|| {
            BackendError::Comm(format!("rank {} is not a member of group `{key}` {members:?}", place.rank))
        })?;
        if world <= 1 {
            return Ok(Ring { rank, world, next: None, prev: None });
        }
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let listener = listen::bind(place, "ring")?;
        let port = listener.local_addr().map_err(|e| comm("ring listener", e))?.port();
        store.set(&format!("cpu/ring/{key}/{rank}"), &format!("{}:{port}", place.node_addr))?;
        let next_rank = (rank + 1) % world;
        let next_addr = store.get(&format!("cpu/ring/{key}/{next_rank}"), CONNECT_TIMEOUT)?;
        let secret = store.secret().cloned();
        let ctx = format!("cpu ring `{key}`");

        // Connect forward on a thread while accepting from behind, so no order can deadlock.
        let c_ctx = ctx.clone();
        let connector = std::thread::spawn(move || -> Result<TcpStream, BackendError> {
            loop {
                match TcpStream::connect(&next_addr) {
                    Ok(mut s) => {
                        let wait = deadline.saturating_duration_since(Instant::now());
                        auth::hello_connect(&mut s, secret.as_ref(), &c_ctx, rank as u64, wait)
                            .map_err(|e| comm(&format!("ring hello to rank {next_rank} at {next_addr}"), e))?;
                        return Ok(s);
                    }
                    Err(e) if Instant::now() > deadline => {
                        return Err(comm(&format!("connect to rank {next_rank} at {next_addr}"), e))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(50)),
                }
            }
        });
        let prev_rank = (rank + world - 1) % world;
        let (prev, said) = listen::accept(&listener, store.secret(), &ctx, deadline, &mut HashSet::new())?;
        if said != prev_rank as u64 {
            return Err(BackendError::Comm(format!("ring peer says rank {said}, expected {prev_rank}")));
        }
        let next = connector.join().map_err(|_| BackendError::Comm("ring connector panicked".into()))??;
        for s in [&next, &prev] {
            s.set_nodelay(true).map_err(|e| comm("set_nodelay", e))?;
            s.set_nonblocking(true).map_err(|e| comm("set_nonblocking", e))?;
        }
        Ok(Ring { rank, world, next: Some(next), prev: Some(prev) })
    }

    /// This rank's index in the ring.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks in the ring.
    pub fn size(&self) -> usize {
        self.world
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

    /// NCCL's reduce-scatter: `recv` is the sum over the ranks of block `rank` of `send`
    /// (`send` holds `size()` blocks of `recv.len()`). Each step passes one partial sum along
    /// the ring; after `size() - 1` steps this rank holds the whole sum of its own block.
    pub fn reduce_scatter_sum(&mut self, send: &[f32], recv: &mut [f32]) -> Result<(), BackendError> {
        let (w, r, c) = (self.world, self.rank, recv.len());
        if send.len() != w * c {
            return Err(BackendError::Comm(format!("reduce-scatter of {} into {c} over {w} ranks", send.len())));
        }
        let mut acc = send.to_vec();
        let mut scratch = vec![0f32; c];
        for s in 0..w.saturating_sub(1) {
            let (sb, rb) = ((r + 2 * w - s - 1) % w, (r + 2 * w - s - 2) % w);
            self.exchange(&acc[sb * c..(sb + 1) * c], &mut scratch)?;
            for (d, x) in acc[rb * c..(rb + 1) * c].iter_mut().zip(&scratch) {
                *d += *x;
            }
        }
        recv.copy_from_slice(&acc[r * c..(r + 1) * c]);
        Ok(())
    }

    /// NCCL's all-gather: this rank's `send` lands in block `rank` of `recv` on every rank
    /// (`recv` holds `size()` blocks of `send.len()`). Each step passes one block along the ring.
    pub fn all_gather(&mut self, send: &[f32], recv: &mut [f32]) -> Result<(), BackendError> {
        let (w, r, c) = (self.world, self.rank, send.len());
        if recv.len() != w * c {
            return Err(BackendError::Comm(format!("all-gather of {c} into {} over {w} ranks", recv.len())));
        }
        recv[r * c..(r + 1) * c].copy_from_slice(send);
        let mut out = vec![0f32; c];
        for s in 0..w.saturating_sub(1) {
            let (sb, rb) = ((r + w - s) % w, (r + 2 * w - s - 1) % w);
            out.copy_from_slice(&recv[sb * c..(sb + 1) * c]);
            self.exchange(&out, &mut recv[rb * c..(rb + 1) * c])?;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Four ranks form two disjoint rings at once ({0, 2} and {1, 3}) and each sums exactly.
    #[test]
    fn disjoint_groups_sum_within_themselves() {
        let (_rt, addr) = crate::store::test_store();
        let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|rank| {
                    let addr = addr.clone();
                    s.spawn(move || {
                        let mut store = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
                        let place = WorkerPlace::single_node(rank, 4);
                        let members = if rank % 2 == 0 { [0, 2] } else { [1, 3] };
                        let key = format!("pair{}", rank % 2);
                        let mut ring = Ring::connect_group(&place, &mut store, &key, &members).unwrap();
                        assert_eq!(ring.size(), 2);
                        assert_eq!(ring.rank(), rank / 2);
                        let send: Vec<f32> = (0..1001).map(|i| (i * (rank + 1)) as f32).collect();
                        let mut recv = vec![0f32; send.len()];
                        ring.all_reduce_sum(&send, &mut recv).unwrap();
                        recv
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, got) in sums.iter().enumerate() {
            // Ranks r and r + 2 multiply i by (r + 1) and (r + 3).
            let factor = if rank % 2 == 0 { 1 + 3 } else { 2 + 4 };
            let want: Vec<f32> = (0..1001).map(|i| (i * factor) as f32).collect();
            assert_eq!(got, &want, "rank {rank}");
        }
    }

    /// Three ranks gather blocks that name their sender, each in its place.
    #[test]
    fn all_gather_places_every_block() {
        let (_rt, addr) = crate::store::test_store();
        let got: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|rank| {
                    let addr = addr.clone();
                    s.spawn(move || {
                        let mut store = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
                        let mut ring = Ring::connect(&WorkerPlace::single_node(rank, 3), &mut store).unwrap();
                        let send: Vec<f32> = (0..777).map(|i| (rank * 1000 + i) as f32).collect();
                        let mut recv = vec![f32::NAN; 3 * 777];
                        ring.all_gather(&send, &mut recv).unwrap();
                        recv
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want: Vec<f32> = (0..3).flat_map(|r| (0..777).map(move |i| (r * 1000 + i) as f32)).collect();
        for g in &got {
            assert_eq!(g, &want);
        }
    }

    /// With a secret, a stranger that connects to a rank's listener first is refused (it
    /// cannot prove the secret) and the ring forms with the real peer after it.
    #[test]
    fn a_stranger_is_refused_and_the_ring_still_forms() {
        let secret = crate::store::Secret::random();
        let (_rt, addr) = crate::store::test_store_with(Some(secret.clone()));
        let wait = Duration::from_secs(20);
        std::thread::scope(|s| {
            let ring = |rank: usize| {
                let (addr, secret) = (addr.clone(), secret.clone());
                move || {
                    let mut store = StoreClient::connect(&addr, wait, Some(secret)).unwrap();
                    let mut ring = Ring::connect(&WorkerPlace::single_node(rank, 2), &mut store).unwrap();
                    let mut recv = vec![0f32; 3];
                    ring.all_reduce_sum(&[1.0, 2.0, 3.0], &mut recv).unwrap();
                    recv
                }
            };
            let r0 = s.spawn(ring(0));
            // The test reads rank 0's address from the store; a stranger would scan for it.
            let mut store = StoreClient::connect(&addr, wait, Some(secret.clone())).unwrap();
            let target = store.get("cpu/ring/world/0", wait).unwrap();
            let mut stranger = TcpStream::connect(&target).unwrap();
            stranger.set_read_timeout(Some(wait)).unwrap();
            let r1 = s.spawn(ring(1));
            let mut nonce = [0u8; 32];
            stranger.read_exact(&mut nonce).unwrap();
            // Index 1 and a made-up nonce and proof.
            let mut hello = vec![0u8; 72];
            hello[0] = 1;
            stranger.write_all(&hello).unwrap();
            let mut b = [0u8; 1];
            assert!(matches!(stranger.read(&mut b), Ok(0) | Err(_)), "the stranger got an answer");
            assert_eq!(r0.join().unwrap(), [2.0, 4.0, 6.0]);
            assert_eq!(r1.join().unwrap(), [2.0, 4.0, 6.0]);
        });
    }

    #[test]
    fn a_rank_outside_the_group_is_refused() {
        let (_rt, addr) = crate::store::test_store();
        let mut store = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
        let place = WorkerPlace::single_node(1, 4);
        let err = Ring::connect_group(&place, &mut store, "g", &[0, 2]).err().unwrap();
        assert!(err.to_string().contains("not a member"), "{err}");
    }
}
