//! `mini-gpt`: a small GPT trained data-parallel for a few dozen steps.

use super::{no_settling, CheckGroup, CheckId, ConfigAccess, Descriptor, Needs, WrongResult, GPT_CHARTED, GPT_COLUMNS};
use crate::config::models::GptCheckConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::MiniGpt,
    group: CheckGroup::Model,
    description: "training loss abnormal, hang, error; slow step",
    available: true,
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 60,
    estimate_s: 7,
    params: GptCheckConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.models.mini_gpt.apply(p, false),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.models.mini_gpt).unwrap_or_default(),
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
