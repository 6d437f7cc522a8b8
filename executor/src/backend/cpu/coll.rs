//! [`DeviceBackend::run`](crate::backend::DeviceBackend::run) on CPU: every item of the work
//! list on a thread of its own (the CPU's "streams"), each group's transport and each receive
//! buffer moved onto its thread for the run and put back after.

use std::sync::Barrier;
use std::time::Instant;

use super::mesh::Transfer;
use super::{not_prepared, CpuBackend, CpuGemm, CpuGroup};
use crate::backend::{check_work, BackendError, CollCall, CollOp, Timing, Work};

/// What one item owns during a run, moved out of the backend and back.
enum Taken {
    Coll(CollCall, CpuGroup, Vec<f32>),
    Gemm(CpuGemm),
}

pub(super) fn run(be: &mut CpuBackend, work: &[Work], warmup: usize, iters: usize) -> Result<Timing, BackendError> {
    check_work(work, |g| crate::backend::DeviceBackend::group_size(be, g))?;
    for w in work {
        if let Work::Coll(c) = w {
            if !matches!(be.bufs.get(c.send.0), Some(Some(_))) {
                return Err(BackendError::Device(format!("no send buffer {}", c.send.0)));
            }
        }
    }
    let mut taken: Vec<Taken> = Vec::with_capacity(work.len());
    for w in work {
        let t = match w {
            Work::Gemm => be.gemm.take().map(Taken::Gemm).ok_or_else(|| not_prepared("GEMM")),
            Work::Coll(c) => {
                let group = be.groups.get_mut(c.group.0).and_then(Option::take);
                let recv = be.bufs.get_mut(c.recv.0).and_then(Option::take);
                match (group, recv) {
                    (Some(g), Some(r)) => Ok(Taken::Coll(*c, g, r)),
                    (g, r) => {
                        put_back_parts(be, c, g, r);
                        Err(BackendError::Device(format!("unknown group {} or buffer {}", c.group.0, c.recv.0)))
                    }
                }
            }
        };
        match t {
            Ok(t) => taken.push(t),
            Err(e) => {
                put_back(be, taken);
                return Err(e);
            }
        }
    }
    let n = taken.len();
    let barrier = Barrier::new(n + 1);
    let bufs = &be.bufs;
    let outcomes = std::thread::scope(|s| {
        let handles: Vec<_> = taken
            .into_iter()
            .map(|mut t| {
                let barrier = &barrier;
                s.spawn(move || {
                    let mut step = || match &mut t {
                        Taken::Gemm(g) => {
                            g.product();
                            Ok(())
                        }
                        Taken::Coll(c, g, recv) => match bufs.get(c.send.0) {
                            Some(Some(send)) => op(c, g, send, recv),
                            _ => Err(BackendError::Device(format!("no send buffer {}", c.send.0))),
                        },
                    };
                    let warm = (0..warmup).try_for_each(|_| step());
                    barrier.wait();
                    let start = Instant::now();
                    let timed = warm.and_then(|_| (0..iters).try_for_each(|_| step()));
                    (t, timed.map(|_| (start, Instant::now())))
                })
            })
            .collect();
        barrier.wait();
        handles.into_iter().map(|h| h.join()).collect::<Vec<_>>()
    });
    let mut ends = Vec::with_capacity(n);
    let mut first_err = None;
    for outcome in outcomes {
        match outcome {
            Ok((t, end)) => {
                put_back(be, vec![t]);
                match end {
                    Ok(e) => ends.push(e),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            Err(_) => {
                first_err.get_or_insert(BackendError::Comm("a collective thread panicked".into()));
            }
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    // The common start: the first thread to leave the barrier.
    let Some(t0) = ends.iter().map(|(s, _)| *s).min() else {
        return Ok(Timing { each: Vec::new(), total: 0.0 });
    };
    let rounds = iters.max(1) as f64;
    let each: Vec<f64> = ends.iter().map(|(_, e)| e.duration_since(t0).as_secs_f64() / rounds).collect();
    let total = each.iter().copied().fold(0.0, f64::max);
    Ok(Timing { each, total })
}

/// One collective call on this thread.
fn op(c: &CollCall, g: &mut CpuGroup, send: &[f32], recv: &mut [f32]) -> Result<(), BackendError> {
    let n = g.ring.size();
    let e = c.elems;
    if send.len() < e.div_ceil(n) || recv.len() < e || (!matches!(c.op, CollOp::AllGather) && send.len() < e) {
        return Err(BackendError::Device(format!("{:?} of {e} elements exceeds its buffers", c.op)));
    }
    match c.op {
        CollOp::AllReduce => g.ring.all_reduce_sum(&send[..e], &mut recv[..e]),
        CollOp::AllGather => g.ring.all_gather(&send[..e / n], &mut recv[..e]),
        CollOp::ReduceScatter => g.ring.reduce_scatter_sum(&send[..e], &mut recv[..e / n]),
        CollOp::AllToAll => g.mesh.all_to_all(&send[..e], &mut recv[..e]),
        CollOp::SendRecv { peer } => {
            let deadline = c.timeout.map(|t| Instant::now() + t);
            let out: &[u8] = bytemuck::cast_slice(&send[..e]);
            let inp: &mut [u8] = bytemuck::cast_slice_mut(&mut recv[..e]);
            g.mesh.exchange(&mut [Transfer { peer, out, inp }], deadline)
        }
    }
}

fn put_back_parts(be: &mut CpuBackend, c: &CollCall, g: Option<CpuGroup>, r: Option<Vec<f32>>) {
    if let Some(g) = g {
        be.groups[c.group.0] = Some(g);
    }
    if let Some(r) = r {
        be.bufs[c.recv.0] = Some(r);
    }
}

fn put_back(be: &mut CpuBackend, taken: Vec<Taken>) {
    for t in taken {
        match t {
            Taken::Gemm(g) => be.gemm = Some(g),
            Taken::Coll(c, g, r) => put_back_parts(be, &c, Some(g), Some(r)),
        }
    }
}
