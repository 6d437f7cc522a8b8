//! `gpu-health`: the GPU's own health as NVML reports it (docs/health.md).

use super::{no_settling, CheckGroup, CheckId, ConfigAccess, Descriptor, Needs, WrongResult};
use crate::config::health::GpuHealthConfig;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `gpu_health` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = GpuHealthConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    let _ = device;
    GpuHealthConfig::default()
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::GpuHealth,
    group: CheckGroup::Micro,
    description: "missing GPUs, ECC errors, row remaps, XIDs, throttling, heat, degraded PCIe and NVLink (NVML)",
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 60,
    estimate_s: 1,
    params: GpuHealthConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.gpu_health.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.gpu_health).unwrap_or_default(),
    },
    memory: None,
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

check_codes! {
    GpuHealthMissingGpu = "GPU_HEALTH_MISSING_GPU", Critical, "critical", [Check(CheckId::GpuHealth)], "node",
        "NVML sees fewer GPUs on the node than expected (`gpu-health.expected-gpus`, else the workers started there): \"7 of 8 GPUs visible\"",
        "exclude the node; a GPU that fell off the bus or was not enumerated needs a reboot";
    GpuHealthNvmlUnavailable = "GPU_HEALTH_NVML_UNAVAILABLE", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "on a CUDA worker NVML (libnvidia-ml.so.1) could not be loaded or read: the GPU's health is unknown; the node is suspect",
        "make the driver's libnvidia-ml.so.1 visible to the check";
    GpuHealthEccDisabled = "GPU_HEALTH_ECC_DISABLED", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "ECC is off: memory errors go undetected",
        "enable ECC and reset the GPU";
    GpuHealthEccUncorrectable = "GPU_HEALTH_ECC_UNCORRECTABLE", Critical, "critical (warning when only aggregate)", [Check(CheckId::GpuHealth)], "rank",
        "uncorrectable ECC errors since the driver loaded (volatile); aggregate-only counts (over the device's life) warn",
        "exclude the node; reset the GPU; replace it if they recur";
    GpuHealthRowRemapPending = "GPU_HEALTH_ROW_REMAP_PENDING", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "a row remap waits for a GPU reset",
        "exclude the node; reset the GPU";
    GpuHealthRowRemapFailed = "GPU_HEALTH_ROW_REMAP_FAILED", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "a row remapping failed: an error the memory cannot repair",
        "exclude the node; replace the GPU";
    GpuHealthBanksExhausted = "GPU_HEALTH_BANKS_EXHAUSTED", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "memory banks with no spare rows left (remapped-rows histogram, \"none\")",
        "plan to replace the GPU";
    GpuHealthPageRetirementPending = "GPU_HEALTH_PAGE_RETIREMENT_PENDING", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "a page retirement waits for a reset (GPUs before row remapping)",
        "exclude the node; reset the GPU";
    GpuHealthPagesRetired = "GPU_HEALTH_PAGES_RETIRED", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "60 or more retired pages",
        "exclude the node; replace the GPU";
    GpuHealthXidFatal = "GPU_HEALTH_XID_FATAL", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "an XID of the fatal table (`gpu-health.fatal-xids`, docs/health.md) during the window; evidence: the count of events",
        "exclude the node; reset the GPU or reboot as the XID catalogue says";
    GpuHealthXid = "GPU_HEALTH_XID", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "another XID during the window",
        "read the kernel log for the XID's detail";
    GpuHealthHwSlowdown = "GPU_HEALTH_HW_SLOWDOWN", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "HW slowdown, HW thermal slowdown or HW power brake active at the end of the load, or their time counters rose during the window",
        "exclude the node; check cooling, power supply and the power-brake signal";
    GpuHealthSwThermal = "GPU_HEALTH_SW_THERMAL", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the driver lowered the clocks for temperature",
        "check the node's cooling";
    GpuHealthSmClockLow = "GPU_HEALTH_SM_CLOCK_LOW", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the highest SM clock under the check's load below `gpu-health.min-clock-fraction` (0.5) of its maximum",
        "check clock locks, power limits, clock-event reasons";
    GpuHealthHot = "GPU_HEALTH_HOT", Critical, "critical / warning", [Check(CheckId::GpuHealth)], "rank",
        "GPU temperature at or above its slowdown threshold (critical), or within 5 C of it (warning)",
        "check cooling; exclude the node if it stays hot";
    GpuHealthPowerCapped = "GPU_HEALTH_POWER_CAPPED", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the enforced power limit is below the default limit",
        "restore the power limit unless lowered on purpose";
    GpuHealthPcieDegraded = "GPU_HEALTH_PCIE_DEGRADED", Critical, "critical (width) / warning (generation)", [Check(CheckId::GpuHealth)], "rank",
        "the PCIe link under load is narrower than its maximum (x8 of x16: critical) or of a lower generation (warning)",
        "reseat the GPU or riser; check slot and BIOS settings";
    GpuHealthPcieReplays = "GPU_HEALTH_PCIE_REPLAYS", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the PCIe replay counter rose during the window",
        "inspect the PCIe link";
    GpuHealthNvlinkDown = "GPU_HEALTH_NVLINK_DOWN", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "some NVLinks of the GPU are up and others down (none up: no NVLink fabric here, not judged)",
        "inspect the NVLink/NVSwitch fabric";
    GpuHealthNvlinkErrors = "GPU_HEALTH_NVLINK_ERRORS", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "NVLink CRC flit/data, replay or recovery counters rose during the window",
        "inspect the fabric; exclude the node if they keep rising";
    GpuHealthRecoveryAction = "GPU_HEALTH_RECOVERY_ACTION", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "the driver recommends a recovery action (GPU reset, node reboot, drain)",
        "exclude the node; carry out the action";
    GpuHealthLeftoverMemory = "GPU_HEALTH_LEFTOVER_MEMORY", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "processes other than the run's own workers hold more GPU memory than `gpu-health.leftover-memory-mib` (1024) on the rank's GPU; names each (pid, name from /proc where readable, kind, MiB)",
        "end the processes (a previous job's that did not exit) or exclude the node";
    GpuHealthForeignCompute = "GPU_HEALTH_FOREIGN_COMPUTE", Critical, "critical (warning with `gpu-health.foreign-compute=warning`)", [Check(CheckId::GpuHealth)], "rank",
        "another process computed on the rank's GPU during the run (NVML's per-process SM utilisation above 0); names it",
        "end the process or exclude the node: the job would share the GPU";
    GpuHealthOtherProcess = "GPU_HEALTH_OTHER_PROCESS", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "other processes are on the GPU, below the memory share and not computing; named",
        "check what they are";
    GpuHealthComputeMode = "GPU_HEALTH_COMPUTE_MODE", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "compute mode Prohibited, or Exclusive_Process with another process already on the GPU: the job cannot open it",
        "set the default compute mode (`nvidia-smi -c DEFAULT`) or end the other process";
    GpuHealthMigEnabled = "GPU_HEALTH_MIG_ENABLED", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "MIG mode is on and the job did not ask for MIG (`gpu-health.allow-mig=true` says it did)",
        "disable MIG and reset the GPU";
    GpuHealthMigPending = "GPU_HEALTH_MIG_PENDING", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "a MIG mode change waits for a GPU reset",
        "reset the GPU";
    GpuHealthEccPending = "GPU_HEALTH_ECC_PENDING", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "an ECC mode change waits for a GPU reset",
        "reset the GPU";
    GpuHealthAppClocksLow = "GPU_HEALTH_APP_CLOCKS_LOW", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the application SM clock is set below its default",
        "reset the application clocks (`nvidia-smi -rac`)";
    GpuHealthClocksLocked = "GPU_HEALTH_CLOCKS_LOCKED", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "the SM clocks are locked below the GPU's maximum (`nvidia-smi -lgc`); allowed by `gpu-health.allow-locked-clocks=true`",
        "reset them (`nvidia-smi -rgc`)";
    GpuHealthMpsActive = "GPU_HEALTH_MPS_ACTIVE", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "an MPS control daemon serves the node (its pipe directory's control socket, or its processes); allowed by `gpu-health.allow-mps=true`",
        "stop it (`quit` on `nvidia-cuda-mps-control`'s stdin) or exclude the node";
    GpuHealthPersistenceOff = "GPU_HEALTH_PERSISTENCE_OFF", Warning, "warning", [Check(CheckId::GpuHealth)], "rank",
        "persistence mode is off",
        "enable nvidia-persistenced";
    GpuHealthDriverOld = "GPU_HEALTH_DRIVER_OLD", Critical, "critical", [Check(CheckId::GpuHealth)], "rank",
        "the driver is below `gpu-health.min-driver` (unset by default: no minimum)",
        "upgrade the driver";
    GpuHealthFabricNotReady = "GPU_HEALTH_FABRIC_NOT_READY", Critical, "critical (policy: `gpu-health.fabric`)", [Check(CheckId::GpuHealth)], "rank",
        "the GPU's NVSwitch fabric is not ready (NVML's fabric state not completed, or completed with an error): CUDA fails with \"system not yet initialized\"",
        "start or wait for nvidia-fabricmanager; check its log";
}
