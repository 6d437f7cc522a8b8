//! `all-to-all`: a sweep of message sizes, verified, with the bus bandwidth of each.

use crate::findings::Code;
use super::{Bad, CheckGroup, CheckId, ConfigAccess, Descriptor, Metric, Needs, WrongResult, SWEEP_COLUMNS};
use crate::config::sweep::SweepConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::AllToAll,
    group: CheckGroup::Micro,
    description: "communication errors/hangs; low bus bandwidth (all-to-all)",
    available: true,
    listed: true,
    needs: Needs::TwoRanks,
    reference_estimate_s: 300,
    estimate_s: 5,
    params: SweepConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.micro.all_to_all.apply(p),
        settle: |c| c.micro.all_to_all.validate(CheckId::AllToAll.as_str()),
        to_value: |c| c.micro.all_to_all.to_value(),
    },
    metric: Some(Metric {
        key: "busbw_gbps",
        unit: "GB/s busbw",
        slow: Code::AlltoallSlow,
        below: Code::AlltoallBelowExpected,
        bad: Bad::Low,
        collective: true,
    }),
    wrong_result: WrongResult::Code(Code::AlltoallWrongResult),
    columns: SWEEP_COLUMNS,
    charted: &[("busbw_gbps", "busbw GB/s at the largest message")],
};
