//! The service end to end on SQLite: a real Kafka broker, `gpusanity serve`, and one
//! `gpusanity agent` process per node running the CPU data plane.

use gpusanity_testkit::svc;

use std::time::{Duration, Instant};

use svc::{allocated, restarted, World, TOKEN};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";

#[test]
fn two_node_job_passes_with_rows_in_the_database() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    svc::two_node_pass(&mut w);
    w.shutdown();
}

#[test]
fn after_job_fault_tolerant_checks_only_the_fault_tolerant_restart() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(FAST, &["ft-a", "ft-b"]);
    let args = "--sanity-check-timing=AfterJobFaultTolerant --micro-benchmarks=all-reduce --sanity-check-max-time=2";
    w.allocate("ft-1", "job-ft", args);
    let skipped = out
        .wait_for(Duration::from_secs(30), "CheckSkipped", |v| v["job_id"] == "job-ft" && v["type"] == "CheckSkipped");
    assert!(skipped["reason"].as_str().unwrap_or("").contains("AfterJobFaultTolerant"), "{skipped:#}");
    w.publish(restarted("ft-2", "job-ft", 1, "Manual").as_bytes());
    out.wait_for(Duration::from_secs(30), "a second CheckSkipped", |v| v["cause_event_id"] == "ft-2");
    assert!(out.of("job-ft", "SanityCheckStarted").is_empty(), "a run started before a fault-tolerant restart");
    assert!(w.sql("SELECT run_id FROM runs").is_empty());

    w.publish(restarted("ft-3", "job-ft", 2, "FaultTolerant").as_bytes());
    let started = out.wait_for(Duration::from_secs(30), "SanityCheckStarted", |v| v["type"] == "SanityCheckStarted");
    assert_eq!(started["cause_event_id"], "ft-3");
    assert_eq!(started["attempt"], 2);
    let end = out
        .wait_for(Duration::from_secs(90), "the verdict", |v| v["type"] == "CheckPassed" || v["type"] == "CheckFailed");
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    w.shutdown();
}

#[test]
fn malformed_events_become_dead_letters_and_consumption_continues() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    w.serve();
    let mut dead = w.reader("dead-letter");
    let mut out = w.reader("check-events");
    w.publish(b"{this is not json");
    w.publish(br#"{"version":1,"type":"JobTeleported","event_id":"x1","job_id":"j","workspace_id":"w"}"#);
    w.publish(allocated("bad-args", "job-bad", &["n1"], "--sanity-check-max-time=-3").as_bytes());
    w.publish(allocated("bad-check", "job-bad2", &["n1"], "--micro-benchmarks=warp-drive").as_bytes());
    w.publish(restarted("orphan", "job-never-seen", 1, "FaultTolerant").as_bytes());
    // A good event after the bad ones is still consumed (no GPUs: skipped with the reason).
    let mut good: serde_json::Value = serde_json::from_str(&allocated("good-1", "job-good", &["n1"], "")).unwrap();
    good["nodes"][0]["gpus"] = 0.into();
    w.publish(good.to_string().as_bytes());

    let skipped = out.wait_for(Duration::from_secs(30), "CheckSkipped", |v| v["job_id"] == "job-good");
    assert!(skipped["reason"].as_str().unwrap_or("").contains("no GPUs"), "{skipped:#}");
    dead.wait_for(Duration::from_secs(30), "five dead letters", |_| true);
    let deadline = Instant::now() + Duration::from_secs(20);
    while dead.seen.len() < 5 {
        assert!(Instant::now() < deadline, "dead letters: {:#?}", dead.seen);
        dead.drain(Duration::from_millis(200));
    }
    let reasons: Vec<String> = dead.seen.iter().map(|d| d["reason"].as_str().unwrap_or("").to_string()).collect();
    assert!(reasons[0].starts_with("not JSON"), "{reasons:?}");
    assert!(reasons[1].contains("unknown event type `JobTeleported`"), "{reasons:?}");
    assert!(
        reasons[2].contains("bad SanityCheckArgs") && reasons[2].contains("--sanity-check-max-time"),
        "{reasons:?}"
    );
    assert!(reasons[3].contains("warp-drive"), "{reasons:?}");
    assert!(reasons[4].contains("never seen"), "{reasons:?}");
    assert_eq!(dead.seen[0]["payload"], "{this is not json");
    assert!(w.sql("SELECT run_id FROM runs").is_empty());
    assert_eq!(w.sql("SELECT event_id FROM job_events"), ["good-1"]);
    w.shutdown();
}

