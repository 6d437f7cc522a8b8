//! Job events for the tests, and the 2-node pass that runs on SQLite and on PostgreSQL.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{Reader, World, TOKEN};

/// Every event id once; (verdicts by job, with their types).
pub fn verdicts(seen: &[Value]) -> HashMap<String, Vec<String>> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for v in seen {
        *ids.entry(v["event_id"].as_str().unwrap_or("")).or_default() += 1;
    }
    let twice: Vec<&&str> = ids.iter().filter(|(_, n)| **n > 1).map(|(id, _)| id).collect();
    assert!(twice.is_empty(), "event ids on the output topic twice: {twice:?}");
    let mut by_job: HashMap<String, Vec<String>> = HashMap::new();
    for v in seen {
        let t = v["type"].as_str().unwrap_or("");
        if t == "CheckPassed" || t == "CheckFailed" {
            by_job.entry(v["job_id"].as_str().unwrap_or("").to_string()).or_default().push(t.to_string());
        }
    }
    by_job
}

/// A JobResourcesAllocated event for nodes named `nodes` (one GPU each).
pub fn allocated(event_id: &str, job: &str, nodes: &[&str], args: &str) -> String {
    let nodes: Vec<Value> =
        nodes.iter().map(|n| serde_json::json!({ "name": n, "address": "127.0.0.1", "gpus": 1 })).collect();
    serde_json::json!({
        "version": 1, "type": "JobResourcesAllocated", "event_id": event_id, "job_id": job, "workspace_id": "ws-1",
        "attempt": 0, "framework": "PyTorch", "nodes": nodes,
        "settings": { "EnableSanityCheck": true, "SanityCheckArgs": args }
    })
    .to_string()
}

/// A job event the service answers at once, without agents: the first start of job
/// `job-EVENT_ID` under AfterJobFaultTolerant, CheckSkipped.
pub fn skip_event(event_id: &str) -> String {
    allocated(event_id, &format!("job-{event_id}"), &["n"], "--sanity-check-timing=AfterJobFaultTolerant")
}

impl World {
    /// Publishes [`skip_event`] `event_id` and waits for its CheckSkipped on `out`, a reader of
    /// the output topic: every output event the service queued before then has been read too
    /// (the outbox sends its rows in order, on the topic's one partition). A test waits on it
    /// before asserting that an event did not come.
    pub fn output_caught_up(&self, out: &mut Reader, event_id: &str) {
        self.publish(skip_event(event_id).as_bytes());
        out.wait_for(Duration::from_secs(30), &format!("CheckSkipped of {event_id}"), |v| {
            v["type"] == "CheckSkipped" && v["cause_event_id"] == event_id
        });
    }
}

pub fn restarted(event_id: &str, job: &str, attempt: u32, reason: &str) -> String {
    serde_json::json!({ "version": 1, "type": "JobRestarted", "event_id": event_id, "job_id": job, "workspace_id": "ws-1", "attempt": attempt, "reason": reason })
        .to_string()
}

pub fn stopped(event_id: &str, job: &str) -> String {
    serde_json::json!({ "version": 1, "type": "JobStopped", "event_id": event_id, "job_id": job, "workspace_id": "ws-1" }).to_string()
}

