//! From readings to findings, with no reading here: every decision is a pure function of
//! [`Readings`] and a [`Policy`], so recorded readings test it (docs/health.md lists the rules).

use super::{xid, ClockEvents, Readings};
use crate::config::health::GpuHealthConfig;
use crate::findings::{Code, Finding};
use crate::kinds::Severity;
use crate::registry::CheckId;

/// What the decisions compare with: the fatal XIDs and the thresholds.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub fatal_xids: Vec<u32>,
    /// Below this fraction of its maximum, an SM clock under load is a warning.
    pub min_clock_fraction: f64,
    /// Within this many degrees of the slowdown threshold is a warning; at or above it critical.
    pub hot_margin_c: u32,
    /// Retired pages from this count on make the GPU eligible for replacement (NVIDIA's page
    /// retirement documentation: 60).
    pub retired_pages_limit: u32,
}

impl Policy {
    pub fn from_config(c: &GpuHealthConfig) -> Policy {
        Policy {
            fatal_xids: c.fatal_xids.clone(),
            min_clock_fraction: c.min_clock_fraction,
            hot_margin_c: 5,
            retired_pages_limit: 60,
        }
    }
}

fn name() -> CheckId {
    CheckId::GpuHealth
}

fn finding(sev: Severity, code: Code, gpu: &Readings, what: String, action: &str) -> Finding {
    let mut f = Finding::new(sev, code, name(), format!("GPU {} ({}): {what}", gpu.index, gpu.pci_bus_id));
    f.action = Some(action.into());
    f
}

/// The census of a node: fewer GPUs visible to NVML than the job expects on it.
pub fn census(visible: u32, expected: usize) -> Option<Finding> {
    let expected_u32 = u32::try_from(expected).unwrap_or(u32::MAX);
    (visible < expected_u32).then(|| {
        let mut f = Finding::new(
            Severity::Critical,
            Code::GpuHealthMissingGpu,
            name(),
            format!("{visible} of {expected} GPUs visible"),
        );
        f.measured = Some(f64::from(visible));
        f.expected = Some(expected as f64);
        f.action = Some("exclude the node; a GPU that fell off the bus or was not enumerated needs a reboot".into());
        f
    })
}

/// NVML could not be loaded or read on a CUDA node: the GPU's health is unknown.
pub fn nvml_unavailable(why: &str) -> Finding {
    let mut f = Finding::new(
        Severity::Warning,
        Code::GpuHealthNvmlUnavailable,
        name(),
        format!("GPU health unknown: NVML could not be read ({why})"),
    );
    f.action =
        Some("make libnvidia-ml.so.1 (the driver's) visible to the check, e.g. in the container's library path".into());
    f
}

/// Every finding about one GPU's readings.
pub fn decide(gpu: &Readings, policy: &Policy) -> Vec<Finding> {
    let mut out = Vec::new();
    memory(gpu, policy, &mut out);
    xids(gpu, policy, &mut out);
    clocks(gpu, policy, &mut out);
    links(gpu, &mut out);
    if let Some(&action) = gpu.recovery_action.value() {
        if action != 0 {
            let what = match action {
                1 => "GPU reset",
                2 => "node reboot",
                3 => "drain peer-to-peer traffic",
                4 => "drain and reset",
                _ => "an action unknown to this build",
            };
            out.push(finding(
                Severity::Critical,
                Code::GpuHealthRecoveryAction,
                gpu,
                format!("the driver recommends a recovery action: {what} (code {action})"),
                "exclude the node and carry out the driver's recovery action",
            ));
        }
    }
    out
}

