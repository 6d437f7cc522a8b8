//! The rules of one GPU alone, judged on each summary as it comes.

use gpusanity_common::health::xid;
use gpusanity_common::wire::watch::{GpuTelemetry, SuspectCode};

use crate::JudgeConfig;

/// What one GPU's summary shows on its own: each (code, evidence).
pub(crate) fn judge(cfg: &JudgeConfig, g: &GpuTelemetry) -> Vec<(SuspectCode, String)> {
    let mut out = Vec::new();
    if let Some(x) = g.xids.iter().find(|x| u32::try_from(**x).is_ok_and(|x| cfg.fatal_xids.contains(&x))) {
        let name = xid::name(*x).unwrap_or("a fatal XID");
        out.push((SuspectCode::WatchXidFatal, format!("XID {x} ({name})")));
    }
    if let Some(e) = throttled(cfg, g) {
        out.push((SuspectCode::WatchThrottled, e));
    }
    if !g.foreign.is_empty() {
        let shown: Vec<String> = g
            .foreign
            .iter()
            .map(|p| {
                let name = if p.name.is_empty() { "?".to_string() } else { p.name.escape_debug().to_string() };
                match p.used_mib {
                    Some(m) => format!("pid {} ({name}, {m} MiB)", p.pid),
                    None => format!("pid {} ({name})", p.pid),
                }
            })
            .collect();
        out.push((
            SuspectCode::WatchForeignProcess,
            format!("not the job's, computing on the GPU: {}", shown.join(", ")),
        ));
    }
    if let Some(e) = counters(cfg, g) {
        out.push((SuspectCode::WatchCountersRising, e));
    }
    out
}

/// Whether the GPU was busy in the period: a sample at or above the busy utilization.
fn busy(cfg: &JudgeConfig, g: &GpuTelemetry) -> bool {
    g.util_pct.iter().flatten().any(|u| *u >= cfg.busy_pct)
}

fn throttled(cfg: &JudgeConfig, g: &GpuTelemetry) -> Option<String> {
    let t = &g.throttle;
    let n = g.sm_mhz.len();
    let reasons = [
        ("HW slowdown", t.hw_slowdown),
        ("HW thermal slowdown", t.hw_thermal),
        ("HW power brake", t.hw_power_brake),
        ("SW thermal slowdown", t.sw_thermal),
    ];
    let hot: Vec<String> = reasons
        .iter()
        .filter(|(_, k)| *k >= cfg.throttle_samples)
        .map(|(r, k)| format!("{r} in {k} of {n} samples"))
        .collect();
    (!hot.is_empty() && busy(cfg, g)).then(|| hot.join(", "))
}

fn counters(cfg: &JudgeConfig, g: &GpuTelemetry) -> Option<String> {
    let c = &g.counters;
    let mut seen = Vec::new();
    if c.ecc_uncorrected > 0 {
        seen.push(format!("{} uncorrectable ECC errors", c.ecc_uncorrected));
    }
    if c.remapped_uncorrectable > 0 {
        seen.push(format!("{} rows remapped for uncorrectable errors", c.remapped_uncorrectable));
    }
    if c.pcie_replay >= cfg.pcie_replays {
        seen.push(format!("{} PCIe replays", c.pcie_replay));
    }
    if c.nvlink_errors >= cfg.nvlink_errors {
        seen.push(format!("{} NVLink errors", c.nvlink_errors));
    }
    (!seen.is_empty()).then(|| format!("in one period: {}", seen.join(", ")))
}

#[cfg(test)]
mod tests {
    use gpusanity_common::wire::watch::{Counters, ForeignProcess, Throttle};

    use super::*;

    fn busy_gpu() -> GpuTelemetry {
        GpuTelemetry {
            gpu: "GPU-a".into(),
            sm_mhz: vec![Some(1980); 5],
            power_w: vec![Some(650.0); 5],
            util_pct: vec![Some(100); 5],
            ..Default::default()
        }
    }

    fn codes(g: &GpuTelemetry) -> Vec<SuspectCode> {
        judge(&JudgeConfig::default(), g).into_iter().map(|(c, _)| c).collect()
    }

    #[test]
    fn a_healthy_busy_gpu_at_its_power_cap_raises_nothing() {
        let g = GpuTelemetry { throttle: Throttle { sw_power_cap: 5, ..Default::default() }, ..busy_gpu() };
        assert!(codes(&g).is_empty());
    }

    #[test]
    fn each_rule_of_one_gpu_names_its_cause() {
        let g = GpuTelemetry { xids: vec![13, 79], ..busy_gpu() };
        let found = judge(&JudgeConfig::default(), &g);
        assert_eq!(found[0].0, SuspectCode::WatchXidFatal);
        assert!(found[0].1.contains("XID 79"), "{found:?}");
        assert!(codes(&GpuTelemetry { xids: vec![13], ..busy_gpu() }).is_empty(), "XID 13 is the application's");
        let hot = GpuTelemetry { throttle: Throttle { hw_thermal: 3, ..Default::default() }, ..busy_gpu() };
        assert_eq!(codes(&hot), vec![SuspectCode::WatchThrottled]);
        let idle = GpuTelemetry { util_pct: vec![Some(0); 5], ..hot.clone() };
        assert!(codes(&idle).is_empty(), "a throttled idle GPU slows nobody");
        let foreign = GpuTelemetry {
            foreign: vec![ForeignProcess { pid: 4242, name: "miner".into(), used_mib: Some(2048) }],
            ..busy_gpu()
        };
        let found = judge(&JudgeConfig::default(), &foreign);
        assert_eq!(found[0].0, SuspectCode::WatchForeignProcess);
        assert!(found[0].1.contains("pid 4242 (miner, 2048 MiB)"), "{found:?}");
        let ecc = GpuTelemetry { counters: Counters { ecc_uncorrected: 1, ..Default::default() }, ..busy_gpu() };
        assert_eq!(codes(&ecc), vec![SuspectCode::WatchCountersRising]);
        let few = GpuTelemetry { counters: Counters { pcie_replay: 3, ..Default::default() }, ..busy_gpu() };
        assert!(codes(&few).is_empty(), "a few replays are normal");
    }
}
