//! `all-reduce`: a sweep of message sizes, verified, with the bus bandwidth of each.

use super::{Bad, CheckGroup, CheckId, Code, ConfigAccess, Descriptor, Metric, Needs, SWEEP_COLUMNS, WrongResult};
use crate::config::sweep::SweepConfig;
use crate::config::buffers;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `all_reduce` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = SweepConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    SweepConfig::defaults(device)
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::AllReduce,
    group: CheckGroup::Micro,
    description: "communication errors/hangs; low bus bandwidth",
    listed: true,
    needs: Needs::TwoRanks,
    reference_estimate_s: 300,
    estimate_s: 5,
    params: SweepConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.all_reduce.apply(p),
        settle: |c| c.all_reduce.validate(CheckId::AllReduce.as_str()),
        to_value: |c| c.all_reduce.to_value(),
    },
    memory: Some(|c, device| buffers::collective(c.all_reduce.max_bytes, device)),
    metric: Some(Metric {
        key: "busbw_gbps",
        unit: "GB/s busbw",
        slow: Code::AllreduceSlow,
        below: Code::AllreduceBelowExpected,
        bad: Bad::Low,
        collective: true,
    }),
    wrong_result: WrongResult::Code(Code::AllreduceWrongResult),
    columns: SWEEP_COLUMNS,
    charted: &[("busbw_gbps", "busbw GB/s at the largest message")],
};

check_codes! {
    AllreduceWrongResult = "ALLREDUCE_WRONG_RESULT", Critical, "critical", [Check(CheckId::AllReduce)], "rank",
        "reduced elements differ from the exact sum",
        "exclude the node";
    AllreduceSlow = "ALLREDUCE_SLOW", Critical, "critical / warning", [Check(CheckId::AllReduce)], "rank",
        "busbw below the peers' band",
        "inspect the interconnect";
    AllreduceBelowExpected = "ALLREDUCE_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::AllReduce)], "job",
        "busbw of the (single-node) job below the expected band of its device model",
        "inspect NVLink/NIC state, NCCL settings";
}
