//! A hang named in seconds: a rank that stops progressing, or a worker that stops beating
//! (SIGSTOP), is named after `diagnosis.stall-s` without waiting for the per-test limit; a slow
//! rank that still progresses is not called hung.

use gpusanity_testkit::common;

use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const LIMIT: Duration = Duration::from_secs(60);

fn hang_evidence(r: &serde_json::Value) -> String {
    r["findings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|f| f["code"] == "TEST_HANG")
        .flat_map(|f| f["evidence"].as_array().cloned().unwrap_or_default())
        .map(|e| e.as_str().unwrap_or("").to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_rank_that_stops_progressing_is_named_after_the_stall_time() {
    let _g = serial();
    let run = Run::new();
    let start = Instant::now();
    // The per-test limit stays at its default (6 min): only the stall can end this in time.
    let out = run_with_timeout(
        run.command(&[
            "--test-faults",
            "--sanity-check-envs=GPUSANITY_FAULT=hang@1",
            "--check-param",
            "diagnosis.stall-s=2",
        ]),
        LIMIT,
    );
    let took = start.elapsed();
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(took < Duration::from_secs(20), "named after {took:?}");
    let r = run.report();
    let f = findings(&r);
    assert!(f.contains(&("TEST_HANG".into(), Some(1))), "{f:?}");
    assert!(!f.iter().any(|(_, rank)| *rank == Some(0)), "rank 0 was only waiting: {f:?}");
    let evidence = hang_evidence(&r);
    assert!(evidence.contains("after 2 s in which no rank progressed"), "{evidence}");
    run.assert_nothing_left();
}

#[test]
fn a_stopped_worker_is_named_by_its_silent_heartbeat() {
    let _g = serial();
    let run = Run::new();
    let mut c = run.command(&["--micro-benchmarks=gemm,all-reduce", "--check-param", "diagnosis.stall-s=2"]);
    c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let start = Instant::now();
    let child = c.spawn().expect("spawn");
    let pid = find_worker(&run.tag, 1, Duration::from_secs(20));
    kill(Pid::from_raw(pid), Signal::SIGSTOP).expect("SIGSTOP");
    let out = wait_output(child, LIMIT);
    let took = start.elapsed();
    assert_ne!(code(&out), 0, "{}", stderr(&out));
    assert!(took < Duration::from_secs(20), "named after {took:?}");
    let r = run.report();
    let f = findings(&r);
    assert!(f.contains(&("TEST_HANG".into(), Some(1))), "{f:?}");
    let evidence = hang_evidence(&r);
    assert!(evidence.contains("rank 1 sent no heartbeat"), "{evidence}");
    run.assert_nothing_left();
}

#[test]
fn a_slow_rank_that_progresses_is_not_called_hung() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&[
            "--test-faults",
            "--sanity-check-envs=GPUSANITY_FAULT=gemm-slow@1",
            "--micro-benchmarks=gemm",
            "--check-param",
            "diagnosis.slow-fraction=0.8",
            "--check-param",
            "diagnosis.stall-s=15",
        ]),
        LIMIT,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(findings(&r), [("GEMM_SLOW".to_string(), Some(1))]);
}
