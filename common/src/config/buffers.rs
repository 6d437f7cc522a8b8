//! What the micro-benchmarks' buffers take, per rank, from their sizes ([`super::memory`]
//! holds a run's checks against them).
//!
//! The figures are lower bounds of what each check allocates at its largest size (its buffers
//! and the host copy it verifies), in checked arithmetic: a product that overflows counts as
//! `u64::MAX`. Each check states its own need in its descriptor (`Descriptor::memory`) with the
//! helpers here; the model checks' memory depends on their activations and is not estimated.

use crate::kinds::DeviceKind;

/// Bytes one rank needs for one check: on its device (GPU memory; 0 on CPU workers, whose
/// buffers are in host memory) and in host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub device: u64,
    pub host: u64,
}

/// The product of `parts`, `u64::MAX` on overflow.
pub fn mul(parts: &[u64]) -> u64 {
    parts.iter().try_fold(1u64, |acc, p| acc.checked_mul(*p)).unwrap_or(u64::MAX)
}

/// The sum of `parts`, `u64::MAX` on overflow.
pub fn add(parts: &[u64]) -> u64 {
    parts.iter().try_fold(0u64, |acc, p| acc.checked_add(*p)).unwrap_or(u64::MAX)
}

/// Element sizes: GEMM in bf16 on GPU, fp32 on CPU; collectives the same.
fn elem(device: DeviceKind) -> u64 {
    match device {
        DeviceKind::Cuda => 2,
        DeviceKind::Cpu => 4,
    }
}

/// A square product of side `n`: A, B and C on the device; the f32 inputs made on the host and
/// C read back.
pub fn gemm(n: usize, device: DeviceKind) -> Need {
    let n2 = mul(&[n as u64, n as u64]);
    let on_device = mul(&[3, n2, elem(device)]);
    let host = add(&[mul(&[2, n2, 4]), mul(&[n2, elem(device)])]);
    match device {
        DeviceKind::Cuda => Need { device: on_device, host },
        DeviceKind::Cpu => Need { device: 0, host: add(&[on_device, host]) },
    }
}

/// A collective of `bytes`: send and receive buffers, and the result read back.
pub fn collective(bytes: u64, device: DeviceKind) -> Need {
    let on_device = mul(&[2, bytes]);
    match device {
        DeviceKind::Cuda => Need { device: on_device, host: bytes },
        DeviceKind::Cpu => Need { device: 0, host: add(&[on_device, bytes]) },
    }
}
