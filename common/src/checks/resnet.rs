//! `resnet`: a ResNet with bottleneck blocks trained data-parallel on synthetic images.

use super::{no_settling, CheckGroup, CheckId, ConfigAccess, Descriptor, Needs, WrongResult};
use crate::config::models::ResnetCheckConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::Resnet,
    group: CheckGroup::Model,
    description: "the same for ResNet training",
    available: true,
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 120,
    estimate_s: 4,
    params: ResnetCheckConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.models.resnet.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.models.resnet).unwrap_or_default(),
    },
    memory: None,
    metric: None,
    wrong_result: WrongResult::Own,
    columns: &[
        ("step_ms_median", "step ms"),
        ("images_per_s", "images/s"),
        ("tflops", "TFLOP/s"),
        ("mfu", "MFU"),
        ("power_w_mean", "W mean"),
        ("sm_mhz_mean", "SM MHz mean"),
        ("loss_first", "first loss"),
        ("loss_final", "final loss"),
    ],
    charted: &[("step_ms_median", "step ms"), ("images_per_s", "images/s"), ("mfu", "MFU")],
};

check_codes! {
}
