//! Device memory and the host link on CUDA: the hand-written kernels of `mem.ptx` (fill with
//! the pattern, copy with 16-byte loads and stores, exact check against the pattern), device
//! buffers from `cuMemAlloc`, pinned host buffers from `cuMemHostAlloc`, and copies timed with
//! CUDA events, back to back on the main stream.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{CUdevice_attribute, CUdeviceptr, CUevent_flags};
use cudarc::driver::{result, CudaContext, CudaEvent, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;

use super::dev_err;
use crate::backend::mem::{self, CopyPath, HostDir, HostSide, Verified};
use crate::backend::BackendError;

const MEM_PTX: &str = include_str!("mem.ptx");
/// Threads per block of every kernel of `mem.ptx`.
const THREADS: u32 = 256;

/// The kernels, loaded once per worker, and the multiprocessor count that sizes their grids.
pub(super) struct Kernels {
    fill: CudaFunction,
    copy: CudaFunction,
    check: CudaFunction,
    sms: u32,
}

/// Loads `mem.ptx` into the stream's context (the driver JIT-compiles it for the device).
pub(super) fn load(stream: &Arc<CudaStream>) -> Result<Kernels, BackendError> {
    let ctx = stream.context();
    let module = ctx.load_module(Ptx::from_src(MEM_PTX)).map_err(|e| dev_err("cuModuleLoadData (mem.ptx)", &e))?;
    let f = |name: &str| module.load_function(name).map_err(|e| dev_err(&format!("cuModuleGetFunction {name}"), &e));
    let sms = ctx
        .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(|e| dev_err("cuDeviceGetAttribute (multiprocessors)", &e))?;
    Ok(Kernels {
        fill: f("gpusanity_fill16")?,
        copy: f("gpusanity_copy16")?,
        check: f("gpusanity_check16")?,
        sms: u32::try_from(sms).unwrap_or(1).max(1),
    })
}

/// Device memory from `cuMemAlloc`, freed on drop (after the stream's work on it is done:
/// every user synchronizes before it returns).
pub(super) struct DevBuf {
    ptr: CUdeviceptr,
    bytes: u64,
    ctx: Arc<CudaContext>,
}

impl DevBuf {
    fn new(ctx: &Arc<CudaContext>, bytes: u64) -> Result<DevBuf, BackendError> {
        let n = usize::try_from(bytes).map_err(|_| BackendError::Device(format!("{bytes} bytes do not fit")))?;
        ctx.bind_to_thread().map_err(|e| dev_err("binding the CUDA context", &e))?;
        // SAFETY: a plain allocation in the current context; the memory is only reached
        // through this handle, which frees it once.
        let ptr =
            unsafe { result::malloc_sync(n) }.map_err(|e| dev_err(&format!("cuMemAlloc of {bytes} bytes"), &e))?;
        Ok(DevBuf { ptr, bytes, ctx: Arc::clone(ctx) })
    }

    fn n16(&self) -> u64 {
        self.bytes / mem::WORD_BYTES
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated by cuMemAlloc in this context and freed only here.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// Pinned (page-locked) host memory from `cuMemHostAlloc`, freed on drop.
pub(super) struct PinnedBuf {
    ptr: *mut c_void,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: plain host memory owned by this handle alone; nothing ties it to a thread.
unsafe impl Send for PinnedBuf {}

impl PinnedBuf {
    fn new(ctx: &Arc<CudaContext>, bytes: u64) -> Result<PinnedBuf, BackendError> {
        let n = usize::try_from(bytes).map_err(|_| BackendError::Device(format!("{bytes} bytes do not fit")))?;
        ctx.bind_to_thread().map_err(|e| dev_err("binding the CUDA context", &e))?;
        // SAFETY: flags 0 (page-locked, this context); the memory is only reached through
        // this handle, as u32 words (the allocation is page-aligned).
        let ptr = unsafe { result::malloc_host(n, 0) }
            .map_err(|e| dev_err(&format!("cuMemHostAlloc of {bytes} bytes (pinned)"), &e))?;
        if ptr.is_null() {
            return Err(BackendError::Device("cuMemHostAlloc returned no memory".into()));
        }
        Ok(PinnedBuf { ptr, bytes: n, ctx: Arc::clone(ctx) })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `bytes` bytes live at `ptr` for the life of self; no copy is in flight
        // (every copy is synchronized before its method returns).
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.bytes) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u8, self.bytes) }
    }

    fn words(&self) -> &[u32] {
        // SAFETY: page-aligned, a multiple of 16 bytes (checked by the caller of `new`).
        unsafe { std::slice::from_raw_parts(self.ptr as *const u32, self.bytes / 4) }
    }

    fn words_mut(&mut self) -> &mut [u32] {
        // SAFETY: as in `words`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.ptr as *mut u32, self.bytes / 4) }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: returned by cuMemHostAlloc and freed only here.
        let _ = unsafe { result::free_host(self.ptr) };
    }
}

fn whole_words(bytes: u64) -> Result<(), BackendError> {
    if bytes == 0 || !bytes.is_multiple_of(mem::WORD_BYTES) {
        return Err(BackendError::Device(format!("{bytes} bytes: not a positive multiple of 16")));
    }
    Ok(())
}

fn sync(stream: &Arc<CudaStream>, what: &str) -> Result<(), BackendError> {
    stream.synchronize().map_err(|e| dev_err(what, &e))
}

impl Kernels {
    /// A grid of `blocks_per_sm` blocks per multiprocessor, no larger than `n16` needs.
    fn grid(&self, n16: u64, blocks_per_sm: usize) -> u32 {
        let want = u64::from(self.sms).saturating_mul(blocks_per_sm.max(1) as u64);
        let needed = n16.div_ceil(u64::from(THREADS)).max(1);
        u32::try_from(want.min(needed)).unwrap_or(u32::MAX).max(1)
    }

    fn launch(
        &self,
        f: &CudaFunction,
        grid: u32,
        stream: &Arc<CudaStream>,
        params: &mut [*mut c_void],
        what: &str,
    ) -> Result<(), BackendError> {
        stream.context().bind_to_thread().map_err(|e| dev_err("binding the CUDA context", &e))?;
        // SAFETY: `f` is a kernel of mem.ptx loaded in this stream's context, and `params`
        // points at one value of the exact type of each of its parameters (callers below);
        // every buffer it is given holds `n16` 16-byte words, and the kernels touch no others.
        unsafe { result::launch_kernel(f.cu_function(), (grid, 1, 1), (THREADS, 1, 1), 0, stream.cu_stream(), params) }
            .map_err(|e| dev_err(&format!("cuLaunchKernel ({what})"), &e))
    }

    /// Issues `buf` = the pattern with `seed`.
    fn fill(&self, stream: &Arc<CudaStream>, buf: &DevBuf, seed: u32) -> Result<(), BackendError> {
        let (mut p, mut n, mut s) = (buf.ptr, buf.n16(), seed);
        let mut params = [
            &mut p as *mut CUdeviceptr as *mut c_void,
            &mut n as *mut u64 as *mut c_void,
            &mut s as *mut u32 as *mut c_void,
        ];
        self.launch(&self.fill, self.grid(n, 8), stream, &mut params, "fill")
    }

    /// Issues `dst` = `src` (same size).
    fn copy(&self, stream: &Arc<CudaStream>, dst: &DevBuf, src: &DevBuf, grid: u32) -> Result<(), BackendError> {
        let (mut d, mut s, mut n) = (dst.ptr, src.ptr, dst.n16().min(src.n16()));
        let mut params = [
            &mut d as *mut CUdeviceptr as *mut c_void,
            &mut s as *mut CUdeviceptr as *mut c_void,
            &mut n as *mut u64 as *mut c_void,
        ];
        self.launch(&self.copy, grid, stream, &mut params, "copy")
    }

    /// Counts the words of `buf` that differ from the pattern with `seed`; waits for it.
    fn check(&self, stream: &Arc<CudaStream>, buf: &DevBuf, seed: u32) -> Result<Verified, BackendError> {
        let out = DevBuf::new(stream.context(), 16)?; // binds the context
        let init: [u64; 2] = [0, u64::MAX];
        // SAFETY: `out` holds 16 bytes; `init` lives until the synchronize below.
        unsafe { result::memcpy_htod_async(out.ptr, &init, stream.cu_stream()) }
            .map_err(|e| dev_err("cuMemcpyHtoDAsync (check counters)", &e))?;
        let (mut p, mut n, mut s, mut o) = (buf.ptr, buf.n16(), seed, out.ptr);
        let mut params = [
            &mut p as *mut CUdeviceptr as *mut c_void,
            &mut n as *mut u64 as *mut c_void,
            &mut s as *mut u32 as *mut c_void,
            &mut o as *mut CUdeviceptr as *mut c_void,
        ];
        self.launch(&self.check, self.grid(n, 8), stream, &mut params, "check")?;
        let mut got: [u64; 2] = [0, 0];
        // SAFETY: as above; `got` lives until the synchronize below.
        unsafe { result::memcpy_dtoh_async(&mut got, out.ptr, stream.cu_stream()) }
            .map_err(|e| dev_err("cuMemcpyDtoHAsync (check counters)", &e))?;
        sync(stream, "verifying a buffer on the device")?;
        Ok(Verified { wrong: got[0], first: (got[0] > 0).then_some(got[1]) })
    }
}

/// `iters` operations issued by `issue`, each between two events, back to back; the seconds
/// of each.
fn timed(
    stream: &Arc<CudaStream>,
    iters: usize,
    mut issue: impl FnMut() -> Result<(), BackendError>,
) -> Result<Vec<f64>, BackendError> {
    let ctx = stream.context();
    ctx.bind_to_thread().map_err(|e| dev_err("binding the CUDA context", &e))?;
    let event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).map_err(|e| dev_err("cuEventCreate", &e));
    let events = (0..=iters).map(|_| event()).collect::<Result<Vec<CudaEvent>, BackendError>>()?;
    let record = |e: &CudaEvent| e.record(stream).map_err(|e| dev_err("cuEventRecord", &e));
    if let Some(first) = events.first() {
        record(first)?;
    }
    for end in events.iter().skip(1) {
        issue()?;
        record(end)?;
    }
    sync(stream, "waiting for the timed copies")?;
    events
        .windows(2)
        .map(|w| w[0].elapsed_ms(&w[1]).map(|ms| f64::from(ms) / 1e3).map_err(|e| dev_err("cuEventElapsedTime", &e)))
        .collect()
}

