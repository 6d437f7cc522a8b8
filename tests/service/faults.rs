//! The service under faults: an agent killed mid-run, the service itself SIGKILLed mid-run.

use gpusanity_testkit::svc;

use std::time::{Duration, Instant};

use svc::common::tagged_processes;
use svc::{allocated, World};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";

#[test]
fn an_agent_killed_mid_run_fails_the_run_naming_its_node_within_the_deadline() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(FAST, &["k-a", "k-b"]);
    // Rank 0 hangs so the run is still going when node k-b's agent dies.
    let args = "--sanity-check-timeout-per-test=1 --sanity-check-max-time=2 --sanity-check-envs=GPUSANITY_FAULT=hang@0";
    w.allocate("kill-1", "job-kill", args);
    out.wait_for(Duration::from_secs(30), "SanityCheckStarted", |v| v["type"] == "SanityCheckStarted");
    w.wait_for_workers(2);
    let killed = Instant::now();
    w.kill("k-b");
    let failed = out
        .wait_for(Duration::from_secs(30), "CheckFailed", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    let took = killed.elapsed();
    assert_eq!(failed["type"], "CheckFailed", "{failed:#}");
    assert_eq!(failed["faulty_nodes"], serde_json::json!(["k-b"]), "{failed:#}");
    assert!(failed["summary"].as_str().unwrap_or("").contains("k-b"), "{failed:#}");
    // Agent timeout 2 s, beats every 0.3 s: well within the per-test limit of 60 s.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let isolated = out.wait_for(Duration::from_secs(10), "NodeIsolated", |v| v["type"] == "NodeIsolated");
    assert_eq!(isolated["node"], "k-b");
    assert_eq!(isolated["codes"], serde_json::json!(["AGENT_LOST"]));
    let codes = w.sql("SELECT node_name || ':' || code FROM findings WHERE code = 'AGENT_LOST'");
    assert_eq!(codes, ["k-b:AGENT_LOST"]);
    assert_eq!(w.sql("SELECT node_name FROM node_health WHERE healthy = 0"), ["k-b"]);
    // The killed agent's launcher and workers died with it; the other node's were cancelled.
    w.shutdown();
}

#[test]
fn a_job_node_without_an_agent_is_a_finding_naming_it() {
    let _g = svc::common::serial();
    let (mut w, mut out) =
        World::running("agent_timeout_s = 2.0\nagent_wait_s = 3.0\ndeadline_grace_s = 10.0", &["m-a"]);
    w.publish(allocated("miss-1", "job-miss", &["m-a", "m-ghost"], "--sanity-check-max-time=1").as_bytes());
    let failed = out
        .wait_for(Duration::from_secs(30), "CheckFailed", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    assert_eq!(failed["type"], "CheckFailed");
    assert_eq!(failed["faulty_nodes"], serde_json::json!(["m-ghost"]));
    assert!(failed["summary"].as_str().unwrap_or("").contains("no live agent on node(s) m-ghost"), "{failed:#}");
    w.shutdown();
}

#[test]
fn the_service_killed_mid_run_and_restarted_ends_the_run_and_loses_or_duplicates_nothing() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    svc::crash_restart(&mut w);
    w.shutdown();
}

#[test]
fn an_overrun_under_mark_job_fail_fails_the_run_as_timed_out() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(FAST, &["t-a", "t-b"]);
    // Rank 1 (node t-b) hangs in gemm; the per-test limit is 3 s.
    let args =
        "--sanity-check-timeout-per-test=0.05 --sanity-check-max-time=1 --sanity-check-envs=GPUSANITY_FAULT=hang@1";
    w.allocate("to-1", "job-to", args);
    let end = out
        .wait_for(Duration::from_secs(60), "the verdict", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    assert_eq!(end["type"], "CheckFailed", "{end:#}");
    assert_eq!(end["reason"], "timed_out", "{end:#}");
    assert_eq!(end["faulty_nodes"], serde_json::json!(["t-b"]), "{end:#}");
    assert_eq!(w.sql("SELECT state FROM runs"), ["CheckFailed"]);
    assert_eq!(w.sql("SELECT DISTINCT node_name FROM findings WHERE severity = 'critical'"), ["t-b"]);
    w.shutdown();
}

