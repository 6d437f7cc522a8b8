//! CPU backend: fp32 GEMM through the `gemm` crate on one thread per worker (workers share the
//! host's cores), and collectives over TCP between worker processes with NCCL's semantics.

mod coll;
mod copy;
mod listen;
pub mod mesh;
pub mod pace;
pub mod ring;

use std::time::Instant;

use gpusanity_common::report::DeviceKind;

use super::{
    BackendError, BufId, CopyPath, DeviceBackend, Dtype, GroupId, HostDir, HostSide, LaunchTiming, Timing, Verified,
    Work, WorkerPlace,
};
use crate::store::StoreClient;
use mesh::Mesh;
use pace::Pace;
use ring::Ring;

pub struct CpuBackend {
    name: String,
    place: WorkerPlace,
    /// By [`GroupId`]; a slot is empty while a run uses the group on a thread of its own.
    groups: Vec<Option<CpuGroup>>,
    /// By [`BufId`]; empty once freed, or while a run receives into it.
    bufs: Vec<Option<Vec<f32>>>,
    gemm: Option<CpuGemm>,
    copy: Option<copy::CopyBufs>,
    /// A simulated device's GEMM pace (test rigs only, [`pace`]).
    pace: Option<Pace>,
}

/// The transport of one group: a ring (all-reduce, all-gather) and a full mesh (all-to-all,
/// send/recv).
struct CpuGroup {
    ring: Ring,
    mesh: Mesh,
}

impl CpuGroup {
    fn connect(
        place: &WorkerPlace,
        store: &mut StoreClient,
        key: &str,
        members: &[usize],
    ) -> Result<CpuGroup, BackendError> {
        let ring = Ring::connect_group(place, store, key, members)?;
        let mesh = Mesh::connect_group(place, store, key, members)?;
        Ok(CpuGroup { ring, mesh })
    }
}

/// The CPU backend's GEMM: C = A B of n x n row-major fp32 matrices, on the calling thread
/// (`Parallelism::None`). Public for the benchmarks that time the same products.
pub struct CpuGemm {
    n: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

impl CpuGemm {
    /// Copies of `a` and `b` and a zeroed C; refused unless both hold n x n elements.
    pub fn new(n: usize, a: &[f32], b: &[f32]) -> Result<CpuGemm, BackendError> {
        let elems = n.checked_mul(n).filter(|e| a.len() == *e && b.len() == *e);
        let Some(elems) = elems else {
            return Err(BackendError::Device(format!("gemm_load: expected {n} x {n} elements")));
        };
        Ok(CpuGemm { n, a: a.to_vec(), b: b.to_vec(), c: vec![0.0; elems] })
    }

    /// m = n = k.
    pub fn n(&self) -> usize {
        self.n
    }

    /// The last product.
    pub fn c(&self) -> &[f32] {
        &self.c
    }

    /// C = A B on this thread.
    pub fn product(&mut self) {
        let n = self.n;
        // SAFETY: a, b and c are n*n row-major buffers owned by `self` (checked in `new`, the
        // only constructor); strides (col stride 1, row stride n) keep every access inside
        // them, and c does not alias a or b.
        unsafe {
            gemm::gemm(
                n,
                n,
                n,
                self.c.as_mut_ptr(),
                1,
                n as isize,
                false,
                self.a.as_ptr(),
                1,
                n as isize,
                self.b.as_ptr(),
                1,
                n as isize,
                0.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
}

/// Seconds of CPU time the calling thread has had (its own clock: not the process's other
/// threads).
pub fn thread_cpu_seconds() -> nix::Result<f64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)?;
    Ok(t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
}

impl CpuBackend {
    pub fn new(place: &WorkerPlace, store: &mut StoreClient) -> Result<Self, BackendError> {
        let all: Vec<usize> = (0..place.world).collect();
        let world = CpuGroup::connect(place, store, "world", &all)?;
        let pace = Pace::from_env();
        let model = cpu_model_name();
        Ok(CpuBackend {
            name: if pace.is_some() { format!("{model} (paced)") } else { model },
            place: place.clone(),
            groups: vec![Some(world)],
            bufs: Vec::new(),
            gemm: None,
            copy: None,
            pace,
        })
    }

    fn buf_mut(&mut self, buf: BufId) -> Result<&mut Vec<f32>, BackendError> {
        match self.bufs.get_mut(buf.0) {
            Some(Some(b)) => Ok(b),
            _ => Err(BackendError::Device(format!("no buffer {}", buf.0))),
        }
    }
}

/// The CPU's model name from /proc/cpuinfo, or the architecture where that is missing.
pub fn cpu_model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH))
}

fn not_prepared(what: &str) -> BackendError {
    BackendError::Device(format!("{what} buffers are not prepared"))
}

