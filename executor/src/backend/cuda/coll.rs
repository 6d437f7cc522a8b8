//! Collectives on CUDA: bf16 buffers by handle, one NCCL communicator (on a stream of its own)
//! per group, and [`DeviceBackend::run`](crate::backend::DeviceBackend::run): every item issued
//! on its own stream each round, timed with CUDA events from a common start event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{sys::CUevent_flags, CudaEvent, CudaSlice, CudaStream, DevicePtrMut};
use cudarc::nccl::{result as nccl_result, Comm, ReduceOp};
use half::bf16;

use super::nccl::comm_err;
use super::{dev_err, gemm, BackendError, CudaBackend};
use crate::backend::{check_work, CollCall, CollOp, GroupId, Timing, Work};

/// A communicator on its stream. After a timed-out operation the communicator is aborted
/// (ncclCommAbort ends its stuck kernels) and the group is abandoned, with the reason.
pub(super) struct Group {
    pub comm: Option<Comm>,
    pub size: usize,
    pub stream: Arc<CudaStream>,
    pub abandoned: Option<String>,
}

impl Group {
    pub fn new(comm: Comm) -> Group {
        Group { size: comm.world_size(), stream: comm.stream(), comm: Some(comm), abandoned: None }
    }
}

/// Element `i` = `period[i % period.len()]`, built on the host (doubling copies: a few large
/// memcpys even for 512M elements) and uploaded into `buf`.
pub(super) fn fill(stream: &Arc<CudaStream>, buf: &mut CudaSlice<bf16>, period: &[u8]) -> Result<(), BackendError> {
    if period.is_empty() {
        return Err(BackendError::Device("empty fill pattern".into()));
    }
    let n = buf.len();
    let lut: [u16; 256] = std::array::from_fn(|v| bf16::from_f32(v as f32).to_bits());
    let mut host: Vec<bf16> = Vec::with_capacity(n);
    host.extend(period.iter().take(n).map(|&p| bf16::from_bits(lut[p as usize])));
    while host.len() < n {
        let more = host.len().min(n - host.len());
        host.extend_from_within(..more);
    }
    stream.memcpy_htod(&host, buf).map_err(|e| dev_err("uploading a fill pattern", &e))?;
    stream.synchronize().map_err(|e| dev_err("uploading a fill pattern", &e))
}

/// NaN (0xFFFF) into the first `elems` elements.
pub(super) fn poison(stream: &Arc<CudaStream>, buf: &mut CudaSlice<bf16>, elems: usize) -> Result<(), BackendError> {
    let elems = elems.min(buf.len());
    let mut view = buf.slice_mut(..elems);
    {
        let (ptr, _record) = view.device_ptr_mut(stream);
        // SAFETY: `ptr` addresses `elems` live bf16 elements (2 bytes each) of `buf`, and the
        // memset is ordered on `stream`, which is synchronized below.
        unsafe { cudarc::driver::result::memset_d8_async(ptr, 0xFF, elems * 2, stream.cu_stream()) }
            .map_err(|e| dev_err("NaN-filling a buffer", &e))?;
    }
    stream.synchronize().map_err(|e| dev_err("NaN-filling a buffer", &e))
}

/// The first `elems` elements as little-endian bytes.
pub(super) fn read(stream: &Arc<CudaStream>, buf: &CudaSlice<bf16>, elems: usize) -> Result<Vec<u8>, BackendError> {
    let elems = elems.min(buf.len());
    let host = stream.clone_dtoh(&buf.slice(..elems)).map_err(|e| dev_err("downloading a buffer", &e))?;
    stream.synchronize().map_err(|e| dev_err("downloading a buffer", &e))?;
    Ok(super::bf16_bytes(&host))
}

