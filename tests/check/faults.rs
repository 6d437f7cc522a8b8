//! Faults and bad input through the real binary: each names the rank and the check, ends with
//! the documented exit code, and leaves no process behind.

use gpusanity_testkit::common;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const LIMIT: Duration = Duration::from_secs(90);

/// The launcher's log filter for where each rank is: its supervisor's debug lines ("check
/// started", "check done", per rank and check) beside the warnings.
const RANKS_LOG: &str = "warn,gpusanity_executor::launcher::supervise=debug";

/// Whether `line` of the launcher's log says `event` ("check started", "check done") of
/// `check` on `rank`.
fn says(line: &str, event: &str, rank: u64, check: &str) -> bool {
    let (rank, check) = (format!("rank={rank}"), format!("check={check}"));
    line.contains(event) && line.split_whitespace().any(|w| w == rank) && line.split_whitespace().any(|w| w == check)
}

#[test]
fn a_worker_stopped_with_sigstop_ends_the_run_at_the_per_test_timeout_naming_its_rank() {
    let _g = serial();
    let run = Run::new();
    // A long GEMM loop (about a minute) and a 4.8 s per-test timeout.
    let mut cmd = run.command(&[
        "--micro-benchmarks=gemm,all-reduce",
        "--sanity-check-timeout-per-test=0.08",
        "--check-param",
        "gemm.iters=100000",
        "--check-param",
        "gemm.size=256",
    ]);
    cmd.env("GPUSANITY_LOG", RANKS_LOG);
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().unwrap();
    let err = Stderr::take(&mut child);
    let pid = find_worker(&run.tag, 1, Duration::from_secs(20));
    // Stopped once it is in its GEMM loop.
    err.wait_line(Duration::from_secs(30), "rank 1 starting gemm", |l| says(l, "check started", 1, "gemm"));
    kill(Pid::from_raw(pid), Signal::SIGSTOP).unwrap();
    let out = wait_output(child, LIMIT);
    let took = start.elapsed();
    assert_eq!(code(&out), 3, "{}", err.finish());
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let r = run.report();
    assert_eq!(r["status"], "timed_out");
    assert_eq!(r["checks"][0]["status"], "timed_out");
    assert_eq!(r["checks"][1]["status"], "not_run");
    let f = findings(&r);
    assert!(f.contains(&("TEST_HANG".into(), Some(1))), "{f:?}");
    assert!(!f.iter().any(|(_, rank)| *rank == Some(0)), "rank 0 was only waiting: {f:?}");
    assert_eq!(run.events(), ["Checking", "CheckFailed"]);
    run.assert_nothing_left();
}

#[test]
fn mark_job_fail_ends_an_overrun_with_the_timeout_exit_code() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&[
            "--test-faults",
            "--sanity-check-envs=GPUSANITY_FAULT=hang@0",
            "--sanity-check-timeout-per-test=0.05",
            "--",
            "sh",
            "-c",
            "exit 9",
        ]),
        LIMIT,
    );
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    let r = run.report();
    // The hung rank is alive (heartbeats go on) but made the least progress.
    assert!(findings(&r).contains(&("TEST_HANG".into(), Some(0))), "{:?}", findings(&r));
    assert_eq!(run.events(), ["Checking", "CheckFailed"]);
    run.assert_nothing_left();
}

#[test]
fn keep_job_hang_stays_in_checking_until_sigterm() {
    let _g = serial();
    let run = Run::new();
    let mut cmd = run.command(&[
        "--test-faults",
        "--sanity-check-envs=GPUSANITY_FAULT=hang@1",
        "--sanity-check-timeout-per-test=0.05",
        "--sanity-check-timeout-ops=KeepJobHang",
        "--",
        "sh",
        "-c",
        "exit 0",
    ]);
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let err = Stderr::take(&mut child);
    // Said once the report is written, where the launcher would otherwise have exited.
    err.wait_line(LIMIT, "the hold", |l| l.contains("staying in Checking until SIGTERM"));
    assert!(child.try_wait().unwrap().is_none(), "the launcher must stay alive under KeepJobHang");
    assert_eq!(run.events(), ["Checking"]);
    assert_eq!(run.report()["status"], "timed_out");
    // The hung workers are already gone: only the launcher holds.
    let left = tagged_processes(&run.tag);
    assert!(left.iter().all(|(_, rank)| rank.is_none()), "{left:?}");
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let out = wait_output(child, Duration::from_secs(10));
    assert_eq!(code(&out), 3, "{}", err.finish());
    assert_eq!(run.events(), ["Checking", "CheckFailed"]);
    run.assert_nothing_left();
}

