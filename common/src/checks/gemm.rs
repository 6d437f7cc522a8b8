//! `gemm`: a square product per rank, verified, timed and hashed.

use super::{Bad, CheckGroup, CheckId, Code, ConfigAccess, Descriptor, Metric, Needs, WrongResult};
use crate::config::micro::GemmConfig;
use crate::config::buffers;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `gemm` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = GemmConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    GemmConfig::defaults(device)
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::Gemm,
    group: CheckGroup::Micro,
    description: "faulty GPU (error, hang, wrong result); slow GPU (low TFLOPS)",
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
    memory: Some(|c, device| buffers::gemm(c.gemm.size, device)),
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

check_codes! {
    GemmWrongResult = "GEMM_WRONG_RESULT", Critical, "critical", [Check(CheckId::Gemm)], "rank",
        "a verified tile of C differs from the f64 reference",
        "exclude the node; reset the GPU";
    GemmResultMismatch = "GEMM_RESULT_MISMATCH", Critical, "critical (warning without a majority)", [Check(CheckId::Gemm)], "rank",
        "the hash of C differs from the majority of ranks of the same model",
        "exclude the node";
    GemmSlow = "GEMM_SLOW", Critical, "critical / warning", [Check(CheckId::Gemm)], "rank",
        "TFLOP/s below the peers' band (same device model) in two measurements",
        "exclude the node; check clocks, power, other processes";
    GemmBelowExpected = "GEMM_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::Gemm)], "rank",
        "TFLOP/s below the expected band of its device model",
        "as above";
}
