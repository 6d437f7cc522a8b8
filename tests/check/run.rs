//! `gpusanity check` end to end on CPU workers: the report, the hand-over and multi-node runs.

use gpusanity_testkit::common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn default_check_on_two_cpu_workers_passes_with_a_full_report() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(run.command(&[]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(r["schema_version"], 1);
    assert_eq!(r["status"], "passed");
    assert_eq!(r["backend"], "cpu");
    assert_eq!(r["ranks"].as_array().unwrap().len(), 2);
    assert_eq!(r["settings"]["micro_benchmarks"], serde_json::json!(["gemm", "all-reduce", "gpu-health"]));
    assert!(r["findings"].as_array().unwrap().is_empty());
    let checks = r["checks"].as_array().unwrap();
    assert_eq!(checks.len(), 3);
    // The health check of the default set reads NVML on GPU workers only: here it says why not.
    assert_eq!(checks[2]["name"], "gpu-health");
    assert_eq!(checks[2]["status"], "not_applicable");
    assert!(checks[2]["ranks"][0]["notes"]["not_applicable"].as_str().unwrap().starts_with("CPU backend"));
    for rank in checks[0]["ranks"].as_array().unwrap() {
        assert_eq!(rank["status"], "passed");
        assert!(rank["metrics"]["tflops"].as_f64().unwrap() > 0.0);
        assert_eq!(rank["metrics"]["wrong_elements"], 0.0);
    }
    // Identical inputs on every rank give bit-identical products.
    let hashes: Vec<&str> =
        checks[0]["ranks"].as_array().unwrap().iter().map(|r| r["detail"]["result_hash"].as_str().unwrap()).collect();
    assert_eq!(hashes[0], hashes[1]);
    for rank in checks[1]["ranks"].as_array().unwrap() {
        let sweep = rank["sweep"].as_array().unwrap();
        assert!(sweep.len() >= 5, "sweep too short");
        for p in sweep {
            assert_eq!(p["wrong"], 0);
            // 2 ranks: busbw equals algbw (factor 2(n-1)/n = 1).
            let (alg, bus) = (p["algbw_gbps"].as_f64().unwrap(), p["busbw_gbps"].as_f64().unwrap());
            assert!((alg - bus).abs() < 1e-9 && bus > 0.0);
        }
    }
    assert_eq!(run.events(), ["Checking", "CheckPassed"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("verdict: CheckPassed"), "{stdout}");
    run.assert_nothing_left();
}

#[test]
fn two_nodes_on_loopback_pass_and_share_the_verdict() {
    let _g = serial();
    let run = Run::new();
    let port = free_port();
    let n1 = run.spawn_node(&[], 2, 1, port);
    let n0 = run.spawn_node(&[], 2, 0, port);
    let o0 = wait_output(n0, LIMIT);
    let o1 = wait_output(n1, LIMIT);
    assert_eq!(code(&o0), 0, "{}", stderr(&o0));
    assert_eq!(code(&o1), 0, "{}", stderr(&o1));
    let r = run.report();
    assert_eq!(r["nodes"].as_array().unwrap().len(), 2);
    let ranks = r["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 2);
    assert_eq!(ranks[1]["node_rank"], 1);
    assert_eq!(ranks[1]["local_rank"], 0);
    assert_eq!(r["status"], "passed");
    run.assert_nothing_left();
}

#[test]
fn a_pass_hands_over_to_command_and_its_exit_code_comes_out() {
    let _g = serial();
    let run = Run::new();
    // The check envs reach the workers only: COMMAND must not see NCCL_ALGO.
    let mut c =
        run.command(&["--sanity-check-envs=NCCL_ALGO=Ring", "--", "sh", "-c", "test -z \"$NCCL_ALGO\" && exit 42"]);
    c.env_remove("NCCL_ALGO");
    let out = run_with_timeout(c, LIMIT);
    assert_eq!(code(&out), 42, "{}", stderr(&out));
    assert_eq!(run.events(), ["Checking", "CheckPassed", "Running"]);
    run.assert_nothing_left();
}

#[test]
fn check_envs_reach_the_workers() {
    let _g = serial();
    let run = Run::new();
    // The fault switch travels only through --sanity-check-envs, so a failure proves delivery.
    let out = run_with_timeout(
        run.command(&["--test-faults", "--sanity-check-envs=GPUSANITY_FAULT=gemm-wrong@1", "--micro-benchmarks=gemm"]),
        LIMIT,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(findings(&run.report()).contains(&("GEMM_WRONG_RESULT".into(), Some(1))));
}

#[test]
fn after_job_fault_tolerant_skips_a_first_start_and_checks_a_restart() {
    let _g = serial();
    let run = Run::new();
    let args = ["--sanity-check-timing=AfterJobFaultTolerant", "--", "sh", "-c", "exit 7"];
    let out = run_with_timeout(run.command(&args), LIMIT);
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert_eq!(run.events(), ["CheckSkipped", "Running"]);
    assert!(!run.report_dir().join("report.json").exists());

    let run2 = Run::new();
    let mut c = run2.command(&args);
    c.env("TORCHELASTIC_RESTART_COUNT", "1");
    let out = run_with_timeout(c, LIMIT);
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert_eq!(run2.events(), ["Checking", "CheckPassed", "Running"]);
    assert_eq!(run2.report()["status"], "passed");

    // The same settings through one SanityCheckArgs string in the environment, and a restart
    // counter passed by the platform.
    let run3 = Run::new();
    let mut c = run3.command(&["--", "sh", "-c", "exit 8"]);
    c.env("SANITY_CHECK_ARGS", "--sanity-check-timing=AfterJobFaultTolerant --sanity-check-timeout-ops=MarkJobFail");
    c.env("GPUSANITY_RESTART_COUNT", "2");
    let out = run_with_timeout(c, LIMIT);
    assert_eq!(code(&out), 8, "{}", stderr(&out));
    assert_eq!(run3.report()["settings"]["timing"], "AfterJobFaultTolerant");
}

#[test]
fn enable_sanity_check_off_goes_straight_to_command() {
    let _g = serial();
    let run = Run::new();
    let mut c = run.command(&["--", "sh", "-c", "exit 5"]);
    c.env("ENABLE_SANITY_CHECK", "false");
    let out = run_with_timeout(c, LIMIT);
    assert_eq!(code(&out), 5);
    assert_eq!(run.events(), ["CheckSkipped", "Running"]);
}

#[test]
fn list_shows_every_check_of_the_specification() {
    let out = run_with_timeout(
        {
            let mut c = std::process::Command::new(bin());
            c.args(["list", "--json"]);
            c
        },
        LIMIT,
    );
    assert_eq!(code(&out), 0);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v["checks"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    // Every selectable check, in run order, as the registry declares them.
    let listed: Vec<&str> = gpusanity_common::checks::listed().map(|d| d.id.as_str()).collect();
    assert_eq!(names, listed);
    for n in [
        "gemm",
        "all-reduce",
        "kernel-launch",
        "memory-bandwidth",
        "host-bandwidth",
        "rdma-ports",
        "mini-gpt",
        "megatron-gpt",
        "resnet",
        "gpu-health",
    ] {
        assert!(names.contains(&n), "{n}");
    }
    assert_eq!(v["defaults"]["cuda"]["gemm"]["size"], 8192);
}

#[test]
fn a_node_that_never_arrives_is_named_and_the_others_fail_with_it() {
    let _g = serial();
    let run = Run::new();
    let port = free_port();
    // Three nodes, the third never started; the run's own limit (0.2 min) is shorter than the
    // rendezvous timeout, so it decides how long node 0 waits.
    // The job's host list names the missing node.
    let extra = ["--rdzv-timeout=300", "--sanity-check-max-time=0.2", "--node-names=gpu[07-09]"];
    let started = std::time::Instant::now();
    let n1 = run.spawn_node(&extra, 3, 1, port);
    let n0 = run.spawn_node(&extra, 3, 0, port);
    let o0 = wait_output(n0, LIMIT);
    let o1 = wait_output(n1, LIMIT);
    let waited = started.elapsed();
    assert_eq!(code(&o0), 1, "{}", stderr(&o0));
    assert_eq!(code(&o1), 1, "{}", stderr(&o1));
    assert!(stderr(&o1).contains("node(s) 2 never arrived"), "{}", stderr(&o1));
    assert!(waited < Duration::from_secs(40), "named within the run's limit: {waited:?}");
    let r = run.report();
    assert_eq!(r["status"], "failed");
    let f = &r["findings"][0];
    assert_eq!(f["code"], "NODE_MISSING");
    assert_eq!(f["node_rank"], 2);
    assert_eq!(f["host"], "gpu09", "{f}");
    assert!(f["message"].as_str().unwrap().starts_with("node 2 (gpu09) of 3 never arrived"), "{f}");
    assert!(f["evidence"][0].as_str().unwrap().contains("0 ("), "{f}");
    assert_eq!(r["faulty_nodes"].as_array().map(|v| v.len()), Some(1), "{}", r["faulty_nodes"]);
    assert!(r["checks"].as_array().unwrap().iter().all(|c| c["status"] == "not_run"));
    assert_eq!(run.events(), ["Checking", "CheckFailed"]);
    assert!(run.report_dir().join("report.html").exists());
    run.assert_nothing_left();
}
