//! Operations: /metrics, /ready, JSON logs; the broker and the database away under `serve`
//! and at its start; an oversized job event and an output event the broker refuses for good.

use gpusanity_testkit::svc;

use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};
use svc::outage::Private;
use svc::{skip_event, World, TOKEN};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";

fn skipped(out: &mut svc::Reader, event_id: &str, limit: Duration) {
    out.wait_for(limit, &format!("CheckSkipped of {event_id}"), |v| {
        v["type"] == "CheckSkipped" && v["cause_event_id"] == event_id
    });
}

/// Every event in `ids` got exactly one CheckSkipped on the output topic (read from its start).
fn exactly_once(w: &World, ids: &[&str]) {
    let mut all = w.reader("check-events");
    all.drain(Duration::from_secs(2));
    for id in ids {
        let n = all.of(&format!("job-{id}"), "CheckSkipped").len();
        assert_eq!(n, 1, "{id}: {n} CheckSkipped");
    }
}

#[test]
fn metrics_ready_and_json_logs_after_a_run() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    let mut text = std::fs::read_to_string(&w.config).unwrap();
    text.push_str("\n[log]\nformat = \"json\"\n");
    std::fs::write(&w.config, text).unwrap();
    let mut out = w.start(&["m-a"]);
    w.allocate("m-1", "job-m", "--micro-benchmarks=all-reduce --sanity-check-max-time=2");
    let end = out
        .wait_for(Duration::from_secs(90), "the verdict", |v| v["type"] == "CheckPassed" || v["type"] == "CheckFailed");
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    let ready = w.wait_ready(200, Duration::from_secs(10));
    assert_eq!(ready["status"], "ready", "{ready}");
    assert!(ready["partitions_assigned"].as_i64().unwrap_or(0) >= 1, "{ready}");
    assert_eq!(w.http_text("/metrics", None).unwrap().0, 401);
    assert_eq!(w.http_text("/metrics", Some("wrong-token-0123456789")).unwrap().0, 401);
    let expected = [
        "gpusanity_runs{state=\"CheckPassed\"} 1".to_string(),
        "gpusanity_runs{state=\"Checking\"} 0".into(),
        "gpusanity_verdicts_total{reason=\"\",verdict=\"passed\"} 1".into(),
        "gpusanity_verdict_latency_seconds_count 1".into(),
        "gpusanity_agents_live 1".into(),
        "gpusanity_outbox_backlog 0".into(),
        "gpusanity_outbox_oldest_age_seconds 0".into(),
        "gpusanity_outbox_failed 0".into(),
        "gpusanity_ready 1".into(),
        "gpusanity_kafka_errors_total ".into(),
        "gpusanity_database_errors_total ".into(),
        format!("gpusanity_partitions_assigned{{topic=\"{}\"}} 1", w.topic("job-events")),
        format!("gpusanity_consumer_lag{{partition=\"0\",topic=\"{}\"}} 0", w.topic("job-events")),
    ];
    // The outbox is drained and the offsets committed and measured within a probe or two.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, m) = w.http_text("/metrics", Some(TOKEN)).unwrap();
        assert_eq!(status, 200);
        let missing: Vec<&String> = expected.iter().filter(|l| !m.contains(l.as_str())).collect();
        if missing.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "no {missing:?} in:\n{m}");
        std::thread::sleep(Duration::from_millis(300));
    }
    // The log is JSON lines (the one plain line is the listen address, printed before logging).
    let log = w.log("serve");
    let mut n = 0;
    for line in log.lines().filter(|l| !l.is_empty() && !l.starts_with("gpusanity serve: listening")) {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(v["level"].is_string() && v["fields"]["message"].is_string(), "{line}");
        n += 1;
    }
    assert!(n >= 2, "{log}");
    assert!(!log.contains('\u{1b}'), "ANSI codes in the log: {log}");
    w.shutdown();
}