/// Issues one collective call on its communicator's stream.
fn issue(comm: &Comm, c: &CollCall, send: &CudaSlice<bf16>, recv: &mut CudaSlice<bf16>) -> Result<(), BackendError> {
    let n = comm.world_size();
    let e = c.elems;
    let in_elems = if c.op == CollOp::AllGather { e / n } else { e };
    if send.len() < in_elems || recv.len() < e {
        return Err(BackendError::Device(format!("{:?} of {e} elements exceeds its buffers", c.op)));
    }
    let what = |op: &str| format!("nccl {op} of {e} bf16");
    match c.op {
        CollOp::AllReduce => comm
            .all_reduce(&send.slice(..e), &mut recv.slice_mut(..e), &ReduceOp::Sum)
            .map(|_| ())
            .map_err(|err| comm_err(&what("AllReduce"), &err)),
        CollOp::AllGather => comm
            .all_gather(&send.slice(..in_elems), &mut recv.slice_mut(..e))
            .map(|_| ())
            .map_err(|err| comm_err(&what("AllGather"), &err)),
        CollOp::ReduceScatter => comm
            .reduce_scatter(&send.slice(..e), &mut recv.slice_mut(..e / n), &ReduceOp::Sum)
            .map(|_| ())
            .map_err(|err| comm_err(&what("ReduceScatter"), &err)),
        CollOp::AllToAll => {
            let b = e / n;
            grouped(|| {
                for p in 0..n {
                    comm.send(&send.slice(p * b..(p + 1) * b), p as i32)
                        .map_err(|err| comm_err(&what("Send"), &err))?;
                    comm.recv(&mut recv.slice_mut(p * b..(p + 1) * b), p as i32)
                        .map_err(|err| comm_err(&what("Recv"), &err))?;
                }
                Ok(())
            })
        }
        CollOp::SendRecv { peer } => grouped(|| {
            comm.send(&send.slice(..e), peer as i32).map_err(|err| comm_err(&what("Send"), &err))?;
            comm.recv(&mut recv.slice_mut(..e), peer as i32).map(|_| ()).map_err(|err| comm_err(&what("Recv"), &err))
        }),
    }
}

/// `f` between ncclGroupStart and ncclGroupEnd; the group is ended even when `f` fails.
fn grouped(f: impl FnOnce() -> Result<(), BackendError>) -> Result<(), BackendError> {
    nccl_result::group_start().map_err(|e| comm_err("ncclGroupStart", &e))?;
    let r = f();
    let end = nccl_result::group_end().map(|_| ()).map_err(|e| comm_err("ncclGroupEnd", &e));
    r.and(end)
}

/// Waits for `event`, polling, up to `deadline`.
fn wait(event: &CudaEvent, deadline: Option<Instant>) -> Result<bool, BackendError> {
    match deadline {
        None => event.synchronize().map(|_| true).map_err(|e| dev_err("cuEventSynchronize", &e)),
        Some(d) => loop {
            if event.is_complete() {
                return Ok(true);
            }
            if Instant::now() > d {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(50));
        },
    }
}

pub(super) fn run(be: &mut CudaBackend, work: &[Work], warmup: usize, iters: usize) -> Result<Timing, BackendError> {
    check_work(work, |g| crate::backend::DeviceBackend::group_size(be, g))?;
    // The stream of every item, distinct.
    let mut streams: Vec<Arc<CudaStream>> = Vec::with_capacity(work.len());
    for w in work {
        let s = match w {
            Work::Gemm => be.device.stream().clone(),
            Work::Coll(c) => {
                let g = be.group_ref(c.group)?;
                if let Some(why) = &g.abandoned {
                    return Err(BackendError::Comm(format!("group {} was abandoned: {why}", c.group.0)));
                }
                g.stream.clone()
            }
        };
        if streams.iter().any(|t| t.cu_stream() == s.cu_stream()) {
            return Err(BackendError::Device("two items of one run share a stream".into()));
        }
        streams.push(s);
    }
    let mut recvs: Vec<Option<CudaSlice<bf16>>> = Vec::with_capacity(work.len());
    for w in work {
        recvs.push(match w {
            Work::Gemm => None,
            Work::Coll(c) => match be.bufs.get_mut(c.recv.0).and_then(Option::take) {
                Some(b) => Some(b),
                None => {
                    put_back(be, work, recvs);
                    return Err(BackendError::Device(format!("no buffer {}", c.recv.0)));
                }
            },
        });
    }
    let r = timed(be, work, &streams, &mut recvs, warmup, iters);
    put_back(be, work, recvs);
    r
}

fn put_back(be: &mut CudaBackend, work: &[Work], recvs: Vec<Option<CudaSlice<bf16>>>) {
    for (w, r) in work.iter().zip(recvs) {
        if let (Work::Coll(c), Some(r)) = (w, r) {
            be.bufs[c.recv.0] = Some(r);
        }
    }
}

