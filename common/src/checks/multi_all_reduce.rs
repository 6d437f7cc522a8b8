//! `multi-all-reduce`: concurrent all-reduces per rail, per node and on the world group.

use super::{CheckGroup, CheckId, Code, ConfigAccess, Descriptor, Needs, WrongResult, no_settling};
use crate::config::micro::MultiAllReduceConfig;
use crate::config::buffers::{self, Need};
use crate::kinds::DeviceKind;

/// This check's configuration, the field `multi_all_reduce` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = MultiAllReduceConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    match device {
        DeviceKind::Cuda => {
            MultiAllReduceConfig { bytes: 256 << 20, world_streams: 2, warmup: 3, iters: 10, compare_groups: true }
        }
        DeviceKind::Cpu => MultiAllReduceConfig { bytes: 1 << 20, world_streams: 2, warmup: 2, iters: 5, compare_groups: false },
    }
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::MultiAllReduce,
    group: CheckGroup::Micro,
    description: "concurrent all-reduces per rail and per node: a bad rail or NIC",
    listed: true,
    needs: Needs::TwoRanks,
    reference_estimate_s: 300,
    estimate_s: 4,
    params: MultiAllReduceConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.multi_all_reduce.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.multi_all_reduce).unwrap_or_default(),
    },
    memory: Some(|c, device| {
        // Every group at once: the world's streams and the two group kinds beside them.
        let m = &c.multi_all_reduce;
        let streams = (m.world_streams as u64).saturating_add(2);
        let one = buffers::collective(m.bytes, device);
        Need { device: buffers::mul(&[streams, one.device]), host: buffers::mul(&[streams, one.host]) }
    }),
    // Slow groups, not slow ranks: judged by the micro-benchmarks' diagnosis.
    metric: None,
    wrong_result: WrongResult::Code(Code::MultiAllreduceWrongResult),
    columns: &[("busbw_gbps_min", "min group busbw"), ("wrong_elements", "wrong")],
    charted: &[("busbw_gbps_min", "min group busbw GB/s")],
};

check_codes! {
    MultiAllreduceWrongResult = "MULTI_ALLREDUCE_WRONG_RESULT", Critical, "critical", [Check(CheckId::MultiAllReduce)], "rank",
        "a group's sums differ from the exact ones",
        "exclude the node";
    MultiAllreduceSlowGroup = "MULTI_ALLREDUCE_SLOW_GROUP", Critical, "critical", [Check(CheckId::MultiAllReduce)], "group (its ranks)",
        "one rail, node or world group far below the other groups of its kind running at the same time (GPU only)",
        "inspect that rail's NIC, cable and switch port, or the node";
}
