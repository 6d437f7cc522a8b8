//! `megatron-gpt`: a GPT trained tensor- and data-parallel.

use super::{no_settling, CheckGroup, CheckId, ConfigAccess, Descriptor, Needs, WrongResult, GPT_CHARTED, GPT_COLUMNS};
use crate::config::models::GptCheckConfig;
use crate::config::models::GptShape;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `megatron_gpt` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = GptCheckConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    // mini-gpt's, with tensor parallelism over the whole node and, on a GPU, a larger model.
    let mini = super::mini_gpt::defaults(device);
    match device {
        DeviceKind::Cuda => GptCheckConfig {
            shape: GptShape { ctx: 1024, layers: 8, heads: 16, dim: 2048, batch: 8, ..mini.shape.clone() },
            lr: 3e-4,
            tp: 0,
            ..mini
        },
        DeviceKind::Cpu => GptCheckConfig { tp: 0, ..mini },
    }
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::MegatronGpt,
    group: CheckGroup::Model,
    description: "the same for a tensor+data-parallel GPT",
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 300,
    estimate_s: 9,
    params: GptCheckConfig::TENSOR_PARALLEL_KEYS,
    config: ConfigAccess {
        apply: |c, p| c.megatron_gpt.apply(p, true),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.megatron_gpt).unwrap_or_default(),
    },
    memory: None,
    metric: None,
    wrong_result: WrongResult::Own,
    columns: GPT_COLUMNS,
    charted: GPT_CHARTED,
};

check_codes! {
}