/// The two buffers of the device copy and its grid.
pub(super) struct CopyBufs {
    src: DevBuf,
    dst: DevBuf,
    grid: u32,
}

pub(super) fn copy_load(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    bytes: u64,
    seed: u32,
    blocks_per_sm: usize,
) -> Result<CopyBufs, BackendError> {
    whole_words(bytes)?;
    let src = DevBuf::new(stream.context(), bytes)?;
    let dst = DevBuf::new(stream.context(), bytes)?;
    k.fill(stream, &src, seed)?;
    // SAFETY: `dst` holds `bytes` bytes.
    unsafe { result::memset_d8_async(dst.ptr, 0, bytes as usize, stream.cu_stream()) }
        .map_err(|e| dev_err("cuMemsetD8Async (destination)", &e))?;
    sync(stream, "filling the copy's source")?;
    let grid = k.grid(bytes / mem::WORD_BYTES, blocks_per_sm);
    Ok(CopyBufs { src, dst, grid })
}

pub(super) fn copy_run(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    b: &CopyBufs,
    path: CopyPath,
    iters: usize,
) -> Result<Vec<f64>, BackendError> {
    match path {
        CopyPath::Kernel => timed(stream, iters, || k.copy(stream, &b.dst, &b.src, b.grid)),
        CopyPath::Driver => {
            let n = usize::try_from(b.dst.bytes.min(b.src.bytes))
                .map_err(|_| BackendError::Device(format!("{} bytes do not fit", b.dst.bytes)))?;
            let cu = stream.cu_stream();
            timed(stream, iters, || {
                // SAFETY: both buffers hold at least `n` bytes and live until `timed` has
                // synchronized the stream; they do not overlap (two allocations).
                unsafe { result::memcpy_dtod_async(b.dst.ptr, b.src.ptr, n, cu) }
                    .map_err(|e| dev_err("cuMemcpyDtoDAsync", &e))
            })
        }
    }
}

