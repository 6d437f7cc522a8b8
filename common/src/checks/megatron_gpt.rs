//! `megatron-gpt`: a GPT trained tensor- and data-parallel.

use super::{no_settling, CheckGroup, CheckId, ConfigAccess, Descriptor, Needs, WrongResult, GPT_CHARTED, GPT_COLUMNS};
use crate::config::models::GptCheckConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::MegatronGpt,
    group: CheckGroup::Model,
    description: "the same for a tensor+data-parallel GPT",
    available: true,
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 300,
    estimate_s: 9,
    params: GptCheckConfig::TENSOR_PARALLEL_KEYS,
    config: ConfigAccess {
        apply: |c, p| c.models.megatron_gpt.apply(p, true),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.models.megatron_gpt).unwrap_or_default(),
    },
    memory: None,
    metric: None,
    wrong_result: WrongResult::Own,
    columns: GPT_COLUMNS,
    charted: GPT_CHARTED,
};

check_codes! {
}
