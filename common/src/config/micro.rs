//! Typed configurations of the micro-benchmarks beyond `gemm` and `all-reduce`, their
//! defaults per backend and their `--check-param` keys.

use serde::{Deserialize, Serialize};

use crate::config::{AllReduceConfig, ParamError};
use crate::report::DeviceKind;

/// Every collective sweep (all-reduce, all-gather, all-to-all) has this shape.
pub type SweepConfig = AllReduceConfig;

/// `multi-all-reduce`: one size, every group at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MultiAllReduceConfig {
    /// Bytes of each all-reduce.
    pub bytes: u64,
    /// Concurrent all-reduces on the world group, each on a communicator and stream of its own.
    pub world_streams: usize,
    pub warmup: usize,
    pub iters: usize,
    /// Whether the diagnosis compares groups of one kind. Off on CPU workers: the threads of
    /// one worker share the host's cores unfairly, so concurrent groups' figures are noise.
    pub compare_groups: bool,
}

/// `network-connectivity`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConnectivityConfig {
    /// Each probe (a TCP connection, a back-end exchange) fails after this wait.
    pub timeout_ms: u64,
    /// Bytes each back-end probe exchanges.
    pub bytes: u64,
}

/// `matmul-all-reduce-overlap`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OverlapConfig {
    /// m = n = k of the GEMM.
    pub gemm_size: usize,
    /// Bytes of the all-reduce.
    pub bytes: u64,
    pub warmup: usize,
    pub iters: usize,
}

/// `kernel-launch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelLaunchConfig {
    /// Launches per measurement.
    pub iters: usize,
}

/// The micro-benchmark part of [`crate::config::CheckConfigs`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MicroConfigs {
    pub all_gather: SweepConfig,
    pub all_to_all: SweepConfig,
    pub multi_all_reduce: MultiAllReduceConfig,
    pub network_connectivity: ConnectivityConfig,
    pub overlap: OverlapConfig,
    pub kernel_launch: KernelLaunchConfig,
}

impl MicroConfigs {
    pub fn defaults(device: DeviceKind) -> Self {
        match device {
            DeviceKind::Cuda => {
                let sweep =
                    SweepConfig { min_bytes: 1 << 10, max_bytes: 1 << 30, step_factor: 4, warmup: 5, iters: 20 };
                MicroConfigs {
                    all_gather: sweep.clone(),
                    all_to_all: sweep,
                    multi_all_reduce: MultiAllReduceConfig {
                        bytes: 256 << 20,
                        world_streams: 2,
                        warmup: 3,
                        iters: 10,
                        compare_groups: true,
                    },
                    network_connectivity: ConnectivityConfig { timeout_ms: 5000, bytes: 1 << 20 },
                    overlap: OverlapConfig { gemm_size: 8192, bytes: 256 << 20, warmup: 3, iters: 20 },
                    kernel_launch: KernelLaunchConfig { iters: 10_000 },
                }
            }
            DeviceKind::Cpu => {
                let sweep = SweepConfig { min_bytes: 4 << 10, max_bytes: 4 << 20, step_factor: 4, warmup: 2, iters: 5 };
                MicroConfigs {
                    all_gather: sweep.clone(),
                    all_to_all: sweep,
                    multi_all_reduce: MultiAllReduceConfig {
                        bytes: 1 << 20,
                        world_streams: 2,
                        warmup: 2,
                        iters: 5,
                        compare_groups: false,
                    },
                    network_connectivity: ConnectivityConfig { timeout_ms: 2000, bytes: 64 << 10 },
                    overlap: OverlapConfig { gemm_size: 384, bytes: 1 << 20, warmup: 2, iters: 10 },
                    kernel_launch: KernelLaunchConfig { iters: 1000 },
                }
            }
        }
    }