fn memory(gpu: &Readings, policy: &Policy, out: &mut Vec<Finding>) {
    if let Some(ecc) = gpu.ecc.value() {
        if !ecc.enabled {
            out.push(finding(
                Severity::Warning,
                Code::GpuHealthEccDisabled,
                gpu,
                "ECC is disabled: memory errors go undetected".into(),
                "enable ECC (nvidia-smi -e 1) and reset the GPU",
            ));
        }
        if ecc.volatile_uncorrected > 0 {
            out.push(finding(
                Severity::Critical,
                Code::GpuHealthEccUncorrectable,
                gpu,
                format!("{} uncorrectable ECC errors since the driver loaded", ecc.volatile_uncorrected),
                "exclude the node; reset the GPU; replace it if they recur",
            ));
        } else if ecc.aggregate_uncorrected > 0 {
            out.push(finding(
                Severity::Warning,
                Code::GpuHealthEccUncorrectable,
                gpu,
                format!(
                    "{} uncorrectable ECC errors over the device's life (none since the driver loaded)",
                    ecc.aggregate_uncorrected
                ),
                "watch the GPU; check its remapped rows",
            ));
        }
    }
    if let Some(rows) = gpu.remapped_rows.value() {
        if rows.failure {
            out.push(finding(
                Severity::Critical,
                Code::GpuHealthRowRemapFailed,
                gpu,
                "a row remapping failed: the memory has an error it cannot repair".into(),
                "exclude the node; replace the GPU",
            ));
        }
        if rows.pending {
            out.push(finding(
                Severity::Critical,
                Code::GpuHealthRowRemapPending,
                gpu,
                format!(
                    "a row remap is pending ({} correctable, {} uncorrectable rows remapped)",
                    rows.correctable, rows.uncorrectable
                ),
                "exclude the node; reset the GPU so the remap takes effect",
            ));
        }
    }
    if let Some(h) = gpu.bank_histogram.value() {
        if h.none > 0 {
            out.push(finding(
                Severity::Warning,
                Code::GpuHealthBanksExhausted,
                gpu,
                format!("{} memory banks have no spare rows left ({} low)", h.none, h.low),
                "plan to replace the GPU: a further error in those banks cannot be remapped",
            ));
        }
    }
    if let Some(p) = gpu.retired_pages.value() {
        let total = p.single_bit.saturating_add(p.double_bit);
        if p.pending {
            out.push(finding(
                Severity::Critical,
                Code::GpuHealthPageRetirementPending,
                gpu,
                format!("a page retirement is pending ({total} pages retired)"),
                "exclude the node; reset the GPU so the retirement takes effect",
            ));
        } else if total >= policy.retired_pages_limit {
            out.push(finding(
                Severity::Critical,
                Code::GpuHealthPagesRetired,
                gpu,
                format!("{total} pages retired, at or over the replacement limit of {}", policy.retired_pages_limit),
                "exclude the node; replace the GPU",
            ));
        }
    }
}

