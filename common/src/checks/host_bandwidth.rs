//! `host-bandwidth`: pinned host-to-device and device-to-host copies per GPU, alone and with
//! every GPU of the node at once.

use crate::findings::Code;
use super::{no_settling, Bad, CheckGroup, CheckId, ConfigAccess, Descriptor, Metric, Needs, WrongResult};
use crate::config::bandwidth::HostBandwidthConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::HostBandwidth,
    group: CheckGroup::Micro,
    description: "slow or wrong host-device copies (PCIe link, switch, NUMA placement)",
    available: true,
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 30,
    estimate_s: 2,
    params: HostBandwidthConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.micro.host_bandwidth.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.micro.host_bandwidth).unwrap_or_default(),
    },
    // The lower of the two directions, each copied alone.
    metric: Some(Metric {
        key: "gbps",
        unit: "GB/s",
        slow: Code::HostBwSlow,
        below: Code::HostBwBelowExpected,
        bad: Bad::Low,
        collective: false,
    }),
    wrong_result: WrongResult::Code(Code::HostBwWrongResult),
    columns: &[
        ("h2d_gbps", "H2D GB/s"),
        ("d2h_gbps", "D2H GB/s"),
        ("h2d_concurrent_gbps", "H2D all GPUs"),
        ("d2h_concurrent_gbps", "D2H all GPUs"),
        ("wrong_words", "wrong"),
    ],
    charted: &[("h2d_gbps", "H2D GB/s"), ("d2h_gbps", "D2H GB/s")],
};
