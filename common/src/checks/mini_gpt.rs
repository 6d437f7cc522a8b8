//! `mini-gpt`: a small GPT trained data-parallel for a few dozen steps.

use super::{no_settling, CheckGroup, CheckId, ConfigAccess, Descriptor, Needs, WrongResult, GPT_CHARTED, GPT_COLUMNS};
use crate::config::models::GptCheckConfig;
use crate::config::models::GptShape;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `mini_gpt` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = GptCheckConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    match device {
        DeviceKind::Cuda => GptCheckConfig {
            shape: GptShape { vocab: 4096, ctx: 512, layers: 12, heads: 12, dim: 768, batch: 16 },
            steps: 40,
            warmup: 5,
            lr: 6e-4,
            min_loss_drop: 0.2,
            tp: 1,
        },
        DeviceKind::Cpu => GptCheckConfig {
            shape: GptShape { vocab: 64, ctx: 32, layers: 2, heads: 4, dim: 64, batch: 8 },
            steps: 40,
            warmup: 3,
            lr: 3e-3,
            min_loss_drop: 0.2,
            tp: 1,
        },
    }
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::MiniGpt,
    group: CheckGroup::Model,
    description: "training loss abnormal, hang, error; slow step",
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 60,
    estimate_s: 7,
    params: GptCheckConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.mini_gpt.apply(p, false),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.mini_gpt).unwrap_or_default(),
    },
    memory: None,
    // Slow compute per step, judged by the model checks' diagnosis.
    metric: None,
    wrong_result: WrongResult::Own,
    columns: GPT_COLUMNS,
    charted: GPT_CHARTED,
};

check_codes! {
}
