//! `gemm`: a square product per rank, verified, timed and hashed.

use crate::findings::Code;
use super::{Bad, CheckGroup, CheckId, ConfigAccess, Descriptor, Metric, Needs, WrongResult};
use crate::config::micro::GemmConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::Gemm,
    group: CheckGroup::Micro,
    description: "faulty GPU (error, hang, wrong result); slow GPU (low TFLOPS)",
    available: true,
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 60,
    estimate_s: 1,
    params: GemmConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.gemm.apply(p),
        settle: |c| {
            c.gemm.settle();
            Ok(())
        },
        to_value: |c| serde_json::to_value(&c.gemm).unwrap_or_default(),
    },
    metric: Some(Metric {
        key: "tflops",
        unit: "TFLOP/s",
        slow: Code::GemmSlow,
        below: Code::GemmBelowExpected,
        bad: Bad::Low,
        collective: false,
    }),
    wrong_result: WrongResult::Code(Code::GemmWrongResult),
    columns: &[("tflops", "TFLOP/s"), ("tflops_best", "best"), ("wrong_elements", "wrong")],
    charted: &[("tflops", "TFLOP/s")],
};