pub(super) fn copy_clear(stream: &Arc<CudaStream>, b: &CopyBufs) -> Result<(), BackendError> {
    stream.context().bind_to_thread().map_err(|e| dev_err("binding the CUDA context", &e))?;
    // SAFETY: `dst` holds `bytes` bytes (checked to fit a usize when it was allocated).
    unsafe { result::memset_d8_async(b.dst.ptr, 0, b.dst.bytes as usize, stream.cu_stream()) }
        .map_err(|e| dev_err("cuMemsetD8Async (destination)", &e))?;
    sync(stream, "zeroing the copy's destination")
}

pub(super) fn copy_poke(stream: &Arc<CudaStream>, b: &CopyBufs, offset: u64, value: u8) -> Result<(), BackendError> {
    if offset >= b.dst.bytes {
        return Err(BackendError::Device(format!("byte {offset} is outside the destination")));
    }
    stream.context().bind_to_thread().map_err(|e| dev_err("binding the CUDA context", &e))?;
    let one = [value];
    // SAFETY: one byte inside `dst`; `one` lives until the synchronize below.
    unsafe { result::memcpy_htod_async(b.dst.ptr + offset, &one, stream.cu_stream()) }
        .map_err(|e| dev_err("cuMemcpyHtoDAsync (poke)", &e))?;
    sync(stream, "writing one byte")
}

