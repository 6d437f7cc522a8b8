//! bf16 twins of the f32 buffers that products read. A product whose operands are converted to
//! bf16 (`CudaOps::gemm`) keeps each converted copy beside its buffer, and a later product
//! that reads the same buffer unchanged reuses it: a layer's input is converted once for the
//! forward product and reused by the backward's weight-gradient product, a weight once per
//! optimizer step for the forward and the backward, an output gradient once for both of its
//! products. Kernels that produce such operands write the twin in the same pass instead
//! (`CudaOps::with_twin_out`: layer norm, the biases and GELU, their backwards, the fused
//! attention, AdamW), so most operands are never converted at all.
//!
//! A twin is valid only while its buffer is unchanged, so every write must say so: each op of
//! `CudaOps` that writes a buffer marks its twin stale first (`launch.rs`), a new allocation
//! drops any twin left at its address, and a writer outside the ops (the NCCL all-reduce of
//! the model checks) calls [`Twins::wrote`] through the handle it holds.
//!
//! A product with a fused epilogue ([`super::lt`]) writes its result only as bf16, into the
//! twin: then the twin is the buffer's value and the f32 buffer holds nothing current
//! ([`Twin::only`]). Such a buffer may be read only through its twin (the products and the
//! fused attention); a kernel or a download that would read its f32 gets an error instead
//! ([`Twins::readable`]), and any write through the f32 makes the f32 current again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, DevicePtr};

/// The twins of one device's buffers, by the f32 buffer's device address.
#[derive(Clone, Default)]
pub struct Twins(Arc<Mutex<HashMap<u64, Twin>>>);

pub(super) struct Twin {
    pub half: CudaSlice<u16>,
    /// The f32 buffer is unchanged since `half` was made from it.
    pub valid: bool,
    /// `half` is the buffer's value and the f32 was not written with it (implies `valid`).
    pub only: bool,
}

impl Twin {
    /// A twin whose value is yet to be written.
    pub fn empty(half: CudaSlice<u16>) -> Twin {
        Twin { half, valid: false, only: false }
    }
}

/// The device address of a buffer (its identity as long as it lives).
pub(super) fn address(b: &CudaSlice<f32>) -> u64 {
    b.device_ptr(b.stream()).0
}

fn half_address(b: &CudaSlice<u16>) -> u64 {
    b.device_ptr(b.stream()).0
}

impl Twins {
    fn map(&self) -> MutexGuard<'_, HashMap<u64, Twin>> {
        // A panic while the map was held leaves it as it was: still usable.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `b` was written: its twin, if any, is stale.
    pub fn wrote(&self, b: &CudaSlice<f32>) {
        if let Some(t) = self.map().get_mut(&address(b)) {
            t.valid = false;
            t.only = false;
        }
    }

    /// An error where `b`'s value lives only in its bf16 twin (its f32 must not be read).
    pub(super) fn readable(&self, b: &CudaSlice<f32>) -> crate::Result<()> {
        match self.map().get(&address(b)) {
            Some(t) if t.only => Err(crate::ModelError::Config(format!(
                "a buffer of {} elements is held only in bf16 (the result of a fused product) and was read as f32",
                b.len()
            ))),
            _ => Ok(()),
        }
    }

    /// `b` was just allocated: a twin left at its address belonged to a freed buffer.
    pub(super) fn allocated(&self, b: &CudaSlice<f32>) {
        self.map().remove(&address(b));
    }

    /// Takes the twin of the buffer at `at` out (the caller puts it back with [`Twins::put`]).
    pub(super) fn take(&self, at: u64) -> Option<Twin> {
        self.map().remove(&at)
    }

    pub(super) fn put(&self, at: u64, t: Twin) {
        self.map().insert(at, t);
    }

    /// Every twin is stale (their buffers kept for reuse).
    pub(super) fn invalidate_all(&self) {
        for t in self.map().values_mut() {
            t.valid = false;
            t.only = false;
        }
    }

    /// Every twin as (f32 address, bf16 address, bf16 length, valid, only), in address order:
    /// what a step graph recorded with them depends on.
    pub(super) fn state(&self) -> Vec<(u64, u64, usize, bool, bool)> {
        let m = self.map();
        let mut v: Vec<_> =
            m.iter().map(|(at, t)| (*at, half_address(&t.half), t.half.len(), t.valid, t.only)).collect();
        v.sort_unstable();
        v
    }

    /// How many twins are held, and how many of them are valid.
    #[cfg(test)]
    pub(super) fn count(&self) -> (usize, usize) {
        let m = self.map();
        (m.len(), m.values().filter(|t| t.valid).count())
    }
}
