//! CPU backend: fp32 GEMM through the `gemm` crate on one thread per worker (workers share the
//! host's cores), and collectives over TCP between worker processes with NCCL's semantics.

pub mod ring;

use std::time::Instant;

use gpusanity_common::report::DeviceKind;

use super::{Backend, BackendError, Dtype, WorkerPlace};
use crate::store::StoreClient;
use ring::Ring;

pub struct CpuBackend {
    name: String,
    ring: Ring,
    gemm: Option<GemmBufs>,
    coll: Option<CollBufs>,
}

struct GemmBufs {
    n: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    c: Vec<f32>,
}

struct CollBufs {
    send: Vec<f32>,
    recv: Vec<f32>,
}

impl CpuBackend {
    pub fn new(place: &WorkerPlace, store: &mut StoreClient) -> Result<Self, BackendError> {
        let ring = Ring::connect(place, store)?;
        Ok(CpuBackend { name: cpu_model_name(), ring, gemm: None, coll: None })
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

impl Backend for CpuBackend {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cpu
    }

    fn device_name(&self) -> String {
        self.name.clone()
    }

    fn gemm_dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn gemm_load(&mut self, n: usize, a: &[f32], b: &[f32]) -> Result<(), BackendError> {
        if a.len() != n * n || b.len() != n * n {
            return Err(BackendError::Device(format!("gemm_load: expected {} elements", n * n)));
        }
        self.gemm = Some(GemmBufs { n, a: a.to_vec(), b: b.to_vec(), c: vec![0.0; n * n] });
        Ok(())
    }

    fn gemm_run(&mut self, iters: usize) -> Result<Vec<f64>, BackendError> {
        let g = self.gemm.as_mut().ok_or_else(|| not_prepared("GEMM"))?;
        let n = g.n;
        let mut times = Vec::with_capacity(iters);
        for _ in 0..iters {
            let t = Instant::now();
            // SAFETY: a, b and c are n*n row-major buffers owned by `g` (checked in gemm_load);
            // strides (col stride 1, row stride n) keep every access inside them, and c does not
            // alias a or b.
            unsafe {
                gemm::gemm(
                    n, n, n,
                    g.c.as_mut_ptr(), 1, n as isize,
                    false,
                    g.a.as_ptr(), 1, n as isize,
                    g.b.as_ptr(), 1, n as isize,
                    0.0f32, 1.0f32,
                    false, false, false,
                    gemm::Parallelism::None,
                );
            }
            times.push(t.elapsed().as_secs_f64());
        }
        Ok(times)
    }

    fn gemm_output(&mut self) -> Result<Vec<u8>, BackendError> {
        let g = self.gemm.as_ref().ok_or_else(|| not_prepared("GEMM"))?;
        Ok(bytemuck::cast_slice(&g.c).to_vec())
    }

    fn gemm_free(&mut self) {
        self.gemm = None;
    }

    fn coll_dtype(&self) -> Dtype {
        Dtype::F32
    }

    fn all_reduce_prepare(&mut self, max_elems: usize, period: &[u8]) -> Result<(), BackendError> {
        if period.is_empty() {
            return Err(BackendError::Device("empty fill pattern".into()));
        }
        let send = (0..max_elems).map(|i| period[i % period.len()] as f32).collect();
        self.coll = Some(CollBufs { send, recv: vec![0.0; max_elems] });
        Ok(())
    }

    fn all_reduce_run(&mut self, elems: usize, warmup: usize, iters: usize) -> Result<f64, BackendError> {
        let c = self.coll.as_mut().ok_or_else(|| not_prepared("all-reduce"))?;
        if elems > c.send.len() {
            return Err(BackendError::Device(format!("{elems} elements exceed the prepared buffers")));
        }
        c.recv[..elems].fill(f32::NAN);
        for _ in 0..warmup {
            self.ring.all_reduce_sum(&c.send[..elems], &mut c.recv[..elems])?;
        }
        let t = Instant::now();
        for _ in 0..iters {
            self.ring.all_reduce_sum(&c.send[..elems], &mut c.recv[..elems])?;
        }
        Ok(t.elapsed().as_secs_f64() / iters.max(1) as f64)
    }

    fn all_reduce_output(&mut self, elems: usize) -> Result<Vec<u8>, BackendError> {
        let c = self.coll.as_ref().ok_or_else(|| not_prepared("all-reduce"))?;
        let elems = elems.min(c.recv.len());
        Ok(bytemuck::cast_slice(&c.recv[..elems]).to_vec())
    }

    fn all_reduce_free(&mut self) {
        self.coll = None;
    }
}
