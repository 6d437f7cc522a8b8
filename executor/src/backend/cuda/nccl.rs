//! NCCL: the communicator over all ranks (its unique id travels through the rendezvous
//! store) and the timed sum all-reduce on bf16 buffers.

use std::ffi::{c_char, CStr};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{sys::CUevent_flags, CudaSlice, CudaStream, DevicePtrMut};
use cudarc::nccl::{result::NcclError, sys as nccl_sys, Comm, Id, ReduceOp};
use half::bf16;

use super::{dev_err, BackendError, WorkerPlace};
use crate::store::StoreClient;

/// Prefix of the store keys of NCCL unique ids (128 bytes, hex): `nccl/GROUP/id`.
const ID_KEY: &str = "nccl";
/// How long ranks other than 0 wait for the id.
const ID_TIMEOUT: Duration = Duration::from_secs(120);

/// An NCCL error with NCCL's own description and its last detailed message.
fn comm_err(what: &str, e: &NcclError) -> BackendError {
    // SAFETY: both return pointers to static (or thread-local) NUL-terminated strings owned by
    // NCCL, or null; we copy them out at once. `ncclGetLastError` ignores its comm argument.
    let (desc, last) = unsafe {
        (
            cstr(nccl_sys::ncclGetErrorString(e.0)),
            cstr(nccl_sys::ncclGetLastError(std::ptr::null_mut())),
        )
    };
    let mut msg = format!("{what}: {:?}", e.0);
    if !desc.is_empty() {
        msg.push_str(&format!(" ({desc})"));
    }
    if !last.is_empty() {
        msg.push_str(&format!(": {last}"));
    }
    BackendError::Comm(msg)
}

/// Copies a C string that may be null.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string valid for the duration of the call.
unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: non-null and NUL-terminated per this function's contract.
        unsafe { CStr::from_ptr(p) }
            .to_string_lossy()
            .trim()
            .to_string()
    }
}

/// Hex of the id's 128 bytes.
pub(super) fn encode_id(internal: &[c_char; 128]) -> String {
    internal
        .iter()
        .map(|&c| format!("{:02x}", c as u8))
        .collect()
}

/// The 128 bytes of an id from [`encode_id`]'s hex.
pub(super) fn decode_id(hex: &str) -> Result<[c_char; 128], String> {
    let hex = hex.trim();
    if hex.len() != 256 || !hex.is_ascii() {
        return Err(format!(
            "malformed NCCL id in the store ({} characters, expected 256 hex)",
            hex.len()
        ));
    }
    let mut out = [0 as c_char; 128];
    for (i, o) in out.iter_mut().enumerate() {
        let byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| "malformed NCCL id in the store (not hex)".to_string())?;
        *o = byte as c_char;
    }
    Ok(out)
}

/// Creates the communicator of all `place.world` ranks on `stream`. Blocks until every rank
/// has joined (NCCL's bootstrap).
pub(super) fn connect(
    stream: &Arc<CudaStream>,
    place: &WorkerPlace,
    store: &mut StoreClient,
) -> Result<Comm, BackendError> {
    let all: Vec<usize> = (0..place.world).collect();
    connect_group(stream, place, store, "world", &all)
}

/// Creates the communicator of the group `members` (global ranks; NCCL rank = index in it),
/// which must contain this rank. Every member calls this with the same `key`, unique per group
/// in the run; the group's first member publishes the NCCL id under `nccl/KEY/id`.
pub fn connect_group(
    stream: &Arc<CudaStream>,
    place: &WorkerPlace,
    store: &mut StoreClient,
    key: &str,
    members: &[usize],
) -> Result<Comm, BackendError> {
    let size = members.len();
    let Some(rank) = members.iter().position(|&r| r == place.rank) else {
        return Err(BackendError::Comm(format!(
            "rank {} is not a member of group `{key}` {members:?}",
            place.rank
        )));
    };
    if i32::try_from(size).is_err() {
        return Err(BackendError::Comm(format!("group `{key}` is too large ({size})")));
    }
    let id_key = format!("{ID_KEY}/{key}/id");
    let id = if rank == 0 {
        let id = Id::new().map_err(|e| comm_err("ncclGetUniqueId", &e))?;
        store.set(&id_key, &encode_id(id.internal()))?;
        id
    } else {
        let hex = store.get(&id_key, ID_TIMEOUT)?;
        Id::uninit(decode_id(&hex).map_err(BackendError::Comm)?)
    };
    // ncclCommInitRank works on the calling thread's current device.
    stream
        .context()
        .bind_to_thread()
        .map_err(|e| dev_err("binding the CUDA context", &e))?;
    Comm::from_rank(stream.clone(), rank, size, id).map_err(|e| {
        comm_err(
            &format!("ncclCommInitRank (group `{key}`: rank {rank} of {size})"),
            &e,
        )
    })
}

