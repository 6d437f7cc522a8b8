//! `matmul-all-reduce-overlap`: a GEMM and an all-reduce at once, against each alone.

use crate::findings::Code;
use super::{no_settling, Bad, CheckGroup, CheckId, ConfigAccess, Descriptor, Metric, Needs, WrongResult};
use crate::config::micro::OverlapConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::MatmulAllReduceOverlap,
    group: CheckGroup::Micro,
    description: "errors/hangs or slow steps with GEMM and all-reduce at once",
    available: true,
    listed: true,
    needs: Needs::TwoRanks,
    reference_estimate_s: 60,
    estimate_s: 2,
    params: OverlapConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.micro.overlap.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.micro.overlap).unwrap_or_default(),
    },
    metric: Some(Metric {
        key: "overlapped_steps_per_s",
        unit: "overlapped steps/s",
        slow: Code::OverlapSlow,
        below: Code::OverlapBelowExpected,
        bad: Bad::Low,
        collective: false,
    }),
    wrong_result: WrongResult::Code(Code::OverlapWrongResult),
    columns: &[
        ("gemm_ms_alone", "gemm ms"),
        ("allreduce_ms_alone", "allreduce ms"),
        ("overlapped_step_ms", "overlapped ms"),
        ("overlap_efficiency", "efficiency"),
    ],
    charted: &[("overlapped_step_ms", "overlapped step ms"), ("overlap_efficiency", "overlap efficiency")],
};
