//! Exactly once as the user sees it: the service SIGKILLed while notifications are pending, or
//! right after CheckFailed was written and before it was planned, and restarted; each receiver
//! gets each notification once.

use gpusanity_testkit::svc;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::json;
use svc::notify::{Mode, Receiver};
use svc::{allocated, World};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 1.0\ndeadline_grace_s = 10.0";

/// Two webhook channels (generic and Slack) on ports `a` and `b` for CheckFailed of ws-1.
fn rules(w: &World, a: u16, b: u16) {
    w.rule(
        "ws-1",
        json!({ "name": "r", "channels": [
        { "type": "webhook", "url": format!("http://127.0.0.1:{a}/a"), "format": "generic" },
        { "type": "webhook", "url": format!("http://127.0.0.1:{b}/b"), "format": "slack" } ] }),
    );
}

/// Each receiver got exactly one request, and it stays so (longer than any backoff).
fn exactly_once(w: &World, receivers: &[&Receiver]) {
    for r in receivers {
        r.wait_for(1, Duration::from_secs(15));
    }
    std::thread::sleep(Duration::from_millis(2500));
    let mut keys: HashMap<String, usize> = HashMap::new();
    for r in receivers {
        let got = r.requests();
        assert_eq!(got.len(), 1, "receiver :{} got {} requests: {got:#?}", r.port, got.len());
        *keys.entry(got[0].header("idempotency-key").to_string()).or_default() += 1;
    }
    assert_eq!(keys.len(), receivers.len(), "one key per delivery: {keys:?}");
    let log = w.deliveries("ws-1");
    assert_eq!(log.len(), receivers.len(), "{log:#?}");
    for d in &log {
        assert_eq!(d["status"], "sent", "{d:#}");
        assert!(keys.contains_key(d["idempotency_key"].as_str().unwrap_or("")), "{d:#}");
    }
    assert_eq!(w.sql("SELECT COUNT(*) FROM outbox WHERE notify_planned_at IS NULL"), ["0"]);
}

#[test]
fn a_kill_while_deliveries_are_pending_then_a_restart_sends_each_once() {
    let _g = svc::common::serial();
    pending_kill_restart(World::new(None, FAST));
}

#[test]
fn a_kill_while_deliveries_are_pending_then_a_restart_sends_each_once_on_postgresql() {
    let _g = svc::common::serial();
    pending_kill_restart(World::new(Some(svc::postgres_database("notify_restart")), FAST));
}

fn pending_kill_restart(mut w: World) {
    w.notifier("poll_ms = 100\nbackoff_base_s = 0.2\nbackoff_max_s = 0.5\nwebhook_timeout_s = 2.0\nmax_attempts = 100");
    w.serve();
    // The receivers are down at first: their ports refuse connections.
    let (pa, pb) = (svc::notify::refused_port(), svc::notify::refused_port());
    rules(&w, pa, pb);
    let mut out = w.reader("check-events");
    w.publish(allocated("rk-1", "job-rk", &["ghost-r"], "--sanity-check-max-time=1").as_bytes());
    let failed = out
        .wait_for(Duration::from_secs(30), "CheckFailed", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    assert_eq!(failed["type"], "CheckFailed");
    w.wait_deliveries("ws-1", Duration::from_secs(10), "two pending deliveries, tried and failed", |d| {
        d.len() == 2 && d.iter().all(|x| x["status"] == "pending" && x["attempts"].as_i64().unwrap_or(0) >= 2)
    });
    w.kill("serve");
    let a = Receiver::start(Some(pa), Mode::Ok);
    let b = Receiver::start(Some(pb), Mode::Ok);
    let restarted = Instant::now();
    w.serve();
    exactly_once(&w, &[&a, &b]);
    assert!(a.requests()[0].at - restarted < Duration::from_secs(10));
    w.shutdown();
}

#[test]
fn a_kill_after_check_failed_is_written_and_before_it_is_planned_still_sends_each_once() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    // A planner that looks once at start and then sleeps a minute: the kill comes before it plans.
    w.notifier("poll_ms = 60000\nbackoff_base_s = 0.2\nbackoff_max_s = 0.5");
    w.serve();
    let a = Receiver::start(None, Mode::Ok);
    let b = Receiver::start(None, Mode::Ok);
    rules(&w, a.port, b.port);
    let mut out = w.reader("check-events");
    w.publish(allocated("rk-2", "job-rk2", &["ghost-s"], "--sanity-check-max-time=1").as_bytes());
    let failed = out
        .wait_for(Duration::from_secs(30), "CheckFailed", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    assert_eq!(failed["type"], "CheckFailed");
    w.kill("serve");
    // Written (it is on the topic), not planned, nothing sent.
    let ev = failed["event_id"].as_str().expect("event_id");
    assert_eq!(
        w.sql(&format!("SELECT COUNT(*) FROM outbox WHERE event_id = '{ev}' AND notify_planned_at IS NULL")),
        ["1"]
    );
    assert_eq!(w.sql("SELECT COUNT(*) FROM deliveries"), ["0"]);
    assert!(a.requests().is_empty() && b.requests().is_empty());
    w.edit_config("poll_ms = 60000", "poll_ms = 100");
    w.serve();
    exactly_once(&w, &[&a, &b]);
    w.shutdown();
}
