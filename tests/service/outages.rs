//! Outages are not faults (docs/service.md, "Outages of the broker and the database"): the
//! broker or PostgreSQL stopped while runs are in flight, with one and with three replicas.
//! The agents' results and heartbeats wait out the outage in their producers' queues; the
//! service judges no silence of the time it could not hear. Every run ends once with the
//! verdict its checks gave, no event is published twice, every webhook arrives once, and no
//! healthy node gets a NodeIsolated. An agent SIGKILLed during a broker outage is named once
//! the broker is back, and only its node, without a NodeIsolated (its silence overlapped the
//! outage).
//!
//! One private broker and one private PostgreSQL server per test (the outage must not touch
//! the other tests'), a database and topics of its own per scenario.

use std::time::{Duration, Instant};

use gpusanity_testkit::svc;
use serde_json::{json, Value};
use svc::notify::{Mode, Receiver};
use svc::outage::Private;
use svc::{allocated, World};

use crate::replicas::{verdicts, REPLICA};

/// The dependency stopped.
#[derive(Clone, Copy, Debug)]
enum Down {
    Broker,
    Postgres,
}

struct Scenario {
    name: &'static str,
    down: Down,
    outage: Duration,
    replicas: usize,
    /// SIGKILL the agent of the last single-node job's node one second into the outage.
    kill_agent: bool,
}

/// What a scenario saw.
struct Tally {
    in_flight: usize,
    passed: usize,
    failed: usize,
    isolated: usize,
    events: usize,
    webhooks: usize,
    /// From the end of the outage to the last verdict.
    settle: Duration,
}

const NODES: [&str; 4] = ["ou-a", "ou-b", "ou-c", "ou-d"];

/// Runs `s` on `kafka` and `pg` (a database of its own) and asserts its outcome.
fn scenario(kafka: &Private, pg: &Private, s: &Scenario) -> Tally {
    let admin = World::new_on(&kafka.value, Some(pg.value.clone()), "");
    let db = format!("outage_{}", s.name);
    admin.sql(&format!("DROP DATABASE IF EXISTS {db}"));
    admin.sql(&format!("CREATE DATABASE {db}"));
    let url = svc::with_database(&pg.value, &db);
    // The defaults of agent_timeout_s (10 s): an outage is longer than it.
    let mut w = World::new_on(&kafka.value, Some(url), "agent_wait_s = 30.0\ndeadline_grace_s = 30.0");
    w.partitioned(3);
    w.notifier(
        "poll_ms = 100\nbackoff_base_s = 0.2\nbackoff_max_s = 1.0\nwebhook_timeout_s = 2.0\nmax_attempts = 1000",
    );
    let ids: Vec<usize> = (0..s.replicas).collect();
    for &i in &ids {
        w.serve_replica(i, REPLICA);
    }
    w.wait_replicas_ready(&ids, REPLICA);
    let hook = Receiver::start(None, Mode::Ok);
    w.rule(
        "ws-1",
        json!({ "name": "verdicts", "events": ["CheckPassed", "CheckFailed"], "channels": [
            { "type": "webhook", "url": hook.url("/verdict"), "format": "generic" } ] }),
    );
    for n in NODES {
        w.agent(n);
    }
    let mut out = w.reader("check-events");
    // A two-node job and two single-node ones; each check starts 2 s late, so the runs are
    // under way when the outage begins and end during it.
    let jobs: Vec<(String, Vec<&str>)> = vec![
        (format!("job-{}-0", s.name), vec![NODES[0], NODES[1]]),
        (format!("job-{}-1", s.name), vec![NODES[2]]),
        (format!("job-{}-2", s.name), vec![NODES[3]]),
    ];
    let producer = w.job_producer();
    for (j, (job, nodes)) in jobs.iter().enumerate() {
        let args = "--sanity-check-max-time=3 --sanity-check-envs=GPUSANITY_FAULT=delay-start@0";
        producer.send(job, &allocated(&format!("{}-ev-{j}", s.name), job, nodes, args));
    }
    let started = Instant::now();
    while out.seen.iter().filter(|v| v["type"] == "SanityCheckStarted").count() < jobs.len() {
        assert!(started.elapsed() < Duration::from_secs(90), "{}: not every run started: {:#?}", s.name, out.seen);
        out.drain(Duration::from_millis(100));
    }
    // Every node's worker runs: every run is in flight.
    w.wait_for_workers(NODES.len());
    let in_flight = w.sql("SELECT COUNT(*) FROM runs WHERE state = 'Checking'");
    assert_eq!(in_flight, ["3"], "{}: the runs in flight", s.name);

    let killed = NODES[3];
    match s.down {
        Down::Broker => kafka.halt(),
        Down::Postgres => pg.halt(),
    }
    if s.kill_agent {
        std::thread::sleep(Duration::from_secs(1));
        w.kill(killed);
        std::thread::sleep(s.outage - Duration::from_secs(1));
    } else {
        std::thread::sleep(s.outage);
    }
    match s.down {
        Down::Broker => kafka.resume(),
        Down::Postgres => pg.resume(),
    }
    let back = Instant::now();

    // Every job's verdict: within the time to hear again, an agent timeout and the checks.
    let limit = Duration::from_secs(120);
    let settle = loop {
        out.drain(Duration::from_millis(200));
        if verdicts(&out.seen).len() == jobs.len() {
            break back.elapsed();
        }
        assert!(
            back.elapsed() < limit,
            "{}: {} of {} jobs have a verdict {limit:?} after the outage; seen: {:#?}",
            s.name,
            verdicts(&out.seen).len(),
            jobs.len(),
            out.seen
        );
    };
    if matches!(s.down, Down::Postgres) {
        // The runs whose leases lapsed are taken up again and asked from their agents: each
        // ends on node 0's answer, without waiting agent_timeout_s (10 s) for the other node
        // of the two-node run, which is asked nothing (a task for it needs node 0's port).
        assert!(settle < Duration::from_secs(8), "{}: the last verdict {settle:?} after the outage", s.name);
    }
    // Late duplicates, if any, would come within a few seconds.
    out.drain(Duration::from_secs(3));
    let by_job = verdicts(&out.seen);
    let (mut passed, mut failed) = (0, 0);
    for (job, nodes) in &jobs {
        let v = by_job.get(job).unwrap_or_else(|| panic!("{}: {job} has no verdict", s.name));
        assert_eq!(v.len(), 1, "{}: {job} has {} verdicts: {v:?}", s.name, v.len());
        let event = out.of(job, &v[0]).remove(0);
        if s.kill_agent && nodes == &[killed] {
            // The killed agent's node is named, once the broker is back, and only it.
            assert_eq!(v[0], "CheckFailed", "{}: {job} ran on the killed agent: {event:#}", s.name);
            assert_eq!(event["faulty_nodes"], json!([killed]), "{}: {event:#}", s.name);
            let summary = event["summary"].as_str().unwrap_or_default();
            assert!(summary.contains("lost the agent of node(s) ou-d"), "{}: {summary}", s.name);
            assert!(summary.contains("not isolated: node(s) ou-d"), "{}: {summary}", s.name);
            failed += 1;
        } else {
            // A healthy node's check passed: a failure is a false one.
            assert_eq!(v[0], "CheckPassed", "{}: {job} on healthy nodes: {event:#}", s.name);
            passed += 1;
        }
        if matches!(s.down, Down::Broker) {
            let summary = event["summary"].as_str().unwrap_or_default();
            assert!(summary.contains("verdict reached across an outage"), "{}: {job}: {summary}", s.name);
        }
    }
    let isolated: Vec<&Value> = out.seen.iter().filter(|v| v["type"] == "NodeIsolated").collect();
    assert!(isolated.is_empty(), "{}: nodes isolated by an outage: {isolated:#?}", s.name);

    // Every webhook once.
    let webhooks = hook.once_each(jobs.len(), Duration::from_secs(60));
    assert_eq!(w.sql("SELECT COUNT(*) FROM runs WHERE state = 'Checking'"), ["0"], "{}", s.name);
    w.shutdown();
    Tally { in_flight: jobs.len(), passed, failed, isolated: isolated.len(), events: out.seen.len(), webhooks, settle }
}

