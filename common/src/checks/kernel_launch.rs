//! `kernel-launch`: launch latency and launch-and-synchronize round trips.

use super::{Bad, CheckGroup, CheckId, Code, ConfigAccess, Descriptor, Metric, Needs, WrongResult, no_settling};
use crate::config::micro::KernelLaunchConfig;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `kernel_launch` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = KernelLaunchConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    match device {
        DeviceKind::Cuda => KernelLaunchConfig { iters: 10_000 },
        DeviceKind::Cpu => KernelLaunchConfig { iters: 1000 },
    }
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::KernelLaunch,
    group: CheckGroup::Micro,
    description: "launch errors/hangs; slow launch latency",
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 60,
    estimate_s: 1,
    params: KernelLaunchConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.kernel_launch.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.kernel_launch).unwrap_or_default(),
    },
    memory: None,
    metric: Some(Metric {
        key: "launches_per_s",
        unit: "round trips/s",
        slow: Code::KernelLaunchSlow,
        below: Code::KernelLaunchBelowExpected,
        bad: Bad::Low,
        collective: false,
    }),
    wrong_result: WrongResult::Code(Code::KernelLaunchFailed),
    columns: &[("launch_us", "launch us"), ("round_trip_us", "launch+sync us"), ("round_trip_best_us", "best")],
    charted: &[("round_trip_us", "launch+sync us")],
};

check_codes! {
    KernelLaunchFailed = "KERNEL_LAUNCH_FAILED", Critical, "critical", [Check(CheckId::KernelLaunch)], "rank",
        "a launch or its synchronisation failed",
        "reset the GPU; exclude the node";
    KernelLaunchSlow = "KERNEL_LAUNCH_SLOW", Critical, "critical / warning", [Check(CheckId::KernelLaunch)], "rank",
        "launch round trips per second below the peers' band",
        "check the host (CPU frequency, load) and the driver";
    KernelLaunchBelowExpected = "KERNEL_LAUNCH_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::KernelLaunch)], "rank",
        "below the expected band (where the data file has one)",
        "as above";
}
