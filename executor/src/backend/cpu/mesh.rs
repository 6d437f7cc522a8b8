//! A full mesh of TCP connections between the ranks of a group: one connection per pair, for
//! all-to-all and point-to-point exchanges. Written by hand because what we need is small and
//! specific (a poll(2) loop over many non-blocking sockets with an optional deadline, so one
//! dead peer cannot block the others) and no maintained crate offers collectives over TCP.
//!
//! Set-up: every member publishes its listening address under `cpu/mesh/KEY/INDEX`; the member
//! of lower index connects to the higher one and answers its challenge with its index and the
//! run's proof ([`crate::store::auth::hello_connect`]). Every member connects upwards on a
//! thread while it accepts from below, so no order deadlocks and the set-up is not chained
//! through the members; the connecting side waits for the challenge up to the set-up deadline.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::listen;
use crate::backend::{BackendError, WorkerPlace};
use crate::store::{auth, StoreClient};

/// How long set-up waits for peers.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(120);

pub struct Mesh {
    index: usize,
    /// By group index; `None` for this rank and for a connection dropped after a timeout.
    peers: Vec<Option<TcpStream>>,
}

fn comm(what: &str, e: impl std::fmt::Display) -> BackendError {
    BackendError::Comm(format!("{what}: {e}"))
}

/// One peer's part of an [`Mesh::exchange`]: bytes to send to it and room for bytes from it.
pub struct Transfer<'a> {
    pub peer: usize,
    pub out: &'a [u8],
    pub inp: &'a mut [u8],
}

impl Mesh {
    /// Connects the group `members` (global ranks), which must contain this rank.
    pub fn connect_group(
        place: &WorkerPlace,
        store: &mut StoreClient,
        key: &str,
        members: &[usize],
    ) -> Result<Mesh, BackendError> {
        let n = members.len();
        let index = members.iter().position(|&r| r == place.rank).ok_or_else(|| {
            BackendError::Comm(format!("rank {} is not a member of group `{key}` {members:?}", place.rank))
        })?;
        let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        if n <= 1 {
            return Ok(Mesh { index, peers });
        }
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        let listener = listen::bind(place, "mesh")?;
        let port = listener.local_addr().map_err(|e| comm("mesh listener", e))?.port();
        store.set(&format!("cpu/mesh/{key}/{index}"), &format!("{}:{port}", place.node_addr))?;
        let ctx = format!("cpu mesh `{key}`");
        // Connect to the members above on a thread while accepting those below, so every
        // member's connections proceed at once (doing them in turn would chain the set-up
        // through every member, n round trips deep).
        let mut above = Vec::with_capacity(n - index - 1);
        for j in index + 1..n {
            above.push((j, store.get(&format!("cpu/mesh/{key}/{j}"), CONNECT_TIMEOUT)?));
        }
        let secret = store.secret().cloned();
        let c_ctx = ctx.clone();
        let connector = std::thread::spawn(move || -> Result<Vec<(usize, TcpStream)>, BackendError> {
            let mut out = Vec::with_capacity(above.len());
            for (j, addr) in above {
                let mut s = loop {
                    match TcpStream::connect(&addr) {
                        Ok(s) => break s,
                        Err(e) if Instant::now() > deadline => {
                            return Err(comm(&format!("connect to group rank {j} at {addr}"), e))
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(50)),
                    }
                };
                let wait = deadline.saturating_duration_since(Instant::now());
                auth::hello_connect(&mut s, secret.as_ref(), &c_ctx, index as u64, wait)
                    .map_err(|e| comm(&format!("mesh hello to group rank {j} at {addr}"), e))?;
                out.push((j, s));
            }
            Ok(out)
        });
        let mut refused = HashSet::new();
        for _ in 0..index {
            let (s, j) = listen::accept(&listener, store.secret(), &ctx, deadline, &mut refused)?;
            let j = usize::try_from(j).unwrap_or(usize::MAX);
            if j >= index || peers[j].is_some() {
                return Err(BackendError::Comm(format!("unexpected mesh hello from index {j}")));
            }
            peers[j] = Some(s);
        }
        for (j, s) in connector.join().map_err(|_| BackendError::Comm("mesh connector panicked".into()))?? {
            peers[j] = Some(s);
        }
        for s in peers.iter().flatten() {
            s.set_nodelay(true).map_err(|e| comm("set_nodelay", e))?;
            s.set_nonblocking(true).map_err(|e| comm("set_nonblocking", e))?;
        }
        Ok(Mesh { index, peers })
    }