fn xids(gpu: &Readings, policy: &Policy, out: &mut Vec<Finding>) {
    let Some(events) = gpu.xids.value() else { return };
    let mut seen: Vec<u64> = events.iter().map(|e| e.xid).collect();
    seen.sort_unstable();
    seen.dedup();
    let (fatal, other): (Vec<u64>, Vec<u64>) =
        seen.into_iter().partition(|x| policy.fatal_xids.iter().any(|f| u64::from(*f) == *x));
    let list = |xs: &[u64]| {
        xs.iter()
            .map(|x| match xid::name(*x) {
                Some(n) => format!("{x} ({n})"),
                None => x.to_string(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let window = format!(
        "over {:.1} s from {}",
        gpu.window_s,
        if gpu.window_from.is_empty() { "the start" } else { &gpu.window_from }
    );
    if !fatal.is_empty() {
        let mut f = finding(
            Severity::Critical,
            Code::GpuHealthXidFatal,
            gpu,
            format!("fatal XID {} {window}", list(&fatal)),
            "exclude the node; reset the GPU (or reboot the node) as the XID catalogue says",
        );
        f.evidence.push(format!("{} XID events in the window", events.len()));
        out.push(f);
    }
    if !other.is_empty() {
        out.push(finding(
            Severity::Warning,
            Code::GpuHealthXid,
            gpu,
            format!("XID {} {window}", list(&other)),
            "read the kernel log (dmesg) for the XID's detail",
        ));
    }
}

fn clocks(gpu: &Readings, policy: &Policy, out: &mut Vec<Finding>) {
    let active = gpu.clock_events.value().map_or(0, |c| c.mask);
    let t = &gpu.clock_event_time;
    let mut hw: Vec<String> = Vec::new();
    for (bit, ns, what) in [
        (ClockEvents::HW_SLOWDOWN, None, "HW slowdown"),
        (ClockEvents::HW_THERMAL, t.hw_thermal_ns, "HW thermal slowdown"),
        (ClockEvents::HW_POWER_BRAKE, t.hw_power_brake_ns, "HW power brake"),
    ] {
        let ms = ns.unwrap_or(0) / 1_000_000;
        if active & bit != 0 {
            hw.push(format!("{what} active"));
        } else if ms > 0 {
            hw.push(format!("{what} for {ms} ms of the window"));
        }
    }
    if !hw.is_empty() {
        out.push(finding(
            Severity::Critical,
            Code::GpuHealthHwSlowdown,
            gpu,
            format!("clocks held down by hardware: {}", hw.join(", ")),
            "exclude the node; check cooling, the power supply and the power-brake signal",
        ));
    }
    let sw_thermal_ms = t.sw_thermal_ns.unwrap_or(0) / 1_000_000;
    if active & ClockEvents::SW_THERMAL != 0 || sw_thermal_ms > 0 {
        out.push(finding(
            Severity::Warning,
            Code::GpuHealthSwThermal,
            gpu,
            format!("clocks lowered by the driver for temperature ({sw_thermal_ms} ms of the window)"),
            "check the node's cooling and airflow",
        ));
    }
    if let Some(c) = gpu.sm_clock.value() {
        if c.max_mhz > 0
            && c.samples > 0
            && f64::from(c.under_load_mhz) < policy.min_clock_fraction * f64::from(c.max_mhz)
        {
            let mut f = finding(
                Severity::Warning,
                Code::GpuHealthSmClockLow,
                gpu,
                format!(
                    "SM clock {} MHz under load, below {:.0}% of its maximum {} MHz",
                    c.under_load_mhz,
                    100.0 * policy.min_clock_fraction,
                    c.max_mhz
                ),
                "check clock locks (nvidia-smi -q -d CLOCK), power limits and the clock-event reasons",
            );
            f.measured = Some(f64::from(c.under_load_mhz));
            f.expected = Some(f64::from(c.max_mhz));
            out.push(f);
        }
    }
    if let Some(temp) = gpu.temperature.value() {
        if let Some(slow) = temp.slowdown_c {
            let sev = if temp.gpu_c >= slow {
                Some(Severity::Critical)
            } else if temp.gpu_c.saturating_add(policy.hot_margin_c) >= slow {
                Some(Severity::Warning)
            } else {
                None
            };
            if let Some(sev) = sev {
                let mut f = finding(
                    sev,
                    Code::GpuHealthHot,
                    gpu,
                    format!("{} C, slowdown at {} C", temp.gpu_c, slow),
                    "check the node's cooling and airflow; exclude it if it stays this hot",
                );
                f.measured = Some(f64::from(temp.gpu_c));
                f.expected = Some(f64::from(slow));
                out.push(f);
            }
        }
    }
    if let Some(p) = gpu.power.value() {
        if let Some(default) = p.default_limit_w {
            if p.enforced_limit_w + 1.0 < default {
                let mut f = finding(
                    Severity::Warning,
                    Code::GpuHealthPowerCapped,
                    gpu,
                    format!("enforced power limit {:.0} W, below the default {:.0} W", p.enforced_limit_w, default),
                    "restore the power limit (nvidia-smi -pl) unless it was lowered on purpose",
                );
                f.measured = Some(p.enforced_limit_w);
                f.expected = Some(default);
                out.push(f);
            }
        }
    }
}

fn links(gpu: &Readings, out: &mut Vec<Finding>) {
    if let Some(p) = gpu.pcie.value() {
        if p.width < p.max_width {
            out.push(finding(
                Severity::Critical,
                Code::GpuHealthPcieDegraded,
                gpu,
                format!("PCIe link x{} of x{} (gen {} of {})", p.width, p.max_width, p.gen, p.max_gen),
                "exclude the node; reseat the GPU or its riser, inspect the slot",
            ));
        } else if p.gen < p.max_gen {
            out.push(finding(
                Severity::Warning,
                Code::GpuHealthPcieDegraded,
                gpu,
                format!("PCIe link gen {} of {} under load (x{})", p.gen, p.max_gen, p.width),
                "check the slot's and the BIOS's PCIe settings",
            ));
        }
        if let Some(replays) = p.replay_delta.filter(|r| *r > 0) {
            out.push(finding(
                Severity::Warning,
                Code::GpuHealthPcieReplays,
                gpu,
                format!("{replays} PCIe replays in the window"),
                "inspect the PCIe link (riser, slot); exclude the node if they keep rising",
            ));
        }
    }
    if let Some(links) = gpu.nvlink.value() {
        let up = links.iter().filter(|l| l.active).count();
        let down: Vec<String> = links.iter().filter(|l| !l.active).map(|l| l.link.to_string()).collect();
        // A GPU none of whose links is up has no NVLink fabric here (one GPU of a virtual
        // machine, a PCIe board): nothing to judge. Some up and some down is a broken link.
        if up > 0 && !down.is_empty() {
            out.push(finding(
                Severity::Critical,
                Code::GpuHealthNvlinkDown,
                gpu,
                format!("NVLink {} down, {up} up", down.join(", ")),
                "exclude the node; inspect the NVLink/NVSwitch fabric (nvidia-smi nvlink -s)",
            ));
        }
        let errors: Vec<String> = links
            .iter()
            .filter_map(|l| {
                let parts: Vec<String> = [
                    ("CRC flit", l.crc_flit_delta),
                    ("CRC data", l.crc_data_delta),
                    ("replay", l.replay_delta),
                    ("recovery", l.recovery_delta),
                ]
                .into_iter()
                .filter_map(|(what, d)| d.filter(|d| *d > 0).map(|d| format!("{d} {what}")))
                .collect();
                (!parts.is_empty()).then(|| format!("link {}: {}", l.link, parts.join(", ")))
            })
            .collect();
        if !errors.is_empty() {
            out.push(finding(
                Severity::Warning,
                Code::GpuHealthNvlinkErrors,
                gpu,
                format!("NVLink errors in the window: {}", errors.join("; ")),
                "inspect the NVLink fabric; exclude the node if the counters keep rising",
            ));
        }
    }
}