impl DeviceBackend for CpuBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    /// The GEMM (`Parallelism::None`) and the memcpy run on the calling thread: its own CPU
    /// clock counts exactly their work, and not the worker's other threads (heartbeats, store).
    /// A paced device has none: its figures are its pace's, per wall second ([`pace`]).
    fn thread_cpu_seconds(&self) -> Option<f64> {
        if self.pace.is_some() {
            return None;
        }
        match thread_cpu_seconds() {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!("no thread CPU clock ({e}): CPU figures are judged per wall second");
                None
            }
        }
    }

    fn gemm_dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn gemm_load(&mut self, n: usize, a: &[f32], b: &[f32]) -> Result<(), BackendError> {
        self.gemm = Some(CpuGemm::new(n, a, b)?);
        Ok(())
    }

    fn gemm_run(&mut self, iters: usize) -> Result<Vec<f64>, BackendError> {
        let g = self.gemm.as_mut().ok_or_else(|| not_prepared("GEMM"))?;
        if let Some(pace) = &self.pace {
            return Ok(pace.run(g.n(), iters, || g.product()));
        }
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            g.product();
            times.push(t.elapsed().as_secs_f64());
        }
        Ok(times)
    }

    fn gemm_output(&mut self) -> Result<Vec<u8>, BackendError> {
        let g = self.gemm.as_ref().ok_or_else(|| not_prepared("GEMM"))?;
        Ok(bytemuck::cast_slice(g.c()).to_vec())
    }

    fn gemm_free(&mut self) {
        self.gemm = None;
    }

    fn coll_dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn group(&mut self, store: &mut StoreClient, key: &str, members: &[usize]) -> Result<GroupId, BackendError> {
        let g = CpuGroup::connect(&self.place, store, key, members)?;
        self.groups.push(Some(g));
        Ok(GroupId(self.groups.len() - 1))
    }

    fn group_size(&self, group: GroupId) -> Result<usize, BackendError> {
        match self.groups.get(group.0) {
            Some(Some(g)) => Ok(g.ring.size()),
            _ => Err(BackendError::Comm(format!("no group {}", group.0))),
        }
    }

    fn buf_alloc(&mut self, elems: usize) -> Result<BufId, BackendError> {
        self.bufs.push(Some(vec![0.0; elems]));
        Ok(BufId(self.bufs.len() - 1))
    }

    fn buf_fill(&mut self, buf: BufId, period: &[u8]) -> Result<(), BackendError> {
        if period.is_empty() {
            return Err(BackendError::Device("empty fill pattern".into()));
        }
        let b = self.buf_mut(buf)?;
        for (i, x) in b.iter_mut().enumerate() {
            *x = period[i % period.len()] as f32;
        }
        Ok(())
    }

    fn buf_poison(&mut self, buf: BufId, elems: usize) -> Result<(), BackendError> {
        let b = self.buf_mut(buf)?;
        let n = elems.min(b.len());
        b[..n].fill(f32::NAN);
        Ok(())
    }

    fn buf_read(&mut self, buf: BufId, elems: usize) -> Result<Vec<u8>, BackendError> {
        let b = self.buf_mut(buf)?;
        let n = elems.min(b.len());
        Ok(bytemuck::cast_slice(&b[..n]).to_vec())
    }

    fn buf_free(&mut self, buf: BufId) {
        if let Some(b) = self.bufs.get_mut(buf.0) {
            *b = None;
        }
    }

    fn run(&mut self, work: &[Work], warmup: usize, iters: usize) -> Result<Timing, BackendError> {
        coll::run(self, work, warmup, iters)
    }

    fn kernel_launch(&mut self, _iters: usize) -> Result<LaunchTiming, BackendError> {
        Err(BackendError::NotApplicable(
            "the CPU backend has no device kernels to launch; kernel launch latency is a GPU figure".into(),
        ))
    }

    fn copy_load(&mut self, bytes: u64, seed: u32, _blocks_per_sm: usize) -> Result<(), BackendError> {
        self.copy = None;
        self.copy = Some(copy::CopyBufs::load(bytes, seed)?);
        Ok(())
    }

    fn copy_run(&mut self, _path: CopyPath, iters: usize) -> Result<Vec<f64>, BackendError> {
        Ok(self.copy.as_mut().ok_or_else(|| not_prepared("copy"))?.run(iters))
    }

    fn copy_clear(&mut self) -> Result<(), BackendError> {
        self.copy.as_mut().ok_or_else(|| not_prepared("copy"))?.clear();
        Ok(())
    }

    fn copy_poke(&mut self, offset: u64, value: u8) -> Result<(), BackendError> {
        self.copy.as_mut().ok_or_else(|| not_prepared("copy"))?.poke(offset, value)
    }

    fn copy_verify(&mut self, seed: u32) -> Result<Verified, BackendError> {
        Ok(self.copy.as_ref().ok_or_else(|| not_prepared("copy"))?.verify(seed))
    }

    fn copy_free(&mut self) {
        self.copy = None;
    }

    fn host_load(&mut self, _bytes: u64) -> Result<(), BackendError> {
        Err(BackendError::NotApplicable(NO_DEVICE_LINK.into()))
    }

    fn host_fill(&mut self, _side: HostSide, _seed: Option<u32>) -> Result<(), BackendError> {
        Err(BackendError::NotApplicable(NO_DEVICE_LINK.into()))
    }

    fn host_copy(&mut self, _dir: HostDir, _iters: usize) -> Result<Vec<f64>, BackendError> {
        Err(BackendError::NotApplicable(NO_DEVICE_LINK.into()))
    }

    fn host_verify(&mut self, _side: HostSide, _seed: u32) -> Result<Verified, BackendError> {
        Err(BackendError::NotApplicable(NO_DEVICE_LINK.into()))
    }

    fn host_free(&mut self) {}
}

/// Why the host-link check does not apply to CPU workers.
const NO_DEVICE_LINK: &str =
    "the CPU backend has no device link: host-to-device bandwidth is a GPU figure (PCIe or NVLink-C2C)";