#[test]
fn a_crashed_worker_is_named_with_its_exit_status() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&["--test-faults", "--sanity-check-envs=GPUSANITY_FAULT=exit@1", "--", "touch", "started"]),
        LIMIT,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    let crash =
        r["findings"].as_array().unwrap().iter().find(|f| f["code"] == "WORKER_CRASHED").expect("crash finding");
    assert_eq!(crash["rank"], 1);
    assert!(crash["message"].as_str().unwrap().contains("exited with status 17"), "{crash}");
    assert!(!std::path::Path::new("started").exists(), "COMMAND must not start after a failure");
    run.assert_nothing_left();
}

#[test]
fn wrong_all_reduce_results_are_counted_and_named() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&[
            "--test-faults",
            "--sanity-check-envs=GPUSANITY_FAULT=all-reduce-wrong@0",
            "--micro-benchmarks=all-reduce",
        ]),
        LIMIT,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(findings(&r), [("ALLREDUCE_WRONG_RESULT".to_string(), Some(0))]);
    let wrong = r["checks"][0]["ranks"][0]["metrics"]["wrong_elements"].as_f64().unwrap();
    assert!(wrong >= 1.0);
    assert_eq!(r["checks"][0]["ranks"][1]["metrics"]["wrong_elements"], 0.0);
}

#[test]
fn a_slow_rank_is_named_in_gemm() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&[
            "--test-faults",
            "--sanity-check-envs=GPUSANITY_FAULT=gemm-slow@1",
            "--micro-benchmarks=gemm",
            "--check-param",
            "diagnosis.slow-fraction=0.8",
        ]),
        LIMIT,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let f = findings(&run.report());
    assert_eq!(f, [("GEMM_SLOW".to_string(), Some(1))]);
}