#[test]
fn an_oversized_event_and_a_refused_output_event_hold_nothing_back() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    let mut out = w.start(&[]);
    let mut dead = w.reader("dead-letter");
    let big: Vec<u8> = (0..1_000_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    w.publish(&big);
    let dl = dead.wait_for(Duration::from_secs(30), "the dead letter", |v| v["partition"] == 0);
    assert_eq!(dl["truncated"], true, "{}", dl["reason"]);
    assert_eq!(dl["payload_size"], 1_000_000);
    assert_eq!(dl["payload_sha256"], hex::encode(Sha256::digest(&big)));
    assert!(dl["payload"].as_str().unwrap().len() <= 3 * 16 * 1024);
    // A row the broker refuses for good (3 MB of hex, past its 1 MiB limit even compressed).
    let huge: String = (0..100_000).map(|_| uuid::Uuid::new_v4().simple().to_string()).collect();
    w.sql(&format!(
        "INSERT INTO outbox (event_id, topic, msg_key, payload, created_at) VALUES ('too-big', '{}', 'k', '{huge}', 0)",
        w.topic("check-events")
    ));
    // Later events are neither blocked nor slowed.
    let start = Instant::now();
    for i in 0..5 {
        let id = format!("after-{i}");
        w.publish(skip_event(&id).as_bytes());
        skipped(&mut out, &id, Duration::from_secs(15));
    }
    let each = start.elapsed() / 5;
    assert!(each < Duration::from_millis(1500), "{each:?} per event");
    let deadline = Instant::now() + Duration::from_secs(20);
    while w.sql("SELECT attempts FROM outbox WHERE event_id = 'too-big' AND failed_at IS NOT NULL") != ["3"] {
        assert!(Instant::now() < deadline, "{:?}", w.sql("SELECT error FROM outbox WHERE event_id = 'too-big'"));
        std::thread::sleep(Duration::from_millis(200));
    }
    let error = w.sql("SELECT error FROM outbox WHERE event_id = 'too-big'");
    assert!(error[0].to_lowercase().contains("too large"), "{error:?}");
    let (_, metrics) = w.http_text("/metrics", Some(TOKEN)).unwrap();
    assert!(metrics.contains("gpusanity_outbox_refused_total 1"), "{metrics}");
    assert!(metrics.contains("gpusanity_outbox_failed 1"), "{metrics}");
    w.shutdown();
}

#[test]
fn the_broker_away_under_serve_and_at_its_start() {
    let _g = svc::common::serial();
    let kafka = Private::kafka();
    let mut w = World::new_on(&kafka.value, None, FAST);
    let mut out = w.start(&[]);
    w.wait_ready(200, Duration::from_secs(30));
    for id in ["b-1", "b-2"] {
        w.publish(skip_event(id).as_bytes());
        skipped(&mut out, id, Duration::from_secs(20));
    }
    // Away longer than the old 20 s give-up.
    kafka.halt();
    let away = Instant::now();
    let body = w.wait_ready(503, Duration::from_secs(15));
    assert!(body["not_ready"].to_string().contains("kafka"), "{body}");
    while away.elapsed() < Duration::from_secs(25) {
        assert!(w.alive("serve"), "serve exited while the broker was away:\n{}", w.log("serve"));
        std::thread::sleep(Duration::from_millis(500));
    }
    kafka.resume();
    w.wait_ready(200, Duration::from_secs(60));
    for id in ["b-3", "b-4"] {
        w.publish(skip_event(id).as_bytes());
        skipped(&mut out, id, Duration::from_secs(30));
    }
    // Started while the broker is away: it waits (and answers /health, /ready 503), then works.
    w.kill("serve");
    kafka.halt();
    w.serve();
    let away = Instant::now();
    while away.elapsed() < Duration::from_secs(22) {
        assert!(w.alive("serve"), "serve gave up waiting for the broker:\n{}", w.log("serve"));
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(w.http_call("GET", "/ready", None, None).unwrap().0, 503);
    kafka.resume();
    w.wait_ready(200, Duration::from_secs(60));
    w.publish(skip_event("b-5").as_bytes());
    let mut out = w.reader("check-events");
    skipped(&mut out, "b-5", Duration::from_secs(30));
    exactly_once(&w, &["b-1", "b-2", "b-3", "b-4", "b-5"]);
    w.shutdown();
}

#[test]
fn postgres_away_under_serve() {
    let _g = svc::common::serial();
    let pg = Private::postgres();
    let mut w = World::new(Some(pg.value.clone()), FAST);
    let mut out = w.start(&[]);
    w.wait_ready(200, Duration::from_secs(30));
    w.publish(skip_event("p-1").as_bytes());
    skipped(&mut out, "p-1", Duration::from_secs(20));
    pg.halt();
    // Taken while the database is away, handled once it is back.
    w.publish(skip_event("p-2").as_bytes());
    let body = w.wait_ready(503, Duration::from_secs(15));
    assert!(body["not_ready"].to_string().contains("database"), "{body}");
    // Until every part of the service that uses the database has met the outage (a query first
    // waits out the pool's acquire timeout, 30 s) and gone on: the ingest with p-2, the
    // coordinator, the outbox and the notifier's planner and sender.
    let parts = [
        ("applying job events failed", "retrying in"),
        ("coordinator: ", "; retried after"),
        ("outbox: ", "; retried after"),
        ("notifier planner: ", "starting again"),
        ("notifier sender: ", "starting again"),
    ];
    w.wait_log("serve", Duration::from_secs(90), "every part meeting the outage", |log| {
        parts.iter().all(|(part, then)| log.lines().any(|l| l.contains(part) && l.contains(then)))
    });
    assert!(w.alive("serve"), "serve exited while the database was away:\n{}", w.log("serve"));
    pg.resume();
    w.wait_ready(200, Duration::from_secs(60));
    skipped(&mut out, "p-2", Duration::from_secs(30));
    w.publish(skip_event("p-3").as_bytes());
    skipped(&mut out, "p-3", Duration::from_secs(20));
    exactly_once(&w, &["p-1", "p-2", "p-3"]);
    w.shutdown();
}
