//! `multi-all-reduce`: concurrent all-reduces per rail, per node and on the world group.

use crate::findings::Code;
use super::{no_settling, CheckGroup, CheckId, ConfigAccess, Descriptor, Needs, WrongResult};
use crate::config::micro::MultiAllReduceConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::MultiAllReduce,
    group: CheckGroup::Micro,
    description: "concurrent all-reduces per rail and per node: a bad rail or NIC",
    available: true,
    listed: true,
    needs: Needs::TwoRanks,
    reference_estimate_s: 300,
    estimate_s: 4,
    params: MultiAllReduceConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.micro.multi_all_reduce.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.micro.multi_all_reduce).unwrap_or_default(),
    },
    // Slow groups, not slow ranks: judged by the micro-benchmarks' diagnosis.
    metric: None,
    wrong_result: WrongResult::Code(Code::MultiAllreduceWrongResult),
    columns: &[("busbw_gbps_min", "min group busbw"), ("wrong_elements", "wrong")],
    charted: &[("busbw_gbps_min", "min group busbw GB/s")],
};
