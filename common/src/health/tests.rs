//! The decisions on readings of a healthy H200 (common/data/health/h200.json) and on bad
//! readings derived from it.

use super::*;
use crate::config::health::GpuHealthConfig;
use crate::findings::Code;
use crate::kinds::Severity;

fn healthy() -> Readings {
    serde_json::from_str(include_str!("../../data/health/h200.json")).expect("the fixture parses")
}

fn policy() -> Policy {
    Policy::from_config(&GpuHealthConfig::default())
}

fn codes(r: &Readings) -> Vec<(Code, Severity)> {
    decide(r, &policy()).into_iter().map(|f| (f.code, f.severity)).collect()
}

fn one(r: &Readings, code: Code, sev: Severity) -> String {
    let found = decide(r, &policy());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].code, found[0].severity), (code, sev), "{found:?}");
    assert!(found[0].action.is_some());
    found[0].message.clone()
}

#[test]
fn a_healthy_h200_has_no_finding_and_round_trips() {
    let r = healthy();
    assert!(codes(&r).is_empty(), "{:?}", codes(&r));
    assert_eq!(r.retired_pages, Read::NotSupported, "not supported is recorded, not an error");
    // The recorded H200 was capped by software power management at the end of its load: recorded, not flagged.
    assert_eq!(r.clock_events.value().map(ClockEvents::names), Some(vec!["sw_power_cap"]));
    let back: Readings = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);
    assert!(census(1, 1).is_none());
}

#[test]
fn an_xid_79_is_fatal_and_others_warn() {
    let mut r = healthy();
    r.xids = Read::Value(vec![XidEvent { xid: 79 }, XidEvent { xid: 79 }]);
    let msg = one(&r, Code::GpuHealthXidFatal, Severity::Critical);
    assert!(msg.contains("79 (GPU has fallen off the bus)"), "{msg}");
    r.xids = Read::Value(vec![XidEvent { xid: 13 }]);
    one(&r, Code::GpuHealthXid, Severity::Warning);
    // The table is configurable: 13 made fatal, 79 not.
    let p = Policy { fatal_xids: vec![13], ..policy() };
    assert_eq!(decide(&r, &p)[0].code, Code::GpuHealthXidFatal);
    // An event set that could not be opened decides nothing.
    r.xids = Read::NotSupported;
    assert!(codes(&r).is_empty());
}

#[test]
fn a_pending_or_failed_remap_and_exhausted_banks() {
    let mut r = healthy();
    r.remapped_rows = Read::Value(RemappedRows { correctable: 0, uncorrectable: 1, pending: true, failure: false });
    let msg = one(&r, Code::GpuHealthRowRemapPending, Severity::Critical);
    assert!(msg.contains("1 uncorrectable"), "{msg}");
    r.remapped_rows = Read::Value(RemappedRows { correctable: 0, uncorrectable: 1, pending: false, failure: true });
    one(&r, Code::GpuHealthRowRemapFailed, Severity::Critical);
    let mut r = healthy();
    r.bank_histogram = Read::Value(BankHistogram { max: 2558, high: 0, partial: 0, low: 1, none: 1 });
    one(&r, Code::GpuHealthBanksExhausted, Severity::Warning);
}

#[test]
fn ecc_errors_and_ecc_off() {
    let mut r = healthy();
    let ecc = |v, a, enabled| {
        Read::Value(Ecc { enabled, volatile_uncorrected: v, aggregate_uncorrected: a, ..Default::default() })
    };
    r.ecc = ecc(2, 2, true);
    one(&r, Code::GpuHealthEccUncorrectable, Severity::Critical);
    r.ecc = ecc(0, 3, true);
    one(&r, Code::GpuHealthEccUncorrectable, Severity::Warning);
    r.ecc = ecc(0, 0, false);
    one(&r, Code::GpuHealthEccDisabled, Severity::Warning);
}

#[test]
fn an_x8_link_is_critical_a_lower_gen_a_warning_replays_warn() {
    let mut r = healthy();
    r.pcie = Read::Value(Pcie { gen: 5, max_gen: 5, width: 8, max_width: 16, replay_delta: Some(0) });
    let msg = one(&r, Code::GpuHealthPcieDegraded, Severity::Critical);
    assert!(msg.contains("x8 of x16"), "{msg}");
    r.pcie = Read::Value(Pcie { gen: 4, max_gen: 5, width: 16, max_width: 16, replay_delta: Some(12) });
    assert_eq!(
        codes(&r),
        [(Code::GpuHealthPcieDegraded, Severity::Warning), (Code::GpuHealthPcieReplays, Severity::Warning)]
    );
}

