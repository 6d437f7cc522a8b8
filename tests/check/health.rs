//! `gpu-health` through the real binary on CPU workers: not applicable, with its reason, at no
//! cost; its check-params bounded and checked before any worker starts.

use gpusanity_testkit::common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn gpu_health_on_cpu_workers_is_not_applicable_with_its_reason() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(run.command(&["--micro-benchmarks", "gpu-health"]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(r["status"], "passed", "{}", r["summary"]);
    assert!(r["findings"].as_array().unwrap().is_empty(), "{}", r["findings"]);
    let c = &r["checks"][0];
    assert_eq!(c["name"], "gpu-health");
    assert_eq!(c["status"], "not_applicable");
    for rank in c["ranks"].as_array().unwrap() {
        let why = rank["notes"]["not_applicable"].as_str().unwrap();
        assert!(why.starts_with("CPU backend") && why.contains("NVML"), "{why}");
    }
    assert!(c["duration_s"].as_f64().unwrap() < 1.0, "costs nothing on CPU: {}", c["duration_s"]);
    // The configuration it would run with is in the report, its XID table included.
    assert!(c["config"]["fatal_xids"].as_array().unwrap().iter().any(|x| x == 79), "{}", c["config"]);
    assert!(r["summary"].as_str().unwrap().contains("gpu-health (not applicable)"));
    run.assert_nothing_left();
}

#[test]
fn hostile_gpu_health_params_are_refused_before_any_check_runs() {
    let _g = serial();
    let long = format!("gpu-health.fatal-xids={}", "7,".repeat(3000));
    for param in [
        "gpu-health.expected-gpus=0",
        "gpu-health.expected-gpus=18446744073709551616",
        "gpu-health.fatal-xids=79,;rm -rf /",
        "gpu-health.fatal-xids=-1",
        "gpu-health.load-ms=999999999999",
        "gpu-health.sample-ms=0",
        long.as_str(),
    ] {
        let run = Run::new();
        let out = run_with_timeout(run.command(&["--micro-benchmarks", "gpu-health", "--check-param", param]), LIMIT);
        assert_eq!(code(&out), 2, "{param}: {}", stderr(&out));
        assert!(stderr(&out).contains("gpu-health."), "{param}: {}", stderr(&out));
        assert!(!run.report_dir().join("report.json").exists(), "{param}: a check ran");
        run.assert_nothing_left();
    }
    // A good one is taken.
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&["--micro-benchmarks", "gpu-health", "--check-param", "gpu-health.fatal-xids=79,48"]),
        LIMIT,
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(run.report()["checks"][0]["config"]["fatal_xids"], serde_json::json!([48, 79]));
}