/// JobResourcesAllocated for a 2-node job, an agent per node: CheckPassed on the output topic
/// and the rows in the database; a redelivered event is applied once.
pub fn two_node_pass(w: &mut World) {
    let mut out = w.start(&["node-a", "node-b"]);
    w.allocate("ev-1", "job-1", "--sanity-check-max-time=2 --sanity-check-timeout-per-test=1");

    let started = out.wait_for(Duration::from_secs(30), "SanityCheckStarted", |v| v["type"] == "SanityCheckStarted");
    assert_eq!(started["job_id"], "job-1");
    assert_eq!(started["nodes"], serde_json::json!(["node-a", "node-b"]));
    let run_id = started["run_id"].as_str().expect("run_id").to_string();
    let passed = out
        .wait_for(Duration::from_secs(90), "CheckPassed", |v| v["type"] == "CheckPassed" || v["type"] == "CheckFailed");
    assert_eq!(passed["type"], "CheckPassed", "{passed:#}\nserve log:\n{}", w.log("serve"));
    assert_eq!(passed["run_id"], run_id.as_str());
    assert_eq!(passed["cause_event_id"], "ev-1");

    // Rows: the run, its transitions, every rank's results of both checks, node health.
    let q = |sql: &str| w.sql(&sql.replace("RUN", &run_id));
    assert_eq!(q("SELECT state FROM runs WHERE run_id = 'RUN'"), ["CheckPassed"]);
    assert_eq!(q("SELECT state FROM transitions WHERE run_id = 'RUN' ORDER BY id"), ["Checking", "CheckPassed"]);
    let mut checks =
        q("SELECT check_name || ':' || CAST(rank AS TEXT) || ':' || status FROM rank_results WHERE run_id = 'RUN'");
    checks.sort();
    // The default set; gpu-health reads a GPU's own health and says so on CPU workers.
    assert_eq!(
        checks,
        [
            "all-reduce:0:passed",
            "all-reduce:1:passed",
            "gemm:0:passed",
            "gemm:1:passed",
            "gpu-health:0:not_applicable",
            "gpu-health:1:not_applicable"
        ]
    );
    let mut health = q("SELECT node_name || ':' || CAST(healthy AS TEXT) FROM node_health WHERE run_id = 'RUN'");
    health.sort();
    assert_eq!(health, ["node-a:1", "node-b:1"]);
    assert_eq!(q("SELECT event_type FROM job_events WHERE event_id = 'ev-1'"), ["JobResourcesAllocated"]);
    // The report is stored and served behind the token.
    let (code, report) = w.http_call("GET", &format!("/v1/runs/{run_id}/report"), Some(TOKEN), None).unwrap();
    assert_eq!(code, 200);
    assert_eq!(report["status"], "passed");
    assert_eq!(report["nodes"].as_array().map(Vec::len), Some(2));
    assert_eq!(w.http_call("GET", &format!("/v1/runs/{run_id}"), None, None).unwrap().0, 401);

    // A redelivered event (same id) is applied once; JobStopped with no run cancels nothing.
    w.allocate("ev-1", "job-1", "");
    w.publish(stopped("ev-2", "job-1").as_bytes());
    let deadline = Instant::now() + Duration::from_secs(20);
    while w.sql("SELECT event_id FROM job_events WHERE event_id = 'ev-2'").is_empty() {
        assert!(Instant::now() < deadline, "JobStopped never stored");
        std::thread::sleep(Duration::from_millis(100));
    }
    out.drain(Duration::from_secs(1));
    assert_eq!(
        out.of("job-1", "SanityCheckStarted").len(),
        1,
        "a duplicate event started a second run: {:#?}",
        out.seen
    );
    assert_eq!(w.sql("SELECT COUNT(*) FROM runs").first().map(String::as_str), Some("1"));
}

/// The service SIGKILLed mid-run, job events published while it is down, then restarted: the
/// run ends, no job event is lost, no output event is duplicated.
pub fn crash_restart(w: &mut World) {
    let mut out = w.start(&["c-a", "c-b"]);
    // The first check starts 2 s late, so the kill below lands while the workers run however
    // late the test reads SanityCheckStarted.
    w.allocate("crash-1", "job-crash", "--sanity-check-max-time=2 --sanity-check-envs=GPUSANITY_FAULT=delay-start@0");
    out.wait_for(Duration::from_secs(30), "SanityCheckStarted", |v| v["type"] == "SanityCheckStarted");
    w.wait_for_workers(1);
    w.kill("serve");
    // While the service is down: more job events (no check: EnableSanityCheck off).
    for i in 0..5 {
        let mut ev: serde_json::Value =
            serde_json::from_str(&allocated(&format!("down-{i}"), &format!("job-down-{i}"), &["c-a"], "")).unwrap();
        ev["settings"]["EnableSanityCheck"] = false.into();
        w.publish(ev.to_string().as_bytes());
    }
    w.serve();
    let end = out.wait_for(Duration::from_secs(90), "the run's verdict", |v| {
        v["job_id"] == "job-crash" && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed")
    });
    assert_eq!(end["type"], "CheckPassed", "{end:#}\n{}", w.log("serve"));
    assert!(
        w.log("serve").contains("taking up a run left in Checking"),
        "the run was not in flight at the kill:\n{}",
        w.log("serve")
    );
    for i in 0..5 {
        out.wait_for(Duration::from_secs(30), "CheckSkipped of an event sent while down", |v| {
            v["job_id"] == format!("job-down-{i}").as_str()
        });
    }
    out.drain(Duration::from_secs(2));
    // No output event twice: unique ids, and one of each kind per job.
    let mut ids: HashMap<String, usize> = HashMap::new();
    for v in &out.seen {
        *ids.entry(v["event_id"].as_str().unwrap_or("").to_string()).or_default() += 1;
    }
    assert!(ids.values().all(|&n| n == 1), "duplicated event ids: {:#?}", out.seen);
    assert_eq!(out.of("job-crash", "SanityCheckStarted").len(), 1, "{:#?}", out.seen);
    assert_eq!(out.of("job-crash", "CheckPassed").len(), 1, "{:#?}", out.seen);
    for i in 0..5 {
        assert_eq!(out.of(&format!("job-down-{i}"), "CheckSkipped").len(), 1, "{:#?}", out.seen);
    }
    assert_eq!(w.sql("SELECT state FROM runs"), ["CheckPassed"]);
    assert_eq!(w.sql("SELECT COUNT(*) FROM job_events"), ["6"]);
    assert_eq!(w.sql("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL"), ["0"]);
}