fn timed(
    be: &mut CudaBackend,
    work: &[Work],
    streams: &[Arc<CudaStream>],
    recvs: &mut [Option<CudaSlice<bf16>>],
    warmup: usize,
    iters: usize,
) -> Result<Timing, BackendError> {
    let CudaBackend { gemm: gemm_bufs, bufs, groups, device, .. } = be;
    let (blas, main) = (device.blas(), device.stream());
    let deadline = |w: &Work| match w {
        Work::Coll(c) => c.timeout.map(|t| Instant::now() + t),
        Work::Gemm => None,
    };
    let round = |recvs: &mut [Option<CudaSlice<bf16>>],
                 gemm_bufs: &mut Option<gemm::GemmBufs>,
                 groups: &[Option<Group>]|
     -> Result<(), BackendError> {
        for (w, recv) in work.iter().zip(recvs.iter_mut()) {
            match w {
                Work::Gemm => {
                    let g = gemm_bufs
                        .as_mut()
                        .ok_or_else(|| BackendError::Device("GEMM buffers are not prepared".into()))?;
                    gemm::launch(blas, g)?;
                }
                Work::Coll(c) => {
                    let group = groups
                        .get(c.group.0)
                        .and_then(Option::as_ref)
                        .ok_or_else(|| BackendError::Comm("no group".into()))?;
                    let send = bufs
                        .get(c.send.0)
                        .and_then(Option::as_ref)
                        .ok_or_else(|| BackendError::Device("no send buffer".into()))?;
                    let recv = recv.as_mut().ok_or_else(|| BackendError::Device("no receive buffer".into()))?;
                    let comm = group.comm.as_ref().ok_or_else(|| BackendError::Comm("communicator aborted".into()))?;
                    issue(comm, c, send, recv)?;
                }
            }
        }
        Ok(())
    };
    let event = |s: &Arc<CudaStream>| {
        let e =
            s.context().new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| dev_err("cuEventCreate", &e))?;
        e.record(s).map_err(|e| dev_err("cuEventRecord", &e))?;
        Ok::<_, BackendError>(e)
    };
    let deadlines: Vec<Option<Instant>> = work.iter().map(deadline).collect();
    let settle = |events: &[CudaEvent], groups: &mut Vec<Option<Group>>| -> Result<(), BackendError> {
        for ((w, e), d) in work.iter().zip(events).zip(&deadlines) {
            if !wait(e, *d)? {
                if let Work::Coll(c) = w {
                    let why = format!(
                        "{:?} of {} elements did not finish in {:?}",
                        c.op,
                        c.elems,
                        c.timeout.unwrap_or_default()
                    );
                    if let Some(Some(g)) = groups.get_mut(c.group.0) {
                        g.abandoned = Some(why.clone());
                        // Aborting ends the stuck kernel, so the stream (and the process) can
                        // go on; cudarc's drop of a communicator is ncclCommAbort.
                        drop(g.comm.take());
                    }
                    return Err(BackendError::Timeout(why));
                }
            }
        }
        Ok(())
    };
    for _ in 0..warmup {
        round(recvs, gemm_bufs, groups)?;
    }
    let warm: Vec<CudaEvent> = streams.iter().map(event).collect::<Result<_, _>>()?;
    settle(&warm, groups)?;
    let start = event(main)?;
    for s in streams.iter().filter(|s| s.cu_stream() != main.cu_stream()) {
        s.wait(&start).map_err(|e| dev_err("cuStreamWaitEvent", &e))?;
    }
    for _ in 0..iters {
        round(recvs, gemm_bufs, groups)?;
    }
    let ends: Vec<CudaEvent> = streams.iter().map(event).collect::<Result<_, _>>()?;
    settle(&ends, groups)?;
    let rounds = iters.max(1) as f64;
    let each = ends
        .iter()
        .map(|e| {
            start.elapsed_ms(e).map(|ms| f64::from(ms) / 1e3 / rounds).map_err(|e| dev_err("cuEventElapsedTime", &e))
        })
        .collect::<Result<Vec<f64>, _>>()?;
    let total = each.iter().copied().fold(0.0, f64::max);
    Ok(Timing { each, total })
}

impl CudaBackend {
    pub(super) fn group_ref(&self, g: GroupId) -> Result<&Group, BackendError> {
        self.groups.get(g.0).and_then(Option::as_ref).ok_or_else(|| BackendError::Comm(format!("no group {}", g.0)))
    }
}
