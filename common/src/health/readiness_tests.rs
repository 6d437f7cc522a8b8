//! The readiness decisions on the H200 fixture (common/data/health/h200.json) with the
//! processes and settings of the cases met on a node: the check's own worker alone, a leftover
//! holding most of the memory, a co-running matmul, and settings that break or slow a job.

use super::readiness::{leftovers, settings, version_below, Fabric, Mps};
use super::*;
use crate::config::health::GpuHealthConfig;
use crate::kinds::Severity;

const OWN: u32 = 4242;

fn process(pid: u32, name: &str, used_mib: u64, sm_util: Option<u32>) -> GpuProcess {
    GpuProcess { pid, name: Some(name.into()), used_mib: Some(used_mib), kind: "compute".into(), sm_util }
}

/// The fixture as the check reads it on a clean node: its own worker (pid [`OWN`]) holding its
/// GEMM's memory and computing, and an H200's settings.
fn clean() -> Readings {
    let mut r: Readings = serde_json::from_str(include_str!("../../data/health/h200.json")).unwrap();
    r.processes = Read::Value(vec![process(OWN, "gpusanity", 1_650, Some(97))]);
    r.settings = GpuSettings {
        compute_mode: Some("default".into()),
        mig_enabled: Some(false),
        mig_pending: Some(false),
        ecc_pending: Some(true),
        app_sm_mhz: Some(1980),
        default_app_sm_mhz: Some(1980),
        persistence: Some(true),
        p0_max_sm_mhz: Some(1980),
        max_sm_mhz: Some(1980),
        mps: Some(Mps { pipe_dir: "/tmp/nvidia-mps".into(), control: false, daemons: Vec::new() }),
        fabric: Some(Fabric { state: "completed".into(), status: 0 }),
    };
    r
}

#[test]
fn an_nvswitch_fabric_that_is_not_ready_fails_the_gpu_by_policy() {
    let mut r = clean();
    for (state, status) in [("in_progress", 0), ("not_started", 0), ("completed", 999)] {
        r.settings.fabric = Some(Fabric { state: state.into(), status });
        let got = judge(&r, &ready());
        assert_eq!(got.len(), 1, "{state}: {got:?}");
        assert_eq!((got[0].0.as_str(), got[0].1), ("GPU_HEALTH_FABRIC_NOT_READY", Severity::Critical));
    }
    let warn = Readiness { fabric: crate::host::Level::Warning, ..ready() };
    assert_eq!(judge(&r, &warn)[0].1, Severity::Warning);
    for none in [None, Some(Fabric { state: "not_supported".into(), status: 0 })] {
        r.settings.fabric = none;
        assert_eq!(judge(&r, &ready()), []);
    }
}

fn ready() -> Readiness {
    Readiness::from_config(&GpuHealthConfig::default())
}

fn judge(r: &Readings, policy: &Readiness) -> Vec<(String, Severity, String)> {
    leftovers(r, &[OWN], policy)
        .into_iter()
        .chain(settings(r, &[OWN], policy))
        .map(|f| (f.code.to_string(), f.severity, f.message))
        .collect()
}

#[test]
fn the_checks_own_worker_on_a_clean_h200_is_no_finding_and_old_records_still_parse() {
    assert_eq!(judge(&clean(), &ready()), []);
    // A record without the new readings (the fixture as recorded) decides nothing new.
    let old: Readings = serde_json::from_str(include_str!("../../data/health/h200.json")).unwrap();
    assert_eq!(old.processes, Read::NotSupported);
    assert_eq!(judge(&old, &ready()), []);
    let back: Readings = serde_json::from_str(&serde_json::to_string(&clean()).unwrap()).unwrap();
    assert_eq!(back, clean());
}

#[test]
fn a_leftover_holding_most_of_the_memory_fails_the_gpu_naming_it() {
    let mut r = clean();
    if let Read::Value(ps) = &mut r.processes {
        ps.push(process(777, "python3", 133_120, Some(0)));
    }
    let found = judge(&r, &ready());
    assert_eq!(found.len(), 1, "{found:?}");
    let (code, sev, msg) = &found[0];
    assert_eq!((code.as_str(), *sev), ("GPU_HEALTH_LEFTOVER_MEMORY", Severity::Critical));
    assert!(msg.contains("133120 MiB held") && msg.contains("pid 777 (python3"), "{msg}");
    assert!(!msg.contains("4242"), "the check's own worker is not a leftover: {msg}");
    // The share is the operator's: above it the same process is only reported.
    let lenient = Readiness { leftover_memory_mib: 200_000, ..ready() };
    let found = judge(&r, &lenient);
    assert_eq!(
        found.iter().map(|f| (f.0.as_str(), f.1)).collect::<Vec<_>>(),
        [("GPU_HEALTH_OTHER_PROCESS", Severity::Warning)]
    );
}

#[test]
fn a_process_computing_beside_the_check_is_named_as_such() {
    let mut r = clean();
    if let Read::Value(ps) = &mut r.processes {
        ps.push(process(888, "python3", 900, Some(64)));
    }
    let found = judge(&r, &ready());
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!((found[0].0.as_str(), found[0].1), ("GPU_HEALTH_FOREIGN_COMPUTE", Severity::Critical));
    assert!(found[0].2.contains("pid 888 (python3, compute, 900 MiB, SM 64%)"), "{}", found[0].2);
    let warns = Readiness { foreign_compute: Severity::Warning, ..ready() };
    assert_eq!(judge(&r, &warns)[0].1, Severity::Warning);
}

