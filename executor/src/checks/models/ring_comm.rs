//! The models' [`Comm`] over the CPU workers' TCP ring. The ring lives on a thread of its own,
//! which sums what it is sent in the order sent: a bucket of gradients started during the
//! backward is summed there while the backward goes on, and a plain all-reduce waits for its
//! own sum (after those sent before it).

use std::collections::VecDeque;
use std::sync::mpsc;

use gpusanity_models::comm::Comm;
use gpusanity_models::{ModelError, Result};

use crate::backend::cpu::ring::Ring;

/// A sum from the ring's thread, or why it failed.
type Sum = std::result::Result<Vec<f32>, String>;

pub(super) struct RingComm {
    size: usize,
    rank: usize,
    /// To the ring's thread; it ends when this closes (or after a failed sum: a ring that
    /// failed mid-way is out of step with its peers).
    jobs: mpsc::Sender<Vec<f32>>,
    sums: mpsc::Receiver<Sum>,
    /// Buckets started and not yet finished.
    pending: usize,
    /// Their sums, when a later plain all-reduce had to read past them.
    early: VecDeque<Sum>,
}

fn comm_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Comm(e.to_string())
}

impl RingComm {
    pub(super) fn new(mut ring: Ring) -> Result<RingComm> {
        let (size, rank) = (ring.size(), ring.rank());
        let (jobs, job_rx) = mpsc::channel::<Vec<f32>>();
        let (sum_tx, sums) = mpsc::channel::<Sum>();
        // Not joined: it ends on its own when `jobs` closes, and a join could wait on a peer
        // that never answers (the worker's stall detection names that case).
        std::thread::Builder::new()
            .name("ring-comm".into())
            .spawn(move || {
                for send in job_rx {
                    let mut recv = vec![0f32; send.len()];
                    let sum = ring.all_reduce_sum(&send, &mut recv).map(|()| recv).map_err(|e| e.to_string());
                    let failed = sum.is_err();
                    if sum_tx.send(sum).is_err() || failed {
                        break;
                    }
                }
            })
            .map_err(|e| comm_err(format!("starting the ring's thread: {e}")))?;
        Ok(RingComm { size, rank, jobs, sums, pending: 0, early: VecDeque::new() })
    }

    fn send(&mut self, values: Vec<f32>) -> Result<()> {
        self.jobs.send(values).map_err(|_| comm_err("the ring's thread has ended after an earlier failure"))
    }

    fn receive(&mut self) -> Result<Vec<f32>> {
        match self.sums.recv() {
            Ok(sum) => sum.map_err(comm_err),
            Err(_) => Err(comm_err("the ring's thread has ended after an earlier failure")),
        }
    }
}

/// Writes `sum` back into `bufs`, which it concatenates.
fn scatter(sum: &[f32], bufs: &mut [&mut Vec<f32>]) -> Result<()> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    if total != sum.len() {
        return Err(comm_err(format!("a bucket of {total} values got a sum of {}", sum.len())));
    }
    let mut rest = sum;
    for b in bufs.iter_mut() {
        let (head, tail) = rest.split_at(b.len());
        b.copy_from_slice(head);
        rest = tail;
    }
    Ok(())
}

