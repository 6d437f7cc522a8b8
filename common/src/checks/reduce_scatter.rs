//! `reduce-scatter`: a sweep of message sizes, verified, with the bus bandwidth of each
//! (nccl-tests' fifth collective).

use super::{Bad, CheckGroup, CheckId, ConfigAccess, Descriptor, Metric, Needs, WrongResult, SWEEP_COLUMNS};
use crate::config::sweep::SweepConfig;
use crate::findings::Code;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::ReduceScatter,
    group: CheckGroup::Micro,
    description: "communication errors/hangs; low bus bandwidth (reduce-scatter)",
    available: true,
    listed: true,
    needs: Needs::TwoRanks,
    reference_estimate_s: 300,
    estimate_s: 5,
    params: SweepConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.micro.reduce_scatter.apply(p),
        settle: |c| c.micro.reduce_scatter.validate(CheckId::ReduceScatter.as_str()),
        to_value: |c| c.micro.reduce_scatter.to_value(),
    },
    metric: Some(Metric {
        key: "busbw_gbps",
        unit: "GB/s busbw",
        slow: Code::ReducescatterSlow,
        below: Code::ReducescatterBelowExpected,
        bad: Bad::Low,
        collective: true,
    }),
    wrong_result: WrongResult::Code(Code::ReducescatterWrongResult),
    columns: SWEEP_COLUMNS,
    charted: &[("busbw_gbps", "busbw GB/s at the largest message")],
};
