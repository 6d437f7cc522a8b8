//! `memory-bandwidth`: a device-to-device copy, verified, timed on the device.

use crate::findings::Code;
use super::{no_settling, Bad, CheckGroup, CheckId, ConfigAccess, Descriptor, Metric, Needs, WrongResult};
use crate::config::bandwidth::MemoryBandwidthConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::MemoryBandwidth,
    group: CheckGroup::Micro,
    description: "device memory that copies wrongly or slowly (HBM bandwidth; host memory on CPU)",
    available: true,
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 30,
    estimate_s: 2,
    params: MemoryBandwidthConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.micro.memory_bandwidth.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.micro.memory_bandwidth).unwrap_or_default(),
    },
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
