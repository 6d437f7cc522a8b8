//! `all-gather`: a sweep of message sizes, verified, with the bus bandwidth of each.

use crate::findings::Code;
use super::{Bad, CheckGroup, CheckId, ConfigAccess, Descriptor, Metric, Needs, WrongResult, SWEEP_COLUMNS};
use crate::config::sweep::SweepConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::AllGather,
    group: CheckGroup::Micro,
    description: "communication errors/hangs; low bus bandwidth (all-gather)",
    available: true,
    listed: true,
    needs: Needs::TwoRanks,
    reference_estimate_s: 300,
    estimate_s: 5,
    params: SweepConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.micro.all_gather.apply(p),
        settle: |c| c.micro.all_gather.validate(CheckId::AllGather.as_str()),
        to_value: |c| c.micro.all_gather.to_value(),
    },
    metric: Some(Metric {
        key: "busbw_gbps",
        unit: "GB/s busbw",
        slow: Code::AllgatherSlow,
        below: Code::AllgatherBelowExpected,
        bad: Bad::Low,
        collective: true,
    }),
    wrong_result: WrongResult::Code(Code::AllgatherWrongResult),
    columns: SWEEP_COLUMNS,
    charted: &[("busbw_gbps", "busbw GB/s at the largest message")],
};
