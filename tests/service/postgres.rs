//! The service end to end on PostgreSQL (the SQLite runs are in flow.rs and
//! faults.rs): the 2-node pass, the service killed mid-run and restarted, and a node
//! without an agent.

use gpusanity_testkit::svc;

use std::time::Duration;

use svc::{allocated, World};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 3.0\ndeadline_grace_s = 10.0";

#[test]
fn two_node_job_passes_on_postgresql() {
    let _g = svc::common::serial();
    let url = svc::postgres_database("gpusanity_pass");
    let mut w = World::new(Some(url), FAST);
    svc::two_node_pass(&mut w);
    w.shutdown();
}

#[test]
fn the_service_killed_mid_run_and_restarted_on_postgresql() {
    let _g = svc::common::serial();
    let url = svc::postgres_database("gpusanity_crash");
    let mut w = World::new(Some(url), "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0");
    svc::crash_restart(&mut w);
    w.shutdown();
}

#[test]
fn a_missing_agent_fails_the_run_on_postgresql() {
    let _g = svc::common::serial();
    let url = svc::postgres_database("gpusanity_missing");
    let mut w = World::new(Some(url), FAST);
    w.serve();
    let mut out = w.reader("check-events");
    w.publish(allocated("pg-miss", "job-pg", &["pg-ghost"], "").as_bytes());
    let failed = out.wait_for(Duration::from_secs(30), "CheckFailed", |v| v["type"] == "CheckFailed");
    assert_eq!(failed["faulty_nodes"], serde_json::json!(["pg-ghost"]));
    assert_eq!(w.sql("SELECT code FROM findings"), ["NO_AGENT"]);
    assert_eq!(w.sql("SELECT state FROM runs"), ["CheckFailed"]);
    assert_eq!(w.sql("SELECT state FROM transitions ORDER BY id"), ["Checking", "CheckFailed"]);
    w.shutdown();
}
