//! The models' [`Comm`] over the CPU workers' TCP ring. Plain all-reduces (tensor
//! parallelism's, inside the forward and backward) run on the caller's thread. The first
//! bucket started moves the ring to a thread of its own, which sums what it is sent in the
//! order sent: a bucket of gradients started during the backward is summed there while the
//! backward goes on, and a plain all-reduce after that waits for its own sum (after those sent
//! before it).

use std::collections::VecDeque;
use std::sync::mpsc;

use gpusanity_models::comm::Comm;
use gpusanity_models::{ModelError, Result};

use crate::backend::cpu::ring::Ring;

/// A sum from the ring's thread, or why it failed.
type Sum = std::result::Result<Vec<f32>, String>;

/// Values to sum, and where their sum goes.
type Job = (Vec<f32>, mpsc::Sender<Sum>);

pub(super) struct RingComm {
    size: usize,
    rank: usize,
    at: At,
    /// Where the sums of the buckets started and not yet finished arrive, oldest first.
    pending: VecDeque<mpsc::Receiver<Sum>>,
}

/// Where the ring is.
enum At {
    /// On the caller's thread (no bucket started yet).
    Here(Ring),
    /// On its own thread, which sums the jobs in the order sent. It ends when this sender
    /// closes, or after a failed sum (a ring that failed mid-way is out of step with its peers).
    Away(mpsc::Sender<Job>),
    /// Between the two, for a moment; left so only if the thread could not start.
    Moving,
}

fn comm_err(e: impl std::fmt::Display) -> ModelError {
    ModelError::Comm(e.to_string())
}

const ENDED: &str = "the ring's thread has ended after an earlier failure";

impl RingComm {
    pub(super) fn new(ring: Ring) -> RingComm {
        let (size, rank) = (ring.size(), ring.rank());
        RingComm { size, rank, at: At::Here(ring), pending: VecDeque::new() }
    }

    /// Sends `values` to the ring's thread (moving the ring there first if it is not there
    /// yet); their sum arrives on the receiver returned.
    fn send(&mut self, values: Vec<f32>) -> Result<mpsc::Receiver<Sum>> {
        if let At::Here(_) = self.at {
            let At::Here(mut ring) = std::mem::replace(&mut self.at, At::Moving) else {
                return Err(comm_err("the ring moved twice"));
            };
            let (jobs, job_rx) = mpsc::channel::<Job>();
            // Not joined: it ends on its own when `jobs` closes, and a join could wait on a
            // peer that never answers (the worker's stall detection names that case).
            std::thread::Builder::new()
                .name("ring-comm".into())
                .spawn(move || {
                    for (send, reply) in job_rx {
                        let mut recv = vec![0f32; send.len()];
                        let sum = ring.all_reduce_sum(&send, &mut recv).map(|()| recv).map_err(|e| e.to_string());
                        let failed = sum.is_err();
                        // A caller that went away no longer wants its sum; the ring goes on.
                        let _ = reply.send(sum);
                        if failed {
                            break;
                        }
                    }
                })
                .map_err(|e| comm_err(format!("starting the ring's thread: {e}")))?;
            self.at = At::Away(jobs);
        }
        let At::Away(jobs) = &self.at else {
            return Err(comm_err("the ring's thread could not be started"));
        };
        let (reply, sum) = mpsc::channel();
        jobs.send((values, reply)).map_err(|_| comm_err(ENDED))?;
        Ok(sum)
    }
}

/// Waits for a sum from the ring's thread.
fn receive(sum: &mpsc::Receiver<Sum>) -> Result<Vec<f32>> {
    sum.recv().map_err(|_| comm_err(ENDED))?.map_err(comm_err)
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
        if let At::Here(ring) = &mut self.at {
            let send = buf.clone();
            return ring.all_reduce_sum(&send, buf).map_err(comm_err);
        }
        // After the buckets sent before it, on the ring's thread.
        let sum = self.send(buf.clone())?;
        scatter(&receive(&sum)?, &mut [buf])
    }
    /// One pass of the ring over the buffers' concatenation: a bucket of small gradients
    /// costs one ring's latency, not one per gradient.
    fn all_reduce_sum_bucket(&mut self, bufs: &mut [&mut Vec<f32>]) -> Result<()> {
        self.start_bucket(bufs)?;
        self.finish_bucket(bufs)
    }
    fn start_bucket(&mut self, bufs: &mut [&mut Vec<f32>]) -> Result<()> {
        let sum = self.send(bufs.iter().flat_map(|b| b.iter().copied()).collect())?;
        self.pending.push_back(sum);
        Ok(())
    }
    fn finish_bucket(&mut self, bufs: &mut [&mut Vec<f32>]) -> Result<()> {
        let sum = self.pending.pop_front().ok_or_else(|| comm_err("finishing a bucket that was not started"))?;
        scatter(&receive(&sum)?, bufs)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::WorkerPlace;
    use crate::store::StoreClient;

    type Bufs = Vec<Vec<f32>>;
    /// A rank's buffers after each step of the test.
    type Got = (Vec<f32>, Bufs, Bufs, Vec<f32>, Bufs);

    /// Lengths of the test's buffers: uneven, one empty.
    const LENS: [usize; 4] = [5, 0, 1001, 3];

    /// Buffer `b` of `rank` (exact in f32, so every order of summation agrees).
    fn values(rank: usize, b: usize) -> Vec<f32> {
        (0..LENS[b]).map(|i| ((i * 7 + b * 13) % 97) as f32 * (rank + 1) as f32 + 0.25).collect()
    }

    fn sum_over_ranks(b: usize, ranks: usize) -> Vec<f32> {
        (0..LENS[b]).map(|i| (0..ranks).map(|r| values(r, b)[i]).sum()).collect()
    }

    /// Three ranks: a plain all-reduce (on the caller's thread), a bucket summed at once (the
    /// ring moves to its thread); then two buckets started with a plain all-reduce between
    /// them, finished after it: each buffer gets exactly its own sum.
    #[test]
    fn buckets_and_plain_all_reduces_get_their_own_sums_in_any_interleaving() {
        let (_rt, addr) = crate::store::test_store();
        let got: Vec<Got> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..3)
                .map(|rank| {
                    let addr = addr.clone();
                    s.spawn(move || {
                        let mut store = StoreClient::connect(&addr, Duration::from_secs(5), None).unwrap();
                        let place = WorkerPlace::single_node(rank, 3);
                        let ring = Ring::connect_group(&place, &mut store, "bucket", &[0, 1, 2]).unwrap();
                        let mut comm = RingComm::new(ring);
                        let mut before = values(rank, 3);
                        comm.all_reduce_sum(&mut before).unwrap();
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
                        (before, at_once, first, plain, second)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for (rank, (before, at_once, first, plain, second)) in got.iter().enumerate() {
            assert_eq!(before, &sum_over_ranks(3, 3), "rank {rank}, plain all-reduce on the caller's thread");
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
