//! Bandwidth formulas with nccl-tests' definitions (see nccl-tests `doc/PERFORMANCE.md`).
//!
//! `algbw = bytes / time`, where `bytes` is the size of the per-rank buffer the collective is
//! called with; `busbw = algbw * factor(n)` makes figures comparable with the hardware's peak
//! link bandwidth whatever the number of ranks.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    AllToAll,
    Broadcast,
    SendRecv,
}

impl Collective {
    /// The bus bandwidth factor for `n` ranks.
    pub fn bus_factor(self, n: usize) -> f64 {
        if n == 0 {
            return 0.0;
        }
        let n = n as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => (n - 1.0) / n,
            Collective::Broadcast | Collective::SendRecv => 1.0,
        }
    }
}

/// Algorithm bandwidth in GB/s (1e9 bytes per second), as nccl-tests prints it.
pub fn algbw_gbps(bytes: u64, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    bytes as f64 / seconds / 1e9
}

/// Bus bandwidth in GB/s for `collective` over `n` ranks.
pub fn busbw_gbps(collective: Collective, n: usize, bytes: u64, seconds: f64) -> f64 {
    algbw_gbps(bytes, seconds) * collective.bus_factor(n)
}

/// TFLOP/s of an `m x n x k` matrix product that took `seconds`.
pub fn gemm_tflops(m: u64, n: u64, k: u64, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    2.0 * m as f64 * n as f64 * k as f64 / seconds / 1e12
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn factors_match_nccl_tests() {
        assert_eq!(Collective::AllReduce.bus_factor(2), 1.0);
        assert_eq!(Collective::AllReduce.bus_factor(8), 1.75);
        assert_eq!(Collective::AllGather.bus_factor(8), 0.875);
        assert_eq!(Collective::AllToAll.bus_factor(4), 0.75);
        assert_eq!(Collective::Broadcast.bus_factor(8), 1.0);
        assert_eq!(Collective::AllReduce.bus_factor(1), 0.0);
    }

    #[test]
    fn busbw_of_one_gib_all_reduce() {
        // 1 GiB in 6.5 ms over 2 ranks: algbw 165.2 GB/s, busbw the same (factor 1).
        let b = busbw_gbps(Collective::AllReduce, 2, 1 << 30, 6.5e-3);
        assert!((b - 165.19).abs() < 0.01, "{b}");
        let b8 = busbw_gbps(Collective::AllReduce, 8, 1 << 30, 6.5e-3);
        assert!((b8 - 165.19 * 1.75).abs() < 0.02, "{b8}");
        assert_eq!(algbw_gbps(1, 0.0), 0.0);
    }

    #[test]
    fn tflops_of_8192_cube() {
        let t = gemm_tflops(8192, 8192, 8192, 1.43e-3);
        assert!((t - 768.9).abs() < 0.5, "{t}");
    }
}
