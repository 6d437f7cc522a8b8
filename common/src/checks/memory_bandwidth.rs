//! `memory-bandwidth`: a device-to-device copy, verified, timed on the device.

use super::{Bad, CheckGroup, CheckId, Code, ConfigAccess, Descriptor, Metric, Needs, WrongResult, no_settling};
use crate::config::bandwidth::MemoryBandwidthConfig;
use crate::config::buffers::{self, Need};
use crate::kinds::DeviceKind;

/// This check's configuration, the field `memory_bandwidth` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = MemoryBandwidthConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    MemoryBandwidthConfig::defaults(device)
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::MemoryBandwidth,
    group: CheckGroup::Micro,
    description: "device memory that copies wrongly or slowly (HBM bandwidth; host memory on CPU)",
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 30,
    estimate_s: 2,
    params: MemoryBandwidthConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.memory_bandwidth.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.memory_bandwidth).unwrap_or_default(),
    },
    memory: Some(|c, device| {
        // Source and destination; the verification reads back only a few words.
        let both = buffers::mul(&[2, c.memory_bandwidth.size]);
        match device {
            DeviceKind::Cuda => Need { device: both, host: 0 },
            DeviceKind::Cpu => Need { device: 0, host: both },
        }
    }),
    metric: Some(Metric {
        key: "gbps",
        unit: "GB/s (read+write)",
        slow: Code::MemoryBwSlow,
        below: Code::MemoryBwBelowExpected,
        bad: Bad::Low,
        collective: false,
    }),
    wrong_result: WrongResult::Code(Code::MemoryBwWrongResult),
    columns: &[("gbps", "GB/s r+w"), ("gbps_best", "best"), ("kernel_gbps", "kernel GB/s"), ("wrong_words", "wrong")],
    charted: &[("gbps", "GB/s r+w")],
};

check_codes! {
    MemoryBwWrongResult = "MEMORY_BW_WRONG_RESULT", Critical, "critical", [Check(CheckId::MemoryBandwidth)], "rank",
        "16-byte words of the copy's source or destination differ from the fill pattern after the timed copies (`evidence`: how many, the first byte)",
        "exclude the node; reset the GPU (its memory or copy path corrupts data)";
    MemoryBwSlow = "MEMORY_BW_SLOW", Critical, "critical / warning", [Check(CheckId::MemoryBandwidth)], "rank",
        "device-to-device copy GB/s (read + written, median) below the peers' band in two measurements",
        "exclude the node; check clocks, memory errors, other processes";
    MemoryBwBelowExpected = "MEMORY_BW_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::MemoryBandwidth)], "rank",
        "below the expected band of its device model (H200: 4200 GB/s at the default 4 GiB, the driver's copy)",
        "as above";
}