#[test]
fn a_power_brake_fails_power_capping_does_not() {
    let mut r = healthy();
    r.clock_events = Read::Value(ClockEvents { mask: ClockEvents::HW_SLOWDOWN | ClockEvents::HW_POWER_BRAKE });
    let msg = one(&r, Code::GpuHealthHwSlowdown, Severity::Critical);
    assert!(msg.contains("HW power brake active"), "{msg}");
    // Not active at the end, but the counter rose during the window.
    let mut r = healthy();
    r.clock_event_time.hw_power_brake_ns = Some(250_000_000);
    assert!(one(&r, Code::GpuHealthHwSlowdown, Severity::Critical).contains("for 250 ms"));
    // The software power cap under load is how a GPU runs at its limit: no finding.
    let mut r = healthy();
    r.clock_events = Read::Value(ClockEvents { mask: ClockEvents::SW_POWER_CAP });
    r.clock_event_time.sw_power_cap_ns = Some(300_000_000);
    assert!(codes(&r).is_empty());
    r.clock_event_time.sw_thermal_ns = Some(5_000_000);
    one(&r, Code::GpuHealthSwThermal, Severity::Warning);
}

#[test]
fn a_missing_gpu_is_named_by_the_census() {
    let f = census(7, 8).expect("7 of 8");
    assert_eq!((f.code, f.severity), (Code::GpuHealthMissingGpu, Severity::Critical));
    assert_eq!(f.message, "7 of 8 GPUs visible");
    assert!(census(8, 8).is_none());
    assert!(census(8, 4).is_none(), "more GPUs than workers is fine");
    assert!(census(0, usize::MAX).is_some());
}

#[test]
fn a_hot_gpu_warns_near_slowdown_and_fails_at_it() {
    let mut r = healthy();
    let temp = |gpu_c| Read::Value(Temperature { gpu_c, slowdown_c: Some(87), shutdown_c: None });
    r.temperature = temp(89);
    let msg = one(&r, Code::GpuHealthHot, Severity::Critical);
    assert!(msg.contains("89 C, slowdown at 87 C"), "{msg}");
    r.temperature = temp(83);
    one(&r, Code::GpuHealthHot, Severity::Warning);
    r.temperature = temp(81);
    assert!(codes(&r).is_empty());
}

#[test]
fn slow_clocks_a_lowered_power_limit_nvlink_and_the_recovery_action() {
    let mut r = healthy();
    r.sm_clock = Read::Value(SmClock { under_load_mhz: 900, max_mhz: 1980, samples: 30 });
    one(&r, Code::GpuHealthSmClockLow, Severity::Warning);
    let mut r = healthy();
    r.power = Read::Value(Power { under_load_w: 400.0, enforced_limit_w: 500.0, default_limit_w: Some(700.0) });
    one(&r, Code::GpuHealthPowerCapped, Severity::Warning);
    let mut r = healthy();
    let link = |link, active, replay| NvLink {
        link,
        active,
        crc_flit_delta: Some(0),
        crc_data_delta: Some(0),
        replay_delta: Some(replay),
        recovery_delta: Some(0),
    };
    // No link up at all: no NVLink fabric here, nothing to judge.
    r.nvlink = Read::Value(vec![link(0, false, 0), link(1, false, 0)]);
    assert!(codes(&r).is_empty());
    r.nvlink = Read::Value(vec![link(0, true, 0), link(1, false, 0)]);
    assert!(one(&r, Code::GpuHealthNvlinkDown, Severity::Critical).contains("NVLink 1 down, 1 up"));
    r.nvlink = Read::Value(vec![link(0, true, 4), link(1, true, 0)]);
    assert!(one(&r, Code::GpuHealthNvlinkErrors, Severity::Warning).contains("link 0: 4 replay"));
    let mut r = healthy();
    r.recovery_action = Read::Value(1);
    assert!(one(&r, Code::GpuHealthRecoveryAction, Severity::Critical).contains("GPU reset"));
    r.recovery_action = Read::NotSupported;
    assert!(codes(&r).is_empty(), "an older driver without the field decides nothing");
}

#[test]
fn the_nvml_missing_finding_is_a_warning() {
    let f = nvml_unavailable("libnvidia-ml.so.1: cannot open shared object file");
    assert_eq!((f.code, f.severity), (Code::GpuHealthNvmlUnavailable, Severity::Warning));
}