    /// This rank's index in the group.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Sends and receives with several peers at once; returns when every transfer is complete.
    /// Past `deadline` it fails with [`BackendError::Timeout`] naming the unfinished peers and
    /// drops their connections (their byte streams are no longer in step).
    pub fn exchange(&mut self, transfers: &mut [Transfer<'_>], deadline: Option<Instant>) -> Result<(), BackendError> {
        use std::io::ErrorKind::{Interrupted, WouldBlock};
        use std::os::fd::AsFd;

        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

        for t in transfers.iter() {
            if t.peer == self.index || t.peer >= self.peers.len() {
                return Err(BackendError::Comm(format!("no mesh peer {}", t.peer)));
            }
            if self.peers[t.peer].is_none() {
                return Err(BackendError::Comm(format!(
                    "connection to group rank {} was dropped after a timeout",
                    t.peer
                )));
            }
        }
        let mut sent = vec![0usize; transfers.len()];
        let mut got = vec![0usize; transfers.len()];
        let done =
            |i: usize, t: &Transfer<'_>, sent: &[usize], got: &[usize]| sent[i] == t.out.len() && got[i] == t.inp.len();
        loop {
            let pending: Vec<usize> = (0..transfers.len()).filter(|&i| !done(i, &transfers[i], &sent, &got)).collect();
            if pending.is_empty() {
                return Ok(());
            }
            let timeout = match deadline {
                None => PollTimeout::NONE,
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        let names: Vec<String> = pending.iter().map(|&i| transfers[i].peer.to_string()).collect();
                        for &i in &pending {
                            self.peers[transfers[i].peer] = None;
                        }
                        return Err(BackendError::Timeout(format!(
                            "no exchange with group rank(s) {} in time",
                            names.join(", ")
                        )));
                    }
                    PollTimeout::try_from(left.as_millis().clamp(1, 60_000) as i32).unwrap_or(PollTimeout::MAX)
                }
            };
            let ready: Vec<(bool, bool)> = {
                let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(pending.len());
                for &i in &pending {
                    let t = &transfers[i];
                    let mut flags = PollFlags::empty();
                    if sent[i] < t.out.len() {
                        flags |= PollFlags::POLLOUT;
                    }
                    if got[i] < t.inp.len() {
                        flags |= PollFlags::POLLIN;
                    }
                    let Some(s) = self.peers[t.peer].as_ref() else {
                        return Err(BackendError::Comm(format!("no connection to group rank {}", t.peer)));
                    };
                    fds.push(PollFd::new(s.as_fd(), flags));
                }
                match poll(&mut fds, timeout) {
                    Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                    Err(e) => return Err(comm("poll", e)),
                }
                fds.iter()
                    .map(|f| {
                        let r = f.revents().unwrap_or(PollFlags::empty());
                        let err = r.intersects(PollFlags::POLLERR | PollFlags::POLLHUP);
                        (r.contains(PollFlags::POLLOUT) || err, r.contains(PollFlags::POLLIN) || err)
                    })
                    .collect()
            };
            for (k, &i) in pending.iter().enumerate() {
                let (out_ready, in_ready) = ready[k];
                let t = &mut transfers[i];
                let Some(s) = self.peers[t.peer].as_mut() else { continue };
                if out_ready && sent[i] < t.out.len() {
                    match s.write(&t.out[sent[i]..]) {
                        Ok(0) => return Err(comm(&format!("send to group rank {}", t.peer), "connection closed")),
                        Ok(n) => sent[i] += n,
                        Err(e) if e.kind() == WouldBlock || e.kind() == Interrupted => {}
                        Err(e) => return Err(comm(&format!("send to group rank {}", t.peer), e)),
                    }
                }
                if in_ready && got[i] < t.inp.len() {
                    match s.read(&mut t.inp[got[i]..]) {
                        Ok(0) => return Err(comm(&format!("receive from group rank {}", t.peer), "connection closed")),
                        Ok(n) => got[i] += n,
                        Err(e) if e.kind() == WouldBlock || e.kind() == Interrupted => {}
                        Err(e) => return Err(comm(&format!("receive from group rank {}", t.peer), e)),
                    }
                }
            }
        }
    }

    /// NCCL's all-to-all: block `j` of `send` goes to group rank `j`, whose block `index` of
    /// `recv` receives it. `send` and `recv` have `n` equal blocks.
    pub fn all_to_all(&mut self, send: &[f32], recv: &mut [f32]) -> Result<(), BackendError> {
        let n = self.peers.len();
        if send.len() != recv.len() || !send.len().is_multiple_of(n) {
            return Err(BackendError::Comm(format!("all-to-all of {} into {} over {n} ranks", send.len(), recv.len())));
        }
        let c = send.len() / n;
        let me = self.index;
        let out: &[u8] = bytemuck::cast_slice(send);
        let inp: &mut [u8] = bytemuck::cast_slice_mut(recv);
        let b = c * 4;
        let mut transfers = Vec::with_capacity(n);
        for (j, block) in inp.chunks_mut(b.max(1)).enumerate().take(n) {
            if j == me {
                block.copy_from_slice(&out[j * b..(j + 1) * b]);
            } else {
                transfers.push(Transfer { peer: j, out: &out[j * b..(j + 1) * b], inp: block });
            }
        }
        if c == 0 {
            return Ok(());
        }
        self.exchange(&mut transfers, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Three ranks exchange blocks that name sender and receiver; each block lands in place.
    #[test]
    fn all_to_all_puts_every_block_in_its_place() {
        let (_rt, addr) = crate::store::test_store();
        let n = 3;
        let c = 1000;
        let got: Vec<Vec<f32>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|rank| {
                    let addr = addr.clone();
                    s.spawn(move || {
                        let mut store = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
                        let place = WorkerPlace::single_node(rank, n);
                        let all: Vec<usize> = (0..n).collect();
                        let mut mesh = Mesh::connect_group(&place, &mut store, "w", &all).unwrap();
                        let send: Vec<f32> = (0..n * c).map(|i| (rank * 10_000 + i) as f32).collect();
                        let mut recv = vec![f32::NAN; n * c];
                        mesh.all_to_all(&send, &mut recv).unwrap();
                        recv
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, recv) in got.iter().enumerate() {
            for j in 0..n {
                let want: Vec<f32> = (0..c).map(|k| (j * 10_000 + rank * c + k) as f32).collect();
                assert_eq!(&recv[j * c..(j + 1) * c], &want[..], "rank {rank} block {j}");
            }
        }
    }

    /// A peer that never sends makes the exchange fail at its deadline, not hang.
    #[test]
    fn a_silent_peer_times_out() {
        let (_rt, addr) = crate::store::test_store();
        std::thread::scope(|s| {
            let a = addr.clone();
            let silent = s.spawn(move || {
                let mut store = StoreClient::connect(&a, Duration::from_secs(5), None).unwrap();
                let mesh = Mesh::connect_group(&WorkerPlace::single_node(1, 2), &mut store, "p", &[0, 1]).unwrap();
                std::thread::sleep(Duration::from_millis(600));
                drop(mesh);
            });
            let mut store = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
            let mut mesh = Mesh::connect_group(&WorkerPlace::single_node(0, 2), &mut store, "p", &[0, 1]).unwrap();
            let (out, mut inp) = ([1u8; 16], [0u8; 16]);
            let start = Instant::now();
            let err = mesh
                .exchange(
                    &mut [Transfer { peer: 1, out: &out, inp: &mut inp }],
                    Some(Instant::now() + Duration::from_millis(200)),
                )
                .unwrap_err();
            assert!(matches!(err, BackendError::Timeout(_)), "{err}");
            assert!(start.elapsed() < Duration::from_millis(500));
            // The connection is dropped: a second exchange fails at once.
            let err = mesh.exchange(&mut [Transfer { peer: 1, out: &out, inp: &mut inp }], None).unwrap_err();
            assert!(err.to_string().contains("dropped"), "{err}");
            silent.join().unwrap();
        });
    }
}