fn report(s: &Scenario, t: &Tally) {
    eprintln!(
        "outage {}: {:?} stopped {:.0} s, {} replica(s), {} runs in flight{}: {} passed, {} failed, \
         {} NodeIsolated, {} output events (0 twice), {} webhooks (0 twice); last verdict {:.1} s after the outage",
        s.name,
        s.down,
        s.outage.as_secs_f64(),
        s.replicas,
        t.in_flight,
        if s.kill_agent { ", one agent SIGKILLed in it" } else { "" },
        t.passed,
        t.failed,
        t.isolated,
        t.events,
        t.webhooks,
        t.settle.as_secs_f64()
    );
}

fn run_all(list: &[Scenario]) {
    let _g = svc::common::serial();
    let kafka = Private::kafka();
    let pg = Private::postgres();
    for s in list {
        let t = scenario(&kafka, &pg, s);
        report(s, &t);
    }
}

#[test]
fn outage_broker_30s_with_an_agent_killed_and_120s_one_replica() {
    run_all(&[
        Scenario { name: "b30r1", down: Down::Broker, outage: Duration::from_secs(30), replicas: 1, kill_agent: true },
        Scenario {
            name: "b120r1",
            down: Down::Broker,
            outage: Duration::from_secs(120),
            replicas: 1,
            kill_agent: false,
        },
    ]);
}

#[test]
fn outage_broker_30s_with_an_agent_killed_and_120s_three_replicas() {
    run_all(&[
        Scenario { name: "b30r3", down: Down::Broker, outage: Duration::from_secs(30), replicas: 3, kill_agent: true },
        Scenario {
            name: "b120r3",
            down: Down::Broker,
            outage: Duration::from_secs(120),
            replicas: 3,
            kill_agent: false,
        },
    ]);
}

#[test]
fn outage_postgres_30s_one_and_three_replicas() {
    run_all(&[
        Scenario {
            name: "p30r1",
            down: Down::Postgres,
            outage: Duration::from_secs(30),
            replicas: 1,
            kill_agent: false,
        },
        Scenario {
            name: "p30r3",
            down: Down::Postgres,
            outage: Duration::from_secs(30),
            replicas: 3,
            kill_agent: false,
        },
    ]);
}