#[test]
fn settings_that_break_or_slow_a_job_are_each_named() {
    let mut r = clean();
    if let Read::Value(ps) = &mut r.processes {
        ps.push(process(999, "Xorg", 20, None));
    }
    r.settings = GpuSettings {
        compute_mode: Some("exclusive_process".into()),
        mig_enabled: Some(true),
        mig_pending: Some(true),
        ecc_pending: Some(false),
        app_sm_mhz: Some(1200),
        default_app_sm_mhz: Some(1980),
        persistence: Some(false),
        ..Default::default()
    };
    let policy = Readiness { min_driver: Some("590.1".into()), ..ready() };
    let got: Vec<(String, Severity)> = judge(&r, &policy).into_iter().map(|(c, s, _)| (c, s)).collect();
    let want = [
        ("GPU_HEALTH_OTHER_PROCESS", Severity::Warning),
        ("GPU_HEALTH_COMPUTE_MODE", Severity::Critical),
        ("GPU_HEALTH_MIG_ENABLED", Severity::Critical),
        ("GPU_HEALTH_ECC_PENDING", Severity::Warning),
        ("GPU_HEALTH_APP_CLOCKS_LOW", Severity::Warning),
        ("GPU_HEALTH_PERSISTENCE_OFF", Severity::Warning),
        ("GPU_HEALTH_DRIVER_OLD", Severity::Critical),
    ];
    assert_eq!(got, want.map(|(c, s)| (c.to_string(), s)));
    // Exclusive_Process alone (only the check's worker), MIG asked for, a pending MIG change.
    let mut r = clean();
    r.settings.compute_mode = Some("exclusive_process".into());
    r.settings.mig_pending = Some(true);
    let got: Vec<String> = judge(&r, &ready()).into_iter().map(|f| f.0).collect();
    assert_eq!(got, ["GPU_HEALTH_MIG_PENDING"]);
    r.settings.compute_mode = Some("prohibited".into());
    assert_eq!(judge(&r, &ready())[0].0, "GPU_HEALTH_COMPUTE_MODE");
    r = clean();
    r.settings.mig_enabled = Some(true);
    r.settings.mig_pending = Some(true);
    assert_eq!(judge(&r, &Readiness { allow_mig: true, ..ready() }), []);
}

#[test]
fn driver_versions_compare_number_by_number() {
    assert!(version_below("580.65.06", "580.82"));
    assert!(!version_below("580.159.04", "580.82"));
    assert!(!version_below("580.82", "580.82.0"));
    assert!(version_below("99", "580"));
    assert!(!version_below("garbage", "0"));
}

#[test]
fn locked_sm_clocks_are_a_warning_unless_the_operator_allows_them() {
    let mut r = clean();
    r.settings.p0_max_sm_mhz = Some(1200);
    let found = judge(&r, &ready());
    assert_eq!(found.len(), 1, "{found:?}");
    let (code, sev, msg) = &found[0];
    assert_eq!((code.as_str(), *sev), ("GPU_HEALTH_CLOCKS_LOCKED", Severity::Warning));
    assert!(msg.contains("1200 MHz") && msg.contains("1980 MHz") && msg.contains(&r.pci_bus_id), "{msg}");
    assert_eq!(judge(&r, &Readiness { allow_locked_clocks: true, ..ready() }), []);
}

#[test]
fn a_clock_setting_holding_the_gpu_below_its_maximum_under_load_is_read_as_locked_clocks() {
    let mut r = clean();
    // P0's range not readable; NVML's applications-clocks-setting event under load, below the
    // maximum, with the application clocks at their default.
    r.settings.p0_max_sm_mhz = None;
    r.clock_events = Read::Value(ClockEvents { mask: ClockEvents::APPLICATIONS_CLOCKS });
    if let Read::Value(c) = &mut r.sm_clock {
        c.under_load_mhz = 1410;
    }
    let found = judge(&r, &ready());
    let codes: Vec<&str> = found.iter().map(|f| f.0.as_str()).collect();
    assert!(codes.contains(&"GPU_HEALTH_CLOCKS_LOCKED"), "{found:?}");
    // At its maximum, the same event is nothing; with low application clocks, those are named.
    if let Read::Value(c) = &mut r.sm_clock {
        c.under_load_mhz = 1980;
    }
    assert!(!judge(&r, &ready()).iter().any(|f| f.0 == "GPU_HEALTH_CLOCKS_LOCKED"));
    r.settings.app_sm_mhz = Some(1200);
    if let Read::Value(c) = &mut r.sm_clock {
        c.under_load_mhz = 1200;
    }
    let codes: Vec<String> = judge(&r, &ready()).into_iter().map(|f| f.0).collect();
    assert_eq!(codes, ["GPU_HEALTH_APP_CLOCKS_LOW"]);
}

#[test]
fn an_mps_daemon_on_the_node_fails_the_gpu_unless_the_job_runs_under_mps() {
    let mut r = clean();
    r.settings.mps = Some(Mps {
        pipe_dir: "/tmp/nvidia-mps".into(),
        control: true,
        daemons: vec![(3131, "nvidia-cuda-mps-control".into())],
    });
    let found = judge(&r, &ready());
    assert_eq!(found.len(), 1, "{found:?}");
    let (code, sev, msg) = &found[0];
    assert_eq!((code.as_str(), *sev), ("GPU_HEALTH_MPS_ACTIVE", Severity::Critical));
    assert!(msg.contains("/tmp/nvidia-mps") && msg.contains("pid 3131 (nvidia-cuda-mps-control)"), "{msg}");
    assert_eq!(judge(&r, &Readiness { allow_mps: true, ..ready() }), []);
    // The socket alone (a daemon in another process namespace) is enough.
    r.settings.mps = Some(Mps { pipe_dir: "/run/mps".into(), control: true, daemons: Vec::new() });
    assert_eq!(judge(&r, &ready()).len(), 1);
}