fn usage_error(args: &[&str], env: &[(&str, &str)], want: &str) {
    let run = Run::new();
    let mut c = run.command(args);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = run_with_timeout(c, Duration::from_secs(30));
    let err = stderr(&out);
    assert_eq!(code(&out), 2, "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: want `{want}` in {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(!run.report_dir().join("report.json").exists());
    run.assert_nothing_left();
}

#[test]
fn bad_input_is_one_clear_line_and_exit_code_2() {
    let _g = serial();
    usage_error(&["--micro-benchmarks=gemm,teleport"], &[], "unknown check `teleport`");
    usage_error(&["--model-benchmarks=gemm"], &[], "unknown check `gemm` in --model-benchmarks");
    usage_error(&["--sanity-check-max-time=-5"], &[], "positive number of minutes");
    usage_error(&["--sanity-check-timeout-per-test=0"], &[], "positive number of minutes");
    usage_error(&["--sanity-check-timing=Whenever"], &[], "--sanity-check-timing");
    usage_error(&["--sanity-check-timeout-ops=Shrug"], &[], "--sanity-check-timeout-ops");
    usage_error(&["--sanity-check-envs=A=1,=2"], &[], "KEY=VALUE");
    usage_error(&[], &[("SANITY_CHECK_ARGS", "--sanity-check-timing='Before")], "unbalanced quotes");
    usage_error(&[], &[("SANITY_CHECK_ARGS", "--no-such-option=1")], "unknown option");
    usage_error(&["--check-param", "gemm.size=-1"], &[], "gemm.size");
    usage_error(&["--nproc-per-node=0"], &[], "at least 1");
    usage_error(&["--micro-benchmarks=gemm,gemm"], &[], "check `gemm` is listed twice in --micro-benchmarks");
    usage_error(&["--check-param", "gemm.size=4294967296"], &[], "gemm.size: a positive integer up to 65536");
    usage_error(&["--check-param", "all-reduce.max-bytes=18446744073709551615"], &[], "up to 1099511627776");
    usage_error(&["--rdzv-timeout=1e20"], &[], "at most 86400");
    usage_error(&["--nproc-per-node=1000"], &[], "more CPU workers than this node can run");
    usage_error(&["--nnodes=2", "--node-rank=3"], &[], "not below");
    let port = free_port().to_string();
    usage_error(
        &["--nnodes=2", "--node-rank=1", "--master-addr=127.0.0.1", "--master-port", &port, "--rdzv-timeout=1"],
        &[],
        "cannot reach the rendezvous",
    );
}

#[test]
fn the_whole_run_max_time_is_enforced() {
    let _g = serial();
    let run = Run::new();
    let start = Instant::now();
    let out = run_with_timeout(
        run.command(&[
            "--sanity-check-max-time=0.05",
            "--check-param",
            "gemm.iters=100000",
            "--check-param",
            "gemm.size=256",
        ]),
        LIMIT,
    );
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(start.elapsed() < Duration::from_secs(20));
    let r = run.report();
    assert_eq!(r["status"], "timed_out");
    assert_eq!(r["checks"][0]["status"], "timed_out");
    // Every rank was alive and working: the run is named, no rank is blamed.
    assert_eq!(findings(&r), [("RUN_TIMEOUT".to_string(), None)]);
    run.assert_nothing_left();
}

#[test]
fn sigterm_during_checks_stops_the_workers_and_keeps_what_was_measured() {
    let _g = serial();
    let run = Run::new();
    let mut cmd = run.command(&[
        "--micro-benchmarks=all-reduce,gemm",
        "--check-param",
        "gemm.iters=100000",
        "--check-param",
        "gemm.size=256",
        "--",
        "touch",
        "started",
    ]);
    cmd.env("GPUSANITY_LOG", RANKS_LOG);
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let err = Stderr::take(&mut child);
    // Until all-reduce is done and gemm runs, on both ranks.
    for rank in [0, 1] {
        err.wait_line(LIMIT, "all-reduce done", |l| says(l, "check done", rank, "all-reduce"));
        err.wait_line(LIMIT, "gemm started", |l| says(l, "check started", rank, "gemm"));
    }
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let out = wait_output(child, Duration::from_secs(30));
    assert_eq!(code(&out), 1, "{}", err.finish());
    let r = run.report();
    assert_eq!(r["status"], "failed");
    assert_eq!(r["checks"][0]["status"], "passed", "all-reduce was measured before the signal");
    assert!(r["checks"][0]["ranks"][0]["metrics"]["busbw_gbps"].as_f64().unwrap() > 0.0);
    assert_ne!(r["checks"][1]["status"], "passed");
    assert_eq!(findings(&r), [("RUN_INTERRUPTED".to_string(), None)]);
    assert!(!std::path::Path::new("started").exists());
    run.assert_nothing_left();
}

#[test]
fn a_crash_on_one_node_stops_the_other_at_once_and_only_the_crashed_rank_is_named() {
    let _g = serial();
    let run = Run::new();
    let port = free_port();
    let extra = ["--test-faults", "--sanity-check-envs=GPUSANITY_FAULT=exit@1", "--micro-benchmarks=all-reduce,gemm"];
    let start = Instant::now();
    let n1 = run.spawn_node(&extra, 2, 1, port);
    let n0 = run.spawn_node(&extra, 2, 0, port);
    let o0 = wait_output(n0, LIMIT);
    let o1 = wait_output(n1, LIMIT);
    assert!(start.elapsed() < Duration::from_secs(30), "took {:?}", start.elapsed());
    assert_eq!(code(&o0), 1, "{}", stderr(&o0));
    assert_eq!(code(&o1), 1, "{}", stderr(&o1));
    let r = run.report();
    let critical: Vec<_> = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] == "critical")
        .map(|f| (f["code"].as_str().unwrap().to_string(), f["rank"].as_u64()))
        .collect();
    assert_eq!(critical, [("WORKER_CRASHED".to_string(), Some(1))]);
    assert_eq!(r["checks"][1]["status"], "not_run");
    run.assert_nothing_left();
}
