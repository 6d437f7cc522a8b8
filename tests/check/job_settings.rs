//! What a job's settings may ask of `gpusanity check`: environment variables through the
//! operator's allowlist only, never the loader's or gpusanity's own, and test faults only when
//! the operator's command line enables them; sizes that cannot fit in memory.

use gpusanity_testkit::common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);
const QUICK: [&str; 3] = ["--micro-benchmarks=gemm", "--check-param", "gemm.size=128"];

fn check(extra: &[&str]) -> (std::process::Output, Run) {
    let run = Run::new();
    let mut args = QUICK.to_vec();
    args.extend_from_slice(extra);
    let out = run_with_timeout(run.command(&args), LIMIT);
    (out, run)
}

#[test]
fn loader_plugin_and_own_variables_are_refused_with_exit_2() {
    let _g = serial();
    for (env, why) in [
        ("LD_PRELOAD=./evil.so", "may not set LD_PRELOAD"),
        ("NCCL_NET_PLUGIN=/tmp/x.so", "may not set NCCL_NET_PLUGIN"),
        ("NCCL_DEBUG_FILE=/etc/passwd", "may not set NCCL_DEBUG_FILE"),
        ("GPUSANITY_WORKER_SPEC={}", "may not set GPUSANITY_WORKER_SPEC"),
        ("HTTP_PROXY=http://x", "not in the operator's allowlist"),
        ("GPUSANITY_FAULT=gemm-wrong@0", "fault injection is off"),
    ] {
        let (out, run) = check(&[&format!("--sanity-check-envs={env}")]);
        assert_eq!(code(&out), 2, "{env}: {}", stderr(&out));
        assert!(stderr(&out).contains(why), "{env}: {}", stderr(&out));
        assert!(!run.report_dir().join("report.json").exists(), "{env}: a check ran");
    }
    // Even an allowlist of everything keeps the denylist.
    let (out, _) = check(&["--allow-env=*", "--sanity-check-envs=LD_AUDIT=./evil.so"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

#[test]
fn the_operator_allowlist_replaces_the_defaults() {
    let _g = serial();
    let (out, _) = check(&["--sanity-check-envs=NCCL_ALGO=Ring,OMP_NUM_THREADS=1"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let (out, _) = check(&["--allow-env=UCX_TLS", "--sanity-check-envs=UCX_TLS=rc"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let (out, _) = check(&["--allow-env=UCX_TLS", "--sanity-check-envs=NCCL_ALGO=Ring"]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
}

#[test]
fn a_fault_in_the_launchers_environment_reaches_the_workers_only_with_test_faults() {
    let _g = serial();
    let run = Run::new();
    let mut c = run.command(&QUICK);
    c.env("GPUSANITY_FAULT", "gemm-wrong@0");
    let out = run_with_timeout(c, LIMIT);
    assert_eq!(code(&out), 0, "the fault was not removed: {}", stderr(&out));
    let run = Run::new();
    let mut args = QUICK.to_vec();
    args.push("--test-faults");
    let mut c = run.command(&args);
    c.env("GPUSANITY_FAULT", "gemm-wrong@0");
    let out = run_with_timeout(c, LIMIT);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
}

#[test]
fn a_fault_in_another_node_s_launcher_environment_is_named_in_node_0_s_report() {
    let _g = serial();
    let run = Run::new();
    let port = free_port();
    let node = |rank: &str, fault: Option<&str>| {
        let mut args = QUICK.to_vec();
        let p = port.to_string();
        args.extend(["--test-faults", "--nnodes", "2", "--node-rank", rank, "--nproc-per-node", "1"]);
        args.extend(["--master-addr", "127.0.0.1", "--master-port", &p]);
        let mut c = run.command(&args);
        c.env_remove("GPUSANITY_FAULT");
        // Paced devices (`GPUSANITY_TEST_PACE`, 1 GFLOP/s: 4.2 ms a product of 128^3): the
        // run's verdict is not this test's subject, and a CPU worker descheduled for a whole
        // window on a busy host is judged slow against its peer.
        c.env(gpusanity_common::envs::PACE_ENV, "1000");
        if let Some(f) = fault {
            c.env("GPUSANITY_FAULT", f);
        }
        c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        c.spawn().expect("spawn gpusanity")
    };
    // 5% more products on node 1's rank: a run that passes, and must not teach a baseline.
    let n1 = node("1", Some("gemm-extra-5@1"));
    let n0 = node("0", None);
    let (o0, o1) = (wait_output(n0, LIMIT), wait_output(n1, LIMIT));
    assert_eq!((code(&o0), code(&o1)), (0, 0), "{}\n{}", stderr(&o0), stderr(&o1));
    let r = run.report();
    let envs = r["settings"]["envs"].as_array().expect("envs").clone();
    assert!(
        envs.contains(&serde_json::json!(["GPUSANITY_FAULT", "node1:gemm-extra-5@1"])),
        "node 1's fault is not in node 0's report: {envs:?}"
    );
    run.assert_nothing_left();
}

#[test]
fn the_paced_device_of_the_test_rigs_needs_test_faults_and_a_job_cannot_ask_for_it() {
    let _g = serial();
    let pace = gpusanity_common::envs::PACE_ENV;
    let run_with = |test_faults: bool| {
        let run = Run::new();
        let mut args = QUICK.to_vec();
        if test_faults {
            args.push("--test-faults");
        }
        let mut c = run.command(&args);
        c.env(pace, "1000");
        let out = run_with_timeout(c, LIMIT);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        let r = run.report();
        let device = r["ranks"][0]["device"].as_str().unwrap_or_default().to_string();
        let tflops = r["checks"][0]["ranks"][0]["metrics"]["tflops"].as_f64().unwrap_or(0.0);
        run.assert_nothing_left();
        (device, tflops)
    };
    // In the launcher's environment without --test-faults: removed from its workers'.
    let (device, _) = run_with(false);
    assert!(!device.contains("paced"), "{device}");
    // With it: a device of its own name, at the pace (1 GFLOP/s, the noise of an H200's runs).
    let (device, tflops) = run_with(true);
    assert!(device.ends_with(" (paced)"), "{device}");
    assert!((0.00090..0.00110).contains(&tflops), "{tflops} TFLOP/s");
    // A job's settings can never set it, test faults or not.
    for extra in [vec![], vec!["--test-faults"]] {
        let env = format!("--sanity-check-envs={pace}=1000");
        let mut args = extra.clone();
        args.push(&env);
        let (out, run) = check(&args);
        assert_eq!(code(&out), 2, "{extra:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(&format!("may not set {pace}")), "{}", stderr(&out));
        run.assert_nothing_left();
    }
}

#[test]
fn sizes_that_do_not_fit_in_memory_are_refused_up_front_with_what_they_need() {
    let _g = serial();
    for (param, check) in
        [("gemm.size=65536", "gemm needs"), ("all-reduce.max-bytes=1099511627776", "all-reduce needs")]
    {
        let run = Run::new();
        let out = run_with_timeout(run.command(&["--micro-benchmarks=gemm,all-reduce", "--check-param", param]), LIMIT);
        assert_eq!(code(&out), 2, "{param}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(check) && err.contains("GiB of host memory") && err.contains("available"), "{err}");
        assert!(!run.report_dir().join("report.json").exists(), "{param}: a check ran");
        run.assert_nothing_left();
    }
}
