//! `host-bandwidth`: pinned host-to-device and device-to-host copies per GPU, alone and with
//! every GPU of the node at once.

use super::{Bad, CheckGroup, CheckId, Code, ConfigAccess, Descriptor, Metric, Needs, WrongResult, no_settling};
use crate::config::bandwidth::HostBandwidthConfig;
use crate::config::buffers::Need;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `host_bandwidth` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = HostBandwidthConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    HostBandwidthConfig::defaults(device)
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::HostBandwidth,
    group: CheckGroup::Micro,
    description: "slow or wrong host-device copies (PCIe link, switch, NUMA placement)",
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 30,
    estimate_s: 2,
    params: HostBandwidthConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.host_bandwidth.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.host_bandwidth).unwrap_or_default(),
    },
    memory: Some(|c, device| match device {
        // A pinned host buffer and a device buffer of the copy's size.
        DeviceKind::Cuda => Need { device: c.host_bandwidth.size, host: c.host_bandwidth.size },
        // No device link on CPU workers: the check allocates nothing.
        DeviceKind::Cpu => Need { device: 0, host: 0 },
    }),
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

check_codes! {
    HostBwWrongResult = "HOST_BW_WRONG_RESULT", Critical, "critical", [Check(CheckId::HostBandwidth)], "rank",
        "words copied across the host link (either direction, alone or with the node's other GPUs) differ from what the other side held",
        "exclude the node; reseat or inspect the GPU's PCIe path";
    HostBwSlow = "HOST_BW_SLOW", Critical, "critical / warning", [Check(CheckId::HostBandwidth)], "rank",
        "the lower of pinned host-to-device and device-to-host GB/s (each GPU alone) below the peers' band in two measurements",
        "check the GPU's PCIe link (width, generation: `nvidia-smi -q`), its NUMA placement";
    HostBwBelowExpected = "HOST_BW_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::HostBandwidth)], "rank",
        "below the expected band of its model (H100, H200 on PCIe gen5 x16: 55 GB/s)",
        "as above";
    HostBwConcurrentSlow = "HOST_BW_CONCURRENT_SLOW", Warning, "warning", [Check(CheckId::HostBandwidth)], "rank",
        "with every GPU of the node copying at once, this GPU's host link (the lower direction) is below `diagnosis.slow-fraction` of its peers' median: a PCIe switch shared with another GPU or NIC, or the wrong NUMA node",
        "check the PCIe topology (`nvidia-smi topo -m`) and the CPU affinity of the processes";
}