pub(super) fn copy_verify(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    b: &CopyBufs,
    seed: u32,
) -> Result<Verified, BackendError> {
    Ok(k.check(stream, &b.src, seed)?.and(k.check(stream, &b.dst, seed)?))
}

/// The pinned host buffer and the device buffer of the host link.
pub(super) struct HostBufs {
    host: PinnedBuf,
    dev: DevBuf,
}

pub(super) fn host_load(stream: &Arc<CudaStream>, bytes: u64) -> Result<HostBufs, BackendError> {
    whole_words(bytes)?;
    let host = PinnedBuf::new(stream.context(), bytes)?;
    let dev = DevBuf::new(stream.context(), bytes)?;
    Ok(HostBufs { host, dev })
}

pub(super) fn host_fill(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    b: &mut HostBufs,
    side: HostSide,
    seed: Option<u32>,
) -> Result<(), BackendError> {
    match (side, seed) {
        (HostSide::Host, Some(seed)) => mem::fill(b.host.words_mut(), seed),
        (HostSide::Host, None) => b.host.bytes_mut().fill(0),
        (HostSide::Device, Some(seed)) => {
            k.fill(stream, &b.dev, seed)?;
            sync(stream, "filling the device buffer")?;
        }
        (HostSide::Device, None) => {
            // SAFETY: `dev` holds `bytes` bytes.
            unsafe { result::memset_d8_async(b.dev.ptr, 0, b.dev.bytes as usize, stream.cu_stream()) }
                .map_err(|e| dev_err("cuMemsetD8Async (device buffer)", &e))?;
            sync(stream, "zeroing the device buffer")?;
        }
    }
    Ok(())
}

pub(super) fn host_copy(
    stream: &Arc<CudaStream>,
    b: &mut HostBufs,
    dir: HostDir,
    iters: usize,
) -> Result<Vec<f64>, BackendError> {
    let dev = b.dev.ptr;
    let cu = stream.cu_stream();
    match dir {
        HostDir::ToDevice => {
            let host = b.host.bytes();
            // SAFETY: `host` and `dev` hold the same number of bytes; `host` is pinned and
            // stays borrowed until `timed` has synchronized the stream.
            timed(stream, iters, || {
                unsafe { result::memcpy_htod_async(dev, host, cu) }.map_err(|e| dev_err("cuMemcpyHtoDAsync", &e))
            })
        }
        HostDir::ToHost => {
            let host = b.host.bytes_mut();
            // SAFETY: as above, the device writing into `host`, which nothing else reads
            // until `timed` has synchronized the stream.
            timed(stream, iters, || {
                unsafe { result::memcpy_dtoh_async(&mut *host, dev, cu) }.map_err(|e| dev_err("cuMemcpyDtoHAsync", &e))
            })
        }
    }
}

pub(super) fn host_verify(
    k: &Kernels,
    stream: &Arc<CudaStream>,
    b: &HostBufs,
    side: HostSide,
    seed: u32,
) -> Result<Verified, BackendError> {
    match side {
        HostSide::Host => Ok(mem::verify(b.host.words(), seed)),
        HostSide::Device => k.check(stream, &b.dev, seed),
    }
}
