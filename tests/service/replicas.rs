//! Several replicas of `gpusanity serve` on one PostgreSQL: each job event's run is owned by
//! one replica, a replica killed mid-run has its runs taken over and ended by another, nothing
//! is published or notified twice; SQLite refuses a second replica.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use gpusanity_testkit::svc;
use serde_json::json;
use svc::notify::{Mode, Receiver};
pub use svc::verdicts;
use svc::{allocated, World};

/// Short leases, so takeovers are quick.
pub const REPLICA: &str = "lease_s = 3.0";

/// The replica that owns the most runs in Checking now, and how many.
fn busiest_owner(w: &World) -> (String, usize) {
    let owners = w.sql("SELECT owner FROM runs WHERE state = 'Checking'");
    let mut n: HashMap<String, usize> = HashMap::new();
    for o in owners {
        *n.entry(o).or_default() += 1;
    }
    n.into_iter().max_by_key(|(_, c)| *c).expect("runs in Checking")
}

#[test]
fn two_replicas_end_each_run_once_and_a_killed_one_hands_its_runs_over() {
    let _g = svc::common::serial();
    let url = svc::postgres_database("gpusanity_replicas");
    let mut w = World::new(Some(url), "agent_timeout_s = 5.0\nagent_wait_s = 30.0\ndeadline_grace_s = 30.0");
    w.partitioned(6);
    w.notifier("poll_ms = 100\nbackoff_base_s = 0.2\nbackoff_max_s = 0.5\nwebhook_timeout_s = 2.0");
    w.serve_replica(0, REPLICA);
    w.serve_replica(1, REPLICA);
    w.wait_replicas_ready(&[0, 1], REPLICA);
    let hook = Receiver::start(None, Mode::Ok);
    w.rule(
        "ws-1",
        json!({ "name": "passes", "events": ["CheckPassed"], "channels": [
            { "type": "webhook", "url": hook.url("/passed"), "format": "generic" } ] }),
    );
    for n in ["rp-a", "rp-b"] {
        w.agent(n);
    }
    let mut out = w.reader("check-events");
    let jobs = 8;
    let producer = w.job_producer();
    // Each run's first check starts 2 s late, so the kill below lands mid-run.
    for j in 0..jobs {
        let job = format!("job-rp-{j}");
        let ev = allocated(
            &format!("rp-ev-{j}"),
            &job,
            &["rp-a", "rp-b"],
            "--sanity-check-max-time=2 --sanity-check-envs=GPUSANITY_FAULT=delay-start@0",
        );
        producer.send(&job, &ev);
    }
    let started = Instant::now();
    while out.seen.iter().filter(|v| v["type"] == "SanityCheckStarted").count() < jobs {
        assert!(started.elapsed() < Duration::from_secs(60), "not every run started: {:#?}", out.seen);
        out.drain(Duration::from_millis(100));
    }
    let owners: std::collections::HashSet<String> = w.sql("SELECT owner FROM runs").into_iter().collect();
    assert_eq!(owners.len(), 2, "the consumer group gave both replicas runs: {owners:?}");
    let (victim, held) = busiest_owner(&w);
    let i: usize = victim.trim_start_matches('r').parse().expect("replica id rN");
    w.kill(&format!("serve-{i}"));
    let killed = Instant::now();
    let deadline = Duration::from_secs(90);
    loop {
        let by_job = verdicts(&out.seen);
        if by_job.len() == jobs {
            break;
        }
        assert!(
            killed.elapsed() < deadline,
            "not every run ended: {by_job:?}\nsurvivor's log:\n{}",
            w.log(&format!("serve-{}", 1 - i))
        );
        out.drain(Duration::from_millis(100));
    }
    let took = killed.elapsed();
    out.drain(Duration::from_secs(2));
    let by_job = verdicts(&out.seen);
    for (job, v) in &by_job {
        assert_eq!(v, &["CheckPassed"], "{job}: {v:?}\n{:#?}", out.seen);
    }
    let survivor = w.log(&format!("serve-{}", 1 - i));
    assert!(survivor.contains("taking up a run left in Checking"), "nothing was taken over:\n{survivor}");
    eprintln!(
        "replicas: {} of {jobs} runs owned by r{i} at its kill ({} replicas owned runs); every run ended {:.1} s after",
        held,
        owners.len(),
        took.as_secs_f64()
    );
    // One notification per passed run, whichever replica sent it.
    hook.once_each(jobs, Duration::from_secs(30));
    assert_eq!(w.sql("SELECT COUNT(*) FROM runs WHERE state = 'Checking'"), ["0"]);
    w.shutdown();
}

#[test]
fn a_second_replica_on_one_sqlite_file_is_refused_with_a_clear_message() {
    let _g = svc::common::serial();
    let mut w = World::new(None, "");
    w.serve_replica(0, REPLICA);
    let (config, _) = w.replica_config(1, REPLICA);
    let out = std::process::Command::new(svc::common::bin())
        .args(["serve", "--config"])
        .arg(&config)
        .env("GPUSANITY_API_TOKEN", svc::TOKEN)
        .output()
        .expect("serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("SQLite serves one replica; run several on PostgreSQL"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    w.shutdown();
}
