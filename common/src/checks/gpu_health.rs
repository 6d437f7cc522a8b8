//! `gpu-health`: the GPU's own health as NVML reports it (docs/health.md).

use super::{no_settling, CheckGroup, CheckId, ConfigAccess, Descriptor, Needs, WrongResult};
use crate::config::health::GpuHealthConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::GpuHealth,
    group: CheckGroup::Micro,
    description: "missing GPUs, ECC errors, row remaps, XIDs, throttling, heat, degraded PCIe and NVLink (NVML)",
    available: true,
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 60,
    estimate_s: 1,
    params: GpuHealthConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.micro.gpu_health.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.micro.gpu_health).unwrap_or_default(),
    },
    metric: None,
    wrong_result: WrongResult::Own,
    columns: &[
        ("sm_clock_load_mhz", "SM MHz (load)"),
        ("power_load_w", "W (load)"),
        ("temperature_c", "temp C"),
        ("xids", "XIDs"),
        ("findings", "findings"),
    ],
    charted: &[],
};
