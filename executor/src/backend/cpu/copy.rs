//! Host memory bandwidth on CPU workers: memcpy between two buffers of host memory, timed with
//! the host clock (memcpy is synchronous), verified against the fill pattern.

use std::time::Instant;

use crate::backend::mem::{self, Verified};
use crate::backend::BackendError;

/// The source and destination, in 32-bit words.
pub(super) struct CopyBufs {
    src: Vec<u32>,
    dst: Vec<u32>,
}

impl CopyBufs {
    pub fn load(bytes: u64, seed: u32) -> Result<CopyBufs, BackendError> {
        let words = usize::try_from(bytes / 4)
            .ok()
            .filter(|_| bytes.is_multiple_of(16) && bytes > 0)
            .ok_or_else(|| BackendError::Device(format!("unsupported copy size {bytes} bytes")))?;
        let mut src = Vec::new();
        let mut dst = Vec::new();
        src.try_reserve_exact(words)
            .and_then(|_| dst.try_reserve_exact(words))
            .map_err(|e| BackendError::Device(format!("allocating two buffers of {bytes} bytes: {e}")))?;
        src.resize(words, 0);
        dst.resize(words, 0);
        mem::fill(&mut src, seed);
        Ok(CopyBufs { src, dst })
    }

    pub fn run(&mut self, iters: usize) -> Vec<f64> {
        (0..iters)
            .map(|_| {
                let t = Instant::now();
                self.dst.copy_from_slice(&self.src);
                // The copy must not be elided: its result is read by the verification, and
                // black_box keeps the compiler from merging the repeated copies.
                std::hint::black_box(&mut self.dst);
                t.elapsed().as_secs_f64()
            })
            .collect()
    }

    pub fn clear(&mut self) {
        self.dst.fill(0);
    }

    pub fn poke(&mut self, offset: u64, value: u8) -> Result<(), BackendError> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.dst);
        let b = usize::try_from(offset).ok().and_then(|o| bytes.get_mut(o));
        *b.ok_or_else(|| BackendError::Device(format!("byte {offset} is outside the destination")))? = value;
        Ok(())
    }

    pub fn verify(&self, seed: u32) -> Verified {
        mem::verify(&self.src, seed).and(mem::verify(&self.dst, seed))
    }
}