/// The all-reduce buffers: `send` holds the pattern, `recv` the sums.
pub(super) struct CollBufs {
    send: CudaSlice<bf16>,
    recv: CudaSlice<bf16>,
}

/// Allocates `max_elems` of send and receive buffer; send element `i` is
/// `period[i % period.len()]`, built on the host and uploaded once.
pub(super) fn prepare(
    stream: &Arc<CudaStream>,
    max_elems: usize,
    period: &[u8],
) -> Result<CollBufs, BackendError> {
    if period.is_empty() {
        return Err(BackendError::Device("empty fill pattern".into()));
    }
    let lut: [u16; 256] = std::array::from_fn(|v| bf16::from_f32(v as f32).to_bits());
    let mut host: Vec<bf16> = Vec::with_capacity(max_elems.max(1));
    host.extend(
        period
            .iter()
            .take(max_elems.max(1))
            .map(|&p| bf16::from_bits(lut[p as usize])),
    );
    // Doubling copies: a few large memcpys even for 512M elements.
    while host.len() < max_elems {
        let more = host.len().min(max_elems - host.len());
        host.extend_from_within(..more);
    }
    let send = stream
        .clone_htod(&host)
        .map_err(|e| dev_err("uploading the all-reduce input", &e))?;
    drop(host);
    // SAFETY: the receive buffer is only read after `run` has filled it (NaN, then sums).
    let recv = unsafe { stream.alloc::<bf16>(max_elems.max(1)) }
        .map_err(|e| dev_err(&format!("allocating {max_elems} bf16 elements"), &e))?;
    stream
        .synchronize()
        .map_err(|e| dev_err("all-reduce prepare", &e))?;
    Ok(CollBufs { send, recv })
}

/// Fills `recv[..elems]` with NaN, runs `warmup` untimed and `iters` timed out-of-place sum
/// all-reduces of `send[..elems]`, and returns the mean seconds of a timed call (CUDA events
/// around the whole timed batch).
pub(super) fn run(
    comm: &Comm,
    stream: &Arc<CudaStream>,
    bufs: &mut CollBufs,
    elems: usize,
    warmup: usize,
    iters: usize,
) -> Result<f64, BackendError> {
    if elems > bufs.send.len() {
        return Err(BackendError::Device(format!(
            "{elems} elements exceed the prepared buffers ({})",
            bufs.send.len()
        )));
    }
    let send = bufs.send.slice(..elems);
    let mut recv = bufs.recv.slice_mut(..elems);
    {
        let (ptr, _record) = recv.device_ptr_mut(stream);
        // SAFETY: `ptr` addresses `elems` live bf16 elements (2 bytes each) of `recv`, and the
        // memset is ordered on `stream` like every other use of the buffer. 0xFFFF is a NaN.
        unsafe {
            cudarc::driver::result::memset_d8_async(ptr, 0xFF, elems * 2, stream.cu_stream())
        }
        .map_err(|e| dev_err("NaN-filling the receive buffer", &e))?;
    }
    let all_reduce = |recv: &mut cudarc::driver::CudaViewMut<'_, bf16>| {
        comm.all_reduce(&send, recv, &ReduceOp::Sum)
            .map(|_| ())
            .map_err(|e| comm_err(&format!("ncclAllReduce of {elems} bf16"), &e))
    };
    for _ in 0..warmup {
        all_reduce(&mut recv)?;
    }
    let ctx = stream.context();
    let event = || {
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(|e| dev_err("cuEventCreate", &e))
    };
    let (start, end) = (event()?, event()?);
    start
        .record(stream)
        .map_err(|e| dev_err("cuEventRecord", &e))?;
    for _ in 0..iters {
        all_reduce(&mut recv)?;
    }
    end.record(stream)
        .map_err(|e| dev_err("cuEventRecord", &e))?;
    stream
        .synchronize()
        .map_err(|e| dev_err("waiting for the all-reduces", &e))?;
    let ms = start
        .elapsed_ms(&end)
        .map_err(|e| dev_err("cuEventElapsedTime", &e))?;
    Ok(f64::from(ms) / 1e3 / iters.max(1) as f64)
}

/// `recv[..elems]` as little-endian bytes.
pub(super) fn output(
    stream: &Arc<CudaStream>,
    bufs: &CollBufs,
    elems: usize,
) -> Result<Vec<u8>, BackendError> {
    let elems = elems.min(bufs.recv.len());
    let host = stream
        .clone_dtoh(&bufs.recv.slice(..elems))
        .map_err(|e| dev_err("downloading the all-reduce output", &e))?;
    stream
        .synchronize()
        .map_err(|e| dev_err("downloading the all-reduce output", &e))?;
    Ok(super::bf16_bytes(&host))
}
