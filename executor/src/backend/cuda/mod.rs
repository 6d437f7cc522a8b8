//! CUDA backend: cudarc with dynamic loading. One worker process drives one GPU through one
//! non-blocking stream: cuBLAS bf16 GEMM timed with CUDA events, and NCCL sum all-reduce over
//! all ranks.
//!
//! Nothing CUDA is linked at build time: libcuda, libcublas and libnccl are opened at run time
//! (see `docs/cuda.md`). [`probe`] and [`check_libraries`] (of the `gpusanity-cuda` crate) look
//! for them first, so a machine without them gets an error message rather than cudarc's panic.
//! The context, the main stream and the cuBLAS handle are one [`CudaDevice`], which the model
//! checks share through [`DeviceBackend::cuda_device`].
//!
//! - `gemm`: cuBLAS GEMM and its timing.
//! - `nccl`: communicator set-up through the rendezvous store.
//! - `coll`: buffers, collective operations and their concurrent timing.
//! - `launch`: the empty kernel and launch latency.
//! - `mem`: the device copy and the host link (hand-written PTX kernels, pinned memory).

mod coll;
mod gemm;
mod launch;
mod mem;
pub mod nccl;
#[cfg(test)]
mod tests;

use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas::result::CublasError;
use cudarc::driver::{CudaFunction, CudaSlice, DriverError};
use gpusanity_common::report::DeviceKind;
use gpusanity_cuda::{driver_error, panic_message, CudaDevice, CudaError};
use half::bf16;

use super::{
    BackendError, BufId, CopyPath, DeviceBackend, Dtype, GroupId, HostDir, HostSide, LaunchTiming, Timing, Verified,
    Work, WorkerPlace,
};
use crate::store::StoreClient;

pub use gpusanity_cuda::{check_libraries, probe, probe_memory};

/// A driver error as a [`BackendError::Device`] naming the failed step.
fn dev_err(what: &str, e: &DriverError) -> BackendError {
    BackendError::Device(format!("{what}: {}", driver_error(e)))
}

/// A cuBLAS error as a [`BackendError::Device`] naming the failed step.
fn blas_err(what: &str, e: &CublasError) -> BackendError {
    BackendError::Device(format!("{what}: {:?}", e.0))
}

/// bf16 values as their little-endian bytes.
fn bf16_bytes(v: &[bf16]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * 2);
    for x in v {
        out.extend_from_slice(&x.to_bits().to_le_bytes());
    }
    out
}

/// Runs `f`, turning a panic inside cudarc (a symbol missing after all, an `expect` on an
/// unexpected state) into an error. The default hook still prints it.
fn guarded<R>(what: &str, f: impl FnOnce() -> Result<R, BackendError>) -> Result<R, BackendError> {
    panic::catch_unwind(AssertUnwindSafe(f))
        .unwrap_or_else(|p| Err(BackendError::Device(format!("{what}: panicked: {}", panic_message(p.as_ref())))))
}

impl From<CudaError> for BackendError {
    fn from(e: CudaError) -> BackendError {
        BackendError::Device(e.to_string())
    }
}

/// One GPU of one worker. Fields drop in order: buffers, communicators, kernel, then this
/// backend's hold on the device (cuBLAS, stream and context go with the last holder).
pub struct CudaBackend {
    gemm: Option<gemm::GemmBufs>,
    /// By [`BufId`]; empty once freed, or while a run receives into it.
    bufs: Vec<Option<CudaSlice<bf16>>>,
    /// By [`GroupId`]; the world's communicator works on the main stream, every other group's
    /// on a stream of its own.
    groups: Vec<Option<coll::Group>>,
    empty_kernel: Option<CudaFunction>,
    /// The device copy's buffers and the host link's (freed before the kernels).
    copy: Option<mem::CopyBufs>,
    host: Option<mem::HostBufs>,
    mem_kernels: Option<mem::Kernels>,
    /// The context, the main stream and cuBLAS on it: the worker's only ones.
    device: Arc<CudaDevice>,
    place: WorkerPlace,
}

impl CudaBackend {
    /// Opens device `place.local_rank`, its stream and cuBLAS handle, and the NCCL
    /// communicator of all ranks (rank 0 publishes the NCCL id under `nccl/world/id` in `store`).
    pub fn new(place: &WorkerPlace, store: &mut StoreClient) -> Result<Self, BackendError> {
        check_libraries().map_err(BackendError::Unavailable)?;
        guarded("opening the CUDA backend", || {
            let device = CudaDevice::open(place.local_rank)?;
            let comm = nccl::connect(device.stream(), place, store)?;
            Ok(CudaBackend {
                gemm: None,
                bufs: Vec::new(),
                groups: vec![Some(coll::Group::new(comm))],
                empty_kernel: None,
                copy: None,
                host: None,
                mem_kernels: None,
                device,
                place: place.clone(),
            })
        })
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Let queued work finish before the fields (buffers, comm, handle) are torn down;
        // not after a timed-out operation, which may still hold the stream.
        if !self.groups.iter().flatten().any(|g| g.abandoned.is_some()) {
            let _ = self.device.stream().synchronize();
        }
    }
}

