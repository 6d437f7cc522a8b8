//! What the memory-bandwidth and host-bandwidth checks share across backends: the fill pattern
//! (the same formula as the CUDA kernels of `cuda/mem.ptx`), its exact verification over host
//! memory, and the figures.

/// Bytes of the word the copy kernels load and store at once.
pub const WORD_BYTES: u64 = 16;

/// The pattern's multiplier: 2^32 / golden ratio, odd, so word indices map to distinct values
/// within every 2^32 words.
pub const PATTERN_MUL: u32 = 0x9E37_79B1;

/// 32-bit word `w` (counted from a buffer's start) of the pattern with `seed`.
pub fn pattern_word(w: u64, seed: u32) -> u32 {
    (w as u32).wrapping_mul(PATTERN_MUL).wrapping_add(seed)
}

/// The byte at `offset` of the pattern with `seed` (little-endian words).
pub fn pattern_byte(offset: u64, seed: u32) -> u8 {
    pattern_word(offset / 4, seed).to_le_bytes()[(offset % 4) as usize]
}

/// Writes the pattern into `words` (32-bit words from the buffer's start).
pub fn fill(words: &mut [u32], seed: u32) {
    for (w, x) in words.iter_mut().enumerate() {
        *x = pattern_word(w as u64, seed);
    }
}

/// What an exact verification found, in 16-byte words (4 pattern words).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Verified {
    /// 16-byte words that differ from what they should hold.
    pub wrong: u64,
    /// The first of them, as a 16-byte word index.
    pub first: Option<u64>,
}

impl Verified {
    /// Both verifications together.
    pub fn and(self, other: Verified) -> Verified {
        let first = match (self.first, other.first) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Verified { wrong: self.wrong.saturating_add(other.wrong), first }
    }
}

/// Compares `words` with the pattern with `seed`, exactly.
pub fn verify(words: &[u32], seed: u32) -> Verified {
    let mut v = Verified::default();
    for (i, chunk) in words.chunks(4).enumerate() {
        let base = 4 * i as u64;
        if chunk.iter().enumerate().any(|(k, x)| *x != pattern_word(base + k as u64, seed)) {
            v.wrong += 1;
            v.first.get_or_insert(i as u64);
        }
    }
    v
}

/// Who moves the bytes of a device-to-device copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyPath {
    /// The backend's own copy kernel (GPU: 16-byte loads and stores on the multiprocessors;
    /// CPU: memcpy on one thread).
    Kernel,
    /// The driver's device-to-device copy (`cuMemcpyDtoDAsync`, what a framework's
    /// `dst.copy_(src)` runs): the bandwidth figure of a GPU.
    Driver,
}

impl CopyPath {
    /// The name used in metrics and messages.
    pub fn name(self) -> &'static str {
        match self {
            CopyPath::Kernel => "kernel",
            CopyPath::Driver => "driver",
        }
    }
}

/// A direction of a host-device copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostDir {
    /// Pinned host memory to device memory.
    ToDevice,
    /// Device memory to pinned host memory.
    ToHost,
}

/// Which buffer of a host-bandwidth set-up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostSide {
    Host,
    Device,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_is_exact_and_a_changed_byte_is_found() {
        let mut w = vec![0u32; 64];
        fill(&mut w, 7);
        assert_eq!(w[0], 7);
        assert_eq!(w[1], PATTERN_MUL.wrapping_add(7));
        assert_eq!(pattern_byte(4, 7), PATTERN_MUL.wrapping_add(7).to_le_bytes()[0]);
        assert_eq!(verify(&w, 7), Verified::default());
        assert_eq!(verify(&w, 8).wrong, 16, "another seed differs everywhere");
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut w);
        bytes[37] ^= 0x10;
        assert_eq!(verify(&w, 7), Verified { wrong: 1, first: Some(2) });
        let v = Verified { wrong: 1, first: Some(5) }.and(Verified { wrong: 2, first: Some(3) });
        assert_eq!(v, Verified { wrong: 3, first: Some(3) });
    }
}
