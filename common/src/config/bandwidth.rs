//! Typed configurations of the device-memory, host-link and RDMA-port checks, their defaults
//! per backend and their `--check-param` fields.

use serde::{Deserialize, Serialize};

use super::param::{Param, ParamError};
use crate::kinds::DeviceKind;

/// The copy kernels move 16-byte words: every buffer size is a whole number of them.
pub const WORD: u64 = 16;

/// A byte count from `p`: positive, at most [`super::param::MAX_INT`], a multiple of [`WORD`].
fn words(p: &Param<'_>) -> Result<u64, ParamError> {
    let v = p.int()?;
    if !v.is_multiple_of(WORD) {
        return Err(p.bad(&format!("a multiple of {WORD} bytes")));
    }
    Ok(v)
}

/// `memory-bandwidth`: a device-to-device copy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryBandwidthConfig {
    /// Bytes of the source and of the destination (a multiple of 16).
    pub size: u64,
    pub warmup: usize,
    pub iters: usize,
    /// Blocks of the copy kernel per multiprocessor (GPU only; 256 threads each).
    pub blocks_per_sm: usize,
}

impl MemoryBandwidthConfig {
    pub const KEYS: &'static [&'static str] = &["size", "warmup", "iters", "blocks-per-sm"];
    /// The most blocks per multiprocessor accepted.
    const MAX_BLOCKS_PER_SM: u64 = 64;

    pub fn defaults(device: DeviceKind) -> Self {
        match device {
            // 4 GiB: far beyond any L2 (50 MiB on H100/H200), 8 GiB of device memory in all.
            DeviceKind::Cuda => MemoryBandwidthConfig { size: 4 << 30, warmup: 5, iters: 20, blocks_per_sm: 2 },
            // 64 MiB: beyond the last-level cache of most hosts, small enough for test runs.
            DeviceKind::Cpu => MemoryBandwidthConfig { size: 64 << 20, warmup: 2, iters: 10, blocks_per_sm: 8 },
        }
    }

    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "size" => self.size = words(p)?,
            "warmup" => self.warmup = p.count()?,
            "iters" => self.iters = p.count()?,
            "blocks-per-sm" => self.blocks_per_sm = p.bounded(Self::MAX_BLOCKS_PER_SM)? as usize,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl Default for MemoryBandwidthConfig {
    fn default() -> Self {
        Self::defaults(DeviceKind::Cuda)
    }
}

/// `host-bandwidth`: pinned host-to-device and device-to-host copies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostBandwidthConfig {
    /// Bytes of each copy (a multiple of 16): the pinned host buffer and the device buffer.
    pub size: u64,
    pub warmup: usize,
    pub iters: usize,
}

impl HostBandwidthConfig {
    pub const KEYS: &'static [&'static str] = &["size", "warmup", "iters"];

    pub fn defaults(device: DeviceKind) -> Self {
        match device {
            // 256 MiB per copy: a PCIe gen5 x16 link needs ~5 ms for it, far beyond set-up costs.
            DeviceKind::Cuda => HostBandwidthConfig { size: 256 << 20, warmup: 3, iters: 10 },
            DeviceKind::Cpu => HostBandwidthConfig { size: 16 << 20, warmup: 1, iters: 3 },
        }
    }

    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "size" => self.size = words(p)?,
            "warmup" => self.warmup = p.count()?,
            "iters" => self.iters = p.count()?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl Default for HostBandwidthConfig {
    fn default() -> Self {
        Self::defaults(DeviceKind::Cuda)
    }
}

/// `rdma-ports`: the RDMA ports of every node and their error counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RdmaPortsConfig {
    /// The rate in Gb/s every port must reach; `None`: the fastest port of the same link layer
    /// on the node.
    pub expected_rate_gbps: Option<u64>,
    /// Milliseconds the check itself watches the counters, beyond what the run before it did.
    pub window_ms: u64,
}

impl RdmaPortsConfig {
    pub const KEYS: &'static [&'static str] = &["expected-rate-gbps", "window-ms"];
    /// 100 Tb/s: far above any port.
    const MAX_RATE_GBPS: u64 = 100_000;
    /// Ten minutes.
    const MAX_WINDOW_MS: u64 = 600_000;

    pub fn defaults(_device: DeviceKind) -> Self {
        RdmaPortsConfig { expected_rate_gbps: None, window_ms: 1000 }
    }

    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "expected-rate-gbps" => self.expected_rate_gbps = Some(p.bounded(Self::MAX_RATE_GBPS)?),
            "window-ms" => self.window_ms = p.bounded(Self::MAX_WINDOW_MS)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}

impl Default for RdmaPortsConfig {
    fn default() -> Self {
        Self::defaults(DeviceKind::Cuda)
    }
}

#[cfg(test)]
mod tests {
    use crate::checks::CheckConfigs;
    use crate::kinds::DeviceKind;

    #[test]
    fn sizes_are_bounded_whole_words_and_hostile_values_are_refused() {
        let mut c = CheckConfigs::defaults(DeviceKind::Cpu);
        c.apply_params(&["memory-bandwidth.size=1048576".into(), "host-bandwidth.size=4096".into()]).unwrap();
        assert_eq!((c.memory_bandwidth.size, c.host_bandwidth.size), (1 << 20, 4096));
        for bad in [
            "memory-bandwidth.size=18446744073709551615",
            "memory-bandwidth.size=18446744073709551616",
            "memory-bandwidth.size=1099511627792",
            "memory-bandwidth.size=17",
            "memory-bandwidth.size=0",
            "memory-bandwidth.size=-16",
            "memory-bandwidth.blocks-per-sm=65",
            "host-bandwidth.size=100",
            "host-bandwidth.iters=0",
            "rdma-ports.expected-rate-gbps=0",
            "rdma-ports.expected-rate-gbps=100001",
            "rdma-ports.window-ms=600001",
            "rdma-ports.colour=1",
        ] {
            assert!(c.apply_params(&[bad.into()]).is_err(), "{bad}");
        }
        c.apply_params(&["rdma-ports.expected-rate-gbps=400".into(), "rdma-ports.window-ms=10".into()]).unwrap();
        assert_eq!((c.rdma_ports.expected_rate_gbps, c.rdma_ports.window_ms), (Some(400), 10));
    }
}
