//! `matmul-all-reduce-overlap`: a GEMM and an all-reduce at once, against each alone.

use super::{Bad, CheckGroup, CheckId, Code, ConfigAccess, Descriptor, Metric, Needs, WrongResult, no_settling};
use crate::config::micro::OverlapConfig;
use crate::config::buffers::{self, Need};
use crate::kinds::DeviceKind;

/// This check's configuration, the field `overlap` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = OverlapConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    match device {
        DeviceKind::Cuda => OverlapConfig { gemm_size: 8192, bytes: 256 << 20, warmup: 3, iters: 20 },
        DeviceKind::Cpu => OverlapConfig { gemm_size: 384, bytes: 1 << 20, warmup: 2, iters: 10 },
    }
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::MatmulAllReduceOverlap,
    group: CheckGroup::Micro,
    description: "errors/hangs or slow steps with GEMM and all-reduce at once",
    listed: true,
    needs: Needs::TwoRanks,
    reference_estimate_s: 60,
    estimate_s: 2,
    params: OverlapConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.overlap.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.overlap).unwrap_or_default(),
    },
    memory: Some(|c, device| {
        let o = &c.overlap;
        let (g, c) = (buffers::gemm(o.gemm_size, device), buffers::collective(o.bytes, device));
        Need { device: buffers::add(&[g.device, c.device]), host: buffers::add(&[g.host, c.host]) }
    }),
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

check_codes! {
    OverlapWrongResult = "OVERLAP_WRONG_RESULT", Critical, "critical", [Check(CheckId::MatmulAllReduceOverlap)], "rank",
        "the GEMM or the all-reduce run together gave a wrong result",
        "exclude the node";
    OverlapSlow = "OVERLAP_SLOW", Critical, "critical / warning", [Check(CheckId::MatmulAllReduceOverlap)], "rank",
        "overlapped steps per second below the peers' band",
        "exclude the node";
    OverlapBelowExpected = "OVERLAP_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::MatmulAllReduceOverlap)], "rank",
        "below the expected band (where the data file has one)",
        "as above";
}
