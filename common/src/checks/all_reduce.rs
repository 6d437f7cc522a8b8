//! `all-reduce`: a sweep of message sizes, verified, with the bus bandwidth of each.

use crate::findings::Code;
use super::{Bad, CheckGroup, CheckId, ConfigAccess, Descriptor, Metric, Needs, WrongResult, SWEEP_COLUMNS};
use crate::config::sweep::SweepConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::AllReduce,
    group: CheckGroup::Micro,
    description: "communication errors/hangs; low bus bandwidth",
    available: true,
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