#[test]
fn job_stopped_cancels_the_run_and_its_processes() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(FAST, &["s-a", "s-b"]);
    let args = "--sanity-check-timeout-per-test=1 --sanity-check-max-time=2 --sanity-check-envs=GPUSANITY_FAULT=hang@0";
    w.allocate("stop-1", "job-stop", args);
    out.wait_for(Duration::from_secs(30), "SanityCheckStarted", |v| v["type"] == "SanityCheckStarted");
    w.wait_for_workers(2);
    w.publish(svc::stopped("stop-2", "job-stop").as_bytes());
    let cancelled = out.wait_for(Duration::from_secs(20), "CheckCancelled", |v| v["type"] == "CheckCancelled");
    assert_eq!(cancelled["cause_event_id"], "stop-2");
    assert_eq!(w.sql("SELECT state FROM runs"), ["CheckCancelled"]);
    // The agents stop their launchers and workers; the agents themselves stay.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left: Vec<i32> = tagged_processes(&w.tag)
            .into_iter()
            .map(|(p, _)| p)
            .filter(|p| *p != w.pid("serve") && *p != w.pid("s-a") && *p != w.pid("s-b"))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "launchers or workers left after the cancel: {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    out.drain(Duration::from_secs(1));
    assert!(
        out.of("job-stop", "CheckPassed").is_empty() && out.of("job-stop", "CheckFailed").is_empty(),
        "{:#?}",
        out.seen
    );
    w.shutdown();
}

/// Pids of this world's launchers (`gpusanity check` processes).
fn launchers(w: &World) -> Vec<i32> {
    tagged_processes(&w.tag)
        .into_iter()
        .filter(|(pid, rank)| {
            rank.is_none()
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(b"check".as_slice()))
        })
        .map(|(pid, _)| pid)
        .collect()
}

#[test]
fn the_service_ends_a_run_whose_launchers_never_answer_at_max_time() {
    use nix::sys::signal::{kill, Signal};
    let _g = svc::common::serial();
    let (mut w, mut out) =
        World::running("agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 2.0", &["r-a", "r-b"]);
    // The first check starts 2 s late, so the launchers are frozen mid-run however late the
    // test reads SanityCheckStarted.
    w.allocate("rt-1", "job-rt", "--sanity-check-max-time=0.1 --sanity-check-timeout-per-test=0.1 --sanity-check-envs=GPUSANITY_FAULT=delay-start@0");
    let started = Instant::now();
    out.wait_for(Duration::from_secs(30), "SanityCheckStarted", |v| v["type"] == "SanityCheckStarted");
    w.wait_for_workers(2);
    // Frozen launchers can enforce nothing: the service's own deadline (6 s + 2 s) must act.
    let frozen = launchers(&w);
    assert_eq!(frozen.len(), 2, "launchers: {frozen:?}");
    for p in &frozen {
        kill(nix::unistd::Pid::from_raw(*p), Signal::SIGSTOP).unwrap();
    }
    let end = out
        .wait_for(Duration::from_secs(30), "the verdict", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    let took = started.elapsed();
    for p in &frozen {
        let _ = kill(nix::unistd::Pid::from_raw(*p), Signal::SIGCONT);
    }
    assert_eq!(end["type"], "CheckFailed", "{end:#}");
    assert_eq!(end["reason"], "timed_out", "{end:#}");
    assert!(end["summary"].as_str().unwrap_or("").contains("overran --sanity-check-max-time"), "{end:#}");
    assert!(took >= Duration::from_secs(7) && took < Duration::from_secs(15), "ended after {took:?}");
    // As the launcher names the ranks that did not finish, the service names the nodes whose
    // launchers did not, and isolates them.
    assert_eq!(end["faulty_nodes"], serde_json::json!(["r-a", "r-b"]), "{end:#}");
    assert!(end["summary"].as_str().unwrap_or("").contains("not finished: node(s) r-a, r-b"), "{end:#}");
    let mut codes = w.sql("SELECT code || ' ' || COALESCE(node_name, '-') FROM findings");
    codes.sort();
    assert_eq!(codes, ["RUN_TIMEOUT -", "RUN_UNFINISHED r-a", "RUN_UNFINISHED r-b"]);
    for node in ["r-a", "r-b"] {
        let iso =
            out.wait_for(Duration::from_secs(10), "NodeIsolated", |v| v["type"] == "NodeIsolated" && v["node"] == node);
        assert_eq!(iso["codes"], serde_json::json!(["RUN_UNFINISHED"]), "{iso:#}");
    }
    w.shutdown();
}
