//! NCCL communicators over all ranks or a group (the unique id travels through the rendezvous
//! store), and NCCL's errors as messages. The operations are in `coll`.

use std::ffi::{c_char, CStr};
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::CudaStream;
use cudarc::nccl::{result::NcclError, sys as nccl_sys, Comm, Id};

use super::{dev_err, BackendError, WorkerPlace};
use crate::store::StoreClient;

/// Prefix of the store keys of NCCL unique ids (128 bytes, hex): `nccl/GROUP/id`.
const ID_KEY: &str = "nccl";
/// How long ranks other than 0 wait for the id.
const ID_TIMEOUT: Duration = Duration::from_secs(120);

/// An NCCL error with NCCL's own description and its last detailed message.
pub(super) fn comm_err(what: &str, e: &NcclError) -> BackendError {
    // SAFETY: both return pointers to static (or thread-local) NUL-terminated strings owned by
    // NCCL, or null; we copy them out at once. `ncclGetLastError` ignores its comm argument.
    let (desc, last) =
        unsafe { (cstr(nccl_sys::ncclGetErrorString(e.0)), cstr(nccl_sys::ncclGetLastError(std::ptr::null_mut()))) };
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
        unsafe { CStr::from_ptr(p) }.to_string_lossy().trim().to_string()
    }
}

/// Hex of the id's 128 bytes.
pub(super) fn encode_id(internal: &[c_char; 128]) -> String {
    internal.iter().map(|&c| format!("{:02x}", c as u8)).collect()
}

/// The 128 bytes of an id from [`encode_id`]'s hex.
pub(super) fn decode_id(hex: &str) -> Result<[c_char; 128], String> {
    let hex = hex.trim();
    if hex.len() != 256 || !hex.is_ascii() {
        return Err(format!("malformed NCCL id in the store ({} characters, expected 256 hex)", hex.len()));
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
        return Err(BackendError::Comm(format!("rank {} is not a member of group `{key}` {members:?}", place.rank)));
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
    stream.context().bind_to_thread().map_err(|e| dev_err("binding the CUDA context", &e))?;
    Comm::from_rank(stream.clone(), rank, size, id)
        .map_err(|e| comm_err(&format!("ncclCommInitRank (group `{key}`: rank {rank} of {size})"), &e))
}