impl CudaBackend {
    /// The kernels of mem.ptx, loaded on first use.
    fn mem_kernels(&mut self) -> Result<&mem::Kernels, BackendError> {
        if self.mem_kernels.is_none() {
            self.mem_kernels = Some(mem::load(self.device.stream())?);
        }
        self.mem_kernels.as_ref().ok_or_else(|| BackendError::Device("mem.ptx not loaded".into()))
    }

    fn buf_mut(&mut self, buf: BufId) -> Result<&mut CudaSlice<bf16>, BackendError> {
        match self.bufs.get_mut(buf.0) {
            Some(Some(b)) => Ok(b),
            _ => Err(BackendError::Device(format!("no buffer {}", buf.0))),
        }
    }
}

fn not_prepared(what: &str) -> BackendError {
    BackendError::Device(format!("{what} buffers are not prepared"))
}

impl DeviceBackend for CudaBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda
    }

    fn device_name(&self) -> String {
        self.device.name().to_string()
    }

    fn cuda_device(&self) -> Option<Arc<CudaDevice>> {
        Some(Arc::clone(&self.device))
    }

    fn gemm_dtype(&self) -> Dtype {
        Dtype::Bf16
    }

    fn gemm_load(&mut self, n: usize, a: &[f32], b: &[f32]) -> Result<(), BackendError> {
        self.gemm = None;
        self.gemm = Some(guarded("gemm_load", || gemm::load(self.device.stream(), n, a, b))?);
        Ok(())
    }

    fn gemm_run(&mut self, iters: usize) -> Result<Vec<f64>, BackendError> {
        let g = self.gemm.as_mut().ok_or_else(|| not_prepared("GEMM"))?;
        guarded("gemm_run", || gemm::run(self.device.blas(), self.device.stream(), g, iters))
    }

    fn gemm_output(&mut self) -> Result<Vec<u8>, BackendError> {
        let g = self.gemm.as_ref().ok_or_else(|| not_prepared("GEMM"))?;
        guarded("gemm_output", || gemm::output(self.device.stream(), g))
    }

    fn gemm_free(&mut self) {
        self.gemm = None;
    }

    fn coll_dtype(&self) -> Dtype {
        Dtype::Bf16
    }

    fn group(&mut self, store: &mut StoreClient, key: &str, members: &[usize]) -> Result<GroupId, BackendError> {
        let g = guarded("creating a communicator", || {
            let stream = self.device.context().new_stream().map_err(|e| dev_err("cuStreamCreate", &e))?;
            let comm = nccl::connect_group(&stream, &self.place, store, key, members)?;
            Ok(coll::Group::new(comm))
        })?;
        self.groups.push(Some(g));
        Ok(GroupId(self.groups.len() - 1))
    }

    fn group_size(&self, group: GroupId) -> Result<usize, BackendError> {
        Ok(self.group_ref(group)?.size)
    }

    fn buf_alloc(&mut self, elems: usize) -> Result<BufId, BackendError> {
        // SAFETY: the contents are undefined until filled, which the trait's contract says;
        // they are plain bf16 values with no validity requirement.
        let b = guarded("buf_alloc", || {
            unsafe { self.device.stream().alloc::<bf16>(elems.max(1)) }
                .map_err(|e| dev_err(&format!("allocating {elems} bf16 elements"), &e))
        })?;
        self.bufs.push(Some(b));
        Ok(BufId(self.bufs.len() - 1))
    }

    fn buf_fill(&mut self, buf: BufId, period: &[u8]) -> Result<(), BackendError> {
        let stream = self.device.stream().clone();
        let b = self.buf_mut(buf)?;
        guarded("buf_fill", || coll::fill(&stream, b, period))
    }

    fn buf_poison(&mut self, buf: BufId, elems: usize) -> Result<(), BackendError> {
        let stream = self.device.stream().clone();
        let b = self.buf_mut(buf)?;
        guarded("buf_poison", || coll::poison(&stream, b, elems))
    }

    fn buf_read(&mut self, buf: BufId, elems: usize) -> Result<Vec<u8>, BackendError> {
        let stream = self.device.stream().clone();
        let b = self.buf_mut(buf)?;
        guarded("buf_read", || coll::read(&stream, b, elems))
    }

    fn buf_free(&mut self, buf: BufId) {
        if let Some(b) = self.bufs.get_mut(buf.0) {
            *b = None;
        }
    }

    fn run(&mut self, work: &[Work], warmup: usize, iters: usize) -> Result<Timing, BackendError> {
        guarded("run", || coll::run(self, work, warmup, iters))
    }

    fn kernel_launch(&mut self, iters: usize) -> Result<LaunchTiming, BackendError> {
        guarded("kernel_launch", || {
            if self.empty_kernel.is_none() {
                self.empty_kernel = Some(launch::load(self.device.stream())?);
            }
            let f = self.empty_kernel.as_ref().ok_or_else(|| BackendError::Device("empty kernel not loaded".into()))?;
            launch::measure(self.device.stream(), f, iters)
        })
    }

    fn copy_load(&mut self, bytes: u64, seed: u32, blocks_per_sm: usize) -> Result<(), BackendError> {
        self.copy_free();
        let stream = self.device.stream().clone();
        let b = guarded("copy_load", || {
            let k = self.mem_kernels()?;
            mem::copy_load(k, &stream, bytes, seed, blocks_per_sm)
        })?;
        self.copy = Some(b);
        Ok(())
    }

    fn copy_paths(&self) -> &'static [CopyPath] {
        &[CopyPath::Driver, CopyPath::Kernel]
    }

    fn copy_run(&mut self, path: CopyPath, iters: usize) -> Result<Vec<f64>, BackendError> {
        let stream = self.device.stream().clone();
        let (Some(k), Some(b)) = (self.mem_kernels.as_ref(), self.copy.as_ref()) else {
            return Err(not_prepared("copy"));
        };
        guarded("copy_run", || mem::copy_run(k, &stream, b, path, iters))
    }

    fn copy_clear(&mut self) -> Result<(), BackendError> {
        let b = self.copy.as_ref().ok_or_else(|| not_prepared("copy"))?;
        guarded("copy_clear", || mem::copy_clear(self.device.stream(), b))
    }

    fn copy_poke(&mut self, offset: u64, value: u8) -> Result<(), BackendError> {
        let b = self.copy.as_ref().ok_or_else(|| not_prepared("copy"))?;
        guarded("copy_poke", || mem::copy_poke(self.device.stream(), b, offset, value))
    }

    fn copy_verify(&mut self, seed: u32) -> Result<Verified, BackendError> {
        let (Some(k), Some(b)) = (self.mem_kernels.as_ref(), self.copy.as_ref()) else {
            return Err(not_prepared("copy"));
        };
        guarded("copy_verify", || mem::copy_verify(k, self.device.stream(), b, seed))
    }

    fn copy_free(&mut self) {
        if self.copy.is_some() {
            let _ = self.device.stream().synchronize();
            self.copy = None;
        }
    }

    fn host_load(&mut self, bytes: u64) -> Result<(), BackendError> {
        self.host_free();
        let stream = self.device.stream().clone();
        let b = guarded("host_load", || {
            self.mem_kernels()?;
            mem::host_load(&stream, bytes)
        })?;
        self.host = Some(b);
        Ok(())
    }

    fn host_fill(&mut self, side: HostSide, seed: Option<u32>) -> Result<(), BackendError> {
        let stream = self.device.stream().clone();
        let (Some(k), Some(b)) = (self.mem_kernels.as_ref(), self.host.as_mut()) else {
            return Err(not_prepared("host-link"));
        };
        guarded("host_fill", || mem::host_fill(k, &stream, b, side, seed))
    }

    fn host_copy(&mut self, dir: HostDir, iters: usize) -> Result<Vec<f64>, BackendError> {
        let stream = self.device.stream().clone();
        let b = self.host.as_mut().ok_or_else(|| not_prepared("host-link"))?;
        guarded("host_copy", || mem::host_copy(&stream, b, dir, iters))
    }

    fn host_verify(&mut self, side: HostSide, seed: u32) -> Result<Verified, BackendError> {
        let (Some(k), Some(b)) = (self.mem_kernels.as_ref(), self.host.as_ref()) else {
            return Err(not_prepared("host-link"));
        };
        guarded("host_verify", || mem::host_verify(k, self.device.stream(), b, side, seed))
    }

    fn host_free(&mut self) {
        if self.host.is_some() {
            let _ = self.device.stream().synchronize();
            self.host = None;
        }
    }
}