impl Comm<Vec<f32>> for RingComm {
    fn size(&self) -> usize {
        self.size
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_reduce_sum(&mut self, buf: &mut Vec<f32>) -> Result<()> {
        self.send(buf.clone())?;
        // The sums of the buckets started before come first.
        while self.early.len() < self.pending {
            let sum = self.sums.recv().map_err(|_| comm_err("the ring's thread has ended after an earlier failure"))?;
            self.early.push_back(sum);
        }
        let sum = self.receive()?;
        scatter(&sum, &mut [buf])
    }
    /// One pass of the ring over the buffers' concatenation: a bucket of small gradients
    /// costs one ring's latency, not one per gradient.
    fn all_reduce_sum_bucket(&mut self, bufs: &mut [&mut Vec<f32>]) -> Result<()> {
        self.start_bucket(bufs)?;
        self.finish_bucket(bufs)
    }
    fn start_bucket(&mut self, bufs: &mut [&mut Vec<f32>]) -> Result<()> {
        let send: Vec<f32> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
        self.send(send)?;
        self.pending += 1;
        Ok(())
    }
    fn finish_bucket(&mut self, bufs: &mut [&mut Vec<f32>]) -> Result<()> {
        if self.pending == 0 {
            return Err(comm_err("finishing a bucket that was not started"));
        }
        self.pending -= 1;
        let sum = match self.early.pop_front() {
            Some(sum) => sum.map_err(comm_err)?,
            None => self.receive()?,
        };
        scatter(&sum, bufs)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::WorkerPlace;
    use crate::store::StoreClient;

    type Bufs = Vec<Vec<f32>>;

    /// Lengths of the test's buffers: uneven, one empty.
    const LENS: [usize; 4] = [5, 0, 1001, 3];

    /// Buffer `b` of `rank` (exact in f32, so every order of summation agrees).
    fn values(rank: usize, b: usize) -> Vec<f32> {
        (0..LENS[b]).map(|i| ((i * 7 + b * 13) % 97) as f32 * (rank + 1) as f32 + 0.25).collect()
    }

    fn sum_over_ranks(b: usize, ranks: usize) -> Vec<f32> {
        (0..LENS[b]).map(|i| (0..ranks).map(|r| values(r, b)[i]).sum()).collect()
    }

    /// Three ranks: a bucket summed at once; then two buckets started with a plain
    /// all-reduce between them, finished after it: each buffer gets exactly its own sum.
    #[test]
    fn buckets_and_plain_all_reduces_get_their_own_sums_in_any_interleaving() {
        let (_rt, addr) = crate::store::test_store();
        let got: Vec<(Bufs, Bufs, Vec<f32>, Bufs)> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|rank| {
                    let addr = addr.clone();
                    s.spawn(move || {
                        let mut store = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
                        let place = WorkerPlace::single_node(rank, 3);
                        let ring = Ring::connect_group(&place, &mut store, "bucket", &[0, 1, 2]).unwrap();
                        let mut comm = RingComm::new(ring).unwrap();
                        let all = |rank| (0..LENS.len()).map(|b| values(rank, b)).collect::<Bufs>();
                        let mut at_once = all(rank);
                        comm.all_reduce_sum_bucket(&mut at_once.iter_mut().collect::<Vec<_>>()).unwrap();
                        let (mut first, mut second) = (all(rank), all(rank));
                        comm.start_bucket(&mut first.iter_mut().collect::<Vec<_>>()).unwrap();
                        let mut plain = values(rank, 2);
                        comm.all_reduce_sum(&mut plain).unwrap();
                        comm.start_bucket(&mut second[1..].iter_mut().collect::<Vec<_>>()).unwrap();
                        comm.finish_bucket(&mut first.iter_mut().collect::<Vec<_>>()).unwrap();
                        comm.finish_bucket(&mut second[1..].iter_mut().collect::<Vec<_>>()).unwrap();
                        assert!(comm.finish_bucket(&mut []).is_err(), "a bucket never started");
                        (at_once, first, plain, second)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, (at_once, first, plain, second)) in got.iter().enumerate() {
            for b in 0..LENS.len() {
                let want = sum_over_ranks(b, 3);
                assert_eq!(at_once[b], want, "rank {rank} buffer {b}, summed at once");
                assert_eq!(first[b], want, "rank {rank} buffer {b}, first started");
                let second_want = if b == 0 { values(rank, 0) } else { want };
                assert_eq!(second[b], second_want, "rank {rank} buffer {b}, second started");
            }
            assert_eq!(plain, &sum_over_ranks(2, 3), "rank {rank}, plain all-reduce");
        }
    }
}