#[test]
fn keep_job_hang_overrun_stays_checking_until_resolved_through_the_api() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(FAST, &["h-a", "h-b"]);
    // Rank 1 hangs in gemm; the per-test limit (3 s) overruns; KeepJobHang holds the run.
    let args = "--sanity-check-timeout-ops=KeepJobHang --sanity-check-timeout-per-test=0.05 --sanity-check-max-time=1 --sanity-check-envs=GPUSANITY_FAULT=hang@1";
    w.allocate("hang-1", "job-hang", args);
    let started = out.wait_for(Duration::from_secs(30), "SanityCheckStarted", |v| v["type"] == "SanityCheckStarted");
    let run_id = started["run_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, v) = w.http_call("GET", &format!("/v1/runs/{run_id}"), Some(TOKEN), None).unwrap();
        if v["run"]["held"] == true {
            assert_eq!(v["run"]["state"], "Checking");
            break;
        }
        assert!(Instant::now() < deadline, "the run was never held: {v:#}\n{}", w.log("serve"));
        std::thread::sleep(Duration::from_millis(200));
    }
    // Held: no verdict is published however long it waits.
    out.drain(Duration::from_secs(3));
    assert!(out.seen.iter().all(|v| v["type"] != "CheckPassed" && v["type"] != "CheckFailed"), "{:#?}", out.seen);

    let path = format!("/v1/runs/{run_id}/resolve");
    assert_eq!(w.http_call("POST", &path, None, Some(r#"{"verdict":"fail"}"#)).unwrap().0, 401);
    assert_eq!(
        w.http_call("POST", &path, Some("wrong-token-0123456789"), Some(r#"{"verdict":"fail"}"#)).unwrap().0,
        401
    );
    assert_eq!(w.http_call("POST", &path, Some(TOKEN), Some(r#"{"verdict":"maybe"}"#)).unwrap().0, 400);
    assert_eq!(
        w.http_call("POST", "/v1/runs/nope/resolve", Some(TOKEN), Some(r#"{"verdict":"fail"}"#)).unwrap().0,
        404
    );
    let (code, v) =
        w.http_call("POST", &path, Some(TOKEN), Some(r#"{"verdict":"fail","note":"GPU 1 replaced"}"#)).unwrap();
    assert_eq!(code, 200, "{v:#}");
    assert_eq!(v["run"]["state"], "CheckFailed");
    let failed = out.wait_for(Duration::from_secs(20), "CheckFailed", |v| v["type"] == "CheckFailed");
    assert_eq!(failed["reason"], "resolved_by_operator");
    assert!(failed["summary"].as_str().unwrap_or("").contains("GPU 1 replaced"));
    // Resolving twice is a conflict, not a second event.
    assert_eq!(w.http_call("POST", &path, Some(TOKEN), Some(r#"{"verdict":"pass"}"#)).unwrap().0, 409);
    out.drain(Duration::from_secs(1));
    assert_eq!(out.of("job-hang", "CheckFailed").len(), 1);
    w.shutdown();
}

#[test]
fn bad_service_configuration_is_one_line_and_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str], token: Option<&str>| {
        let mut c = std::process::Command::new(svc::common::bin());
        c.arg("serve").args(args).env_remove("GPUSANITY_CONFIG").env_remove("GPUSANITY_API_TOKEN");
        if let Some(t) = token {
            c.env("GPUSANITY_API_TOKEN", t);
        }
        svc::common::run_with_timeout(c, Duration::from_secs(20))
    };
    let out = run(&[], None);
    assert_eq!(svc::common::code(&out), 2);
    assert!(svc::common::stderr(&out).contains("no API token"), "{}", svc::common::stderr(&out));
    let out = run(&[], Some("short"));
    assert_eq!(svc::common::code(&out), 2);
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[kafka]\nbootstrapp = \"x\"\n").unwrap();
    let out = run(&["--config", bad.to_str().unwrap()], Some(TOKEN));
    assert_eq!(svc::common::code(&out), 2);
    assert!(svc::common::stderr(&out).contains("unknown field `bootstrapp`"), "{}", svc::common::stderr(&out));
    let out = run(&["--database-url", "mysql://x"], Some(TOKEN));
    assert_eq!(svc::common::code(&out), 2);
    assert!(
        svc::common::stderr(&out).contains("expected sqlite://PATH or postgres://"),
        "{}",
        svc::common::stderr(&out)
    );
    let out = run(&["--config", "/nonexistent/gpusanity.toml"], Some(TOKEN));
    assert_eq!(svc::common::code(&out), 2);
    assert_eq!(svc::common::stderr(&out).lines().count(), 1, "{}", svc::common::stderr(&out));
}