    /// Applies one `CHECK.KEY` override with the positive integer `int()`; `Ok(false)` for a
    /// key that is not a micro-benchmark's.
    pub fn apply(&mut self, key: &str, int: impl Fn() -> Result<u64, ParamError>) -> Result<bool, ParamError> {
        let sweep = |c: &mut SweepConfig, k: &str| -> Result<bool, ParamError> {
            match k {
                "min-bytes" => c.min_bytes = int()?,
                "max-bytes" => c.max_bytes = int()?,
                "step-factor" => c.step_factor = int()?.max(2),
                "warmup" => c.warmup = int()? as usize,
                "iters" => c.iters = int()? as usize,
                _ => return Ok(false),
            }
            Ok(true)
        };
        let Some((check, k)) = key.split_once('.') else { return Ok(false) };
        let done = match check {
            "all-gather" => sweep(&mut self.all_gather, k)?,
            "all-to-all" => sweep(&mut self.all_to_all, k)?,
            "multi-all-reduce" => {
                let c = &mut self.multi_all_reduce;
                match k {
                    "bytes" => c.bytes = int()?,
                    "world-streams" => c.world_streams = int()? as usize,
                    "warmup" => c.warmup = int()? as usize,
                    "iters" => c.iters = int()? as usize,
                    _ => return Ok(false),
                }
                true
            }
            "network-connectivity" => {
                let c = &mut self.network_connectivity;
                match k {
                    "timeout-ms" => c.timeout_ms = int()?,
                    "bytes" => c.bytes = int()?,
                    _ => return Ok(false),
                }
                true
            }
            "matmul-all-reduce-overlap" => {
                let c = &mut self.overlap;
                match k {
                    "gemm-size" => c.gemm_size = int()? as usize,
                    "bytes" => c.bytes = int()?,
                    "warmup" => c.warmup = int()? as usize,
                    "iters" => c.iters = int()? as usize,
                    _ => return Ok(false),
                }
                true
            }
            "kernel-launch" => match k {
                "iters" => {
                    self.kernel_launch.iters = int()? as usize;
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if done {
            for (name, c) in [("all-gather", &self.all_gather), ("all-to-all", &self.all_to_all)] {
                if c.min_bytes > c.max_bytes {
                    return Err(ParamError::BadValue {
                        key: format!("{name}.min-bytes"),
                        value: c.min_bytes.to_string(),
                        why: format!("must not exceed {name}.max-bytes"),
                    });
                }
            }
        }
        Ok(done)
    }
}

/// The message sizes of a sweep: from `min_bytes`, times `step_factor`, up to `max_bytes`.
pub fn sweep_sizes(c: &SweepConfig) -> Vec<u64> {
    let mut sizes = Vec::new();
    let mut b = c.min_bytes;
    while b < c.max_bytes {
        sizes.push(b);
        b = b.saturating_mul(c.step_factor.max(2));
    }
    sizes.push(c.max_bytes);
    sizes
}

pub const MICRO_PARAM_KEYS: &[&str] = &[
    "all-gather.min-bytes",
    "all-gather.max-bytes",
    "all-gather.step-factor",
    "all-gather.warmup",
    "all-gather.iters",
    "all-to-all.min-bytes",
    "all-to-all.max-bytes",
    "all-to-all.step-factor",
    "all-to-all.warmup",
    "all-to-all.iters",
    "multi-all-reduce.bytes",
    "multi-all-reduce.world-streams",
    "multi-all-reduce.warmup",
    "multi-all-reduce.iters",
    "network-connectivity.timeout-ms",
    "network-connectivity.bytes",
    "matmul-all-reduce-overlap.gemm-size",
    "matmul-all-reduce-overlap.bytes",
    "matmul-all-reduce-overlap.warmup",
    "matmul-all-reduce-overlap.iters",
    "kernel-launch.iters",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CheckConfigs;

    #[test]
    fn micro_params_override_and_reject() {
        let mut c = CheckConfigs::defaults(DeviceKind::Cpu);
        c.apply_params(&["all-gather.max-bytes=65536".into(), "network-connectivity.timeout-ms=300".into()]).unwrap();
        assert_eq!(sweep_sizes(&c.micro.all_gather), [4096, 16384, 65536]);
        assert_eq!(c.micro.network_connectivity.timeout_ms, 300);
        c.apply_params(&["multi-all-reduce.world-streams=3".into(), "kernel-launch.iters=7".into()]).unwrap();
        assert_eq!((c.micro.multi_all_reduce.world_streams, c.micro.kernel_launch.iters), (3, 7));
        assert!(c.apply_params(&["all-to-all.colour=1".into()]).is_err());
        assert!(c.apply_params(&["all-to-all.min-bytes=999999999".into()]).is_err());
        assert!(c.apply_params(&["matmul-all-reduce-overlap.iters=0".into()]).is_err());
    }

    #[test]
    fn gpu_sweeps_reach_one_gib() {
        let c = MicroConfigs::defaults(DeviceKind::Cuda);
        assert_eq!(*sweep_sizes(&c.all_gather).last().unwrap(), 1 << 30);
        assert_eq!(*sweep_sizes(&c.all_to_all).last().unwrap(), 1 << 30);
    }
}
