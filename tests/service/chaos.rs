//! The chaos test: three replicas on a PostgreSQL and a broker of the test's own, real agents on
//! CPU (8 nodes, one job at a time each), 200 jobs; a random replica SIGKILLed every few seconds and restarted, the broker
//! restarted once and PostgreSQL once, all while the jobs arrive (after ten calm seconds). Every job gets exactly one
//! verdict, no event id is on the output topic twice, every notification arrives once, no run
//! stays in Checking, nothing is left running. It prints the counts and the figures
//! (docs/benchmarks.md, "Replicas"). One warm-up job goes through before the 200 (its latency
//! printed apart): the broker is freshly formatted, and its first job pays one-time costs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpusanity_testkit::svc;
use serde_json::{json, Value};
use svc::notify::{Mode, Receiver};
use svc::outage::Private;
use svc::{allocated, World};

use crate::replicas::{verdicts, REPLICA};

const JOBS: usize = 200;
const REPLICAS: usize = 3;
const NODES: usize = 8;
/// Between two job events.
const PACE: Duration = Duration::from_millis(250);
const MAX_TIME_MIN: f64 = 2.0;
const GRACE_S: f64 = 30.0;
/// How long the jobs arrive before the first disruption.
const CALM: Duration = Duration::from_secs(10);

/// A number from the clock, for picking a replica and a pause (no seed to keep: any pick must pass).
fn pick(n: usize) -> usize {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos());
    nanos.unwrap_or(0) as usize % n
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The times (Unix ms) of the log lines of `log` that contain `what`.
fn times_of(log: &str, what: &str) -> Vec<i64> {
    log.lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.timestamp_millis())
        .collect()
}

/// A message of the output topic: the event, when the reader got it, its Kafka timestamp
/// (CreateTime, Unix ms: when the outbox publisher sent it).
type Seen = (Value, Instant, Option<i64>);

/// A SanityCheckStarted's way from the publication of its job event, in ms: to its outbox row
/// (the event's `at`, taken in the ingest's transaction before it commits), from there to the
/// publisher's send (the message's CreateTime), from there to the reader.
struct Way {
    job: String,
    total: f64,
    ingest: f64,
    outbox: f64,
    delivery: f64,
}

impl std::fmt::Display for Way {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let Way { job, total, ingest, outbox, delivery } = self;
        write!(f, "{job} {total:.0} ms ({ingest:.0}+{outbox:.0}+{delivery:.0})")
    }
}

/// The way of every SanityCheckStarted seen; `sent`: (job, published at, published at in Unix ms).
fn ways(seen: &[Seen], sent: &[(String, Instant, i64)]) -> Vec<Way> {
    let published: HashMap<&str, (Instant, i64)> = sent.iter().map(|(j, at, ms)| (j.as_str(), (*at, *ms))).collect();
    seen.iter()
        .filter(|(v, _, _)| v["type"] == "SanityCheckStarted")
        .filter_map(|(v, at, created)| {
            let job = v["job_id"].as_str()?;
            let (p, p_ms) = *published.get(job)?;
            let total = at.duration_since(p).as_secs_f64() * 1e3;
            let row = v["at"].as_str().and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())?;
            let row = (row.timestamp_micros() as f64 / 1e3) - p_ms as f64;
            let send = created.map_or(f64::NAN, |c| (c - p_ms) as f64);
            Some(Way { job: job.to_string(), total, ingest: row, outbox: send - row, delivery: total - send })
        })
        .collect()
}

#[test]
fn chaos_three_replicas_200_jobs_kills_and_outages() {
    let _g = svc::common::serial();
    let kafka = Private::kafka();
    let pg = Private::postgres();
    let coordinator = format!("agent_timeout_s = 20.0\nagent_wait_s = 60.0\ndeadline_grace_s = {GRACE_S}");
    let mut w = World::new_on(&kafka.value, Some(pg.value.clone()), &coordinator);
    w.partitioned(6);
    w.notifier(
        "poll_ms = 100\nbackoff_base_s = 0.2\nbackoff_max_s = 1.0\nwebhook_timeout_s = 2.0\nmax_attempts = 1000",
    );
    for i in 0..REPLICAS {
        w.serve_replica(i, REPLICA);
    }
    w.wait_replicas_ready(&(0..REPLICAS).collect::<Vec<_>>(), REPLICA);
    let hook = Receiver::start(None, Mode::Ok);
    w.rule(
        "ws-1",
        json!({ "name": "all", "events": ["CheckPassed", "CheckFailed"], "channels": [
            { "type": "webhook", "url": hook.url("/verdict"), "format": "generic" } ] }),
    );
    let nodes: Vec<String> = (0..NODES).map(|k| format!("ch-{k}")).collect();
    for n in &nodes {
        w.agent(n);
    }

    // The output topic, read on a thread of its own so arrival times are exact.
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut reader = w.reader("check-events");
    let reading = {
        let (seen, stop) = (seen.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                reader.drain(Duration::from_millis(50));
                let mut s = seen.lock().expect("lock");
                let stamps = reader.arrived.drain(..).zip(reader.created.drain(..));
                for (v, (at, created)) in reader.seen.drain(..).zip(stamps) {
                    s.push((v, at, created));
                }
            }
        })
    };
    // One job through the whole way before the measured ones: the broker was formatted
    // seconds ago, and its first job pays one-time costs of a fresh broker (a first producer id
    // from the controller, first fetch sessions) that a platform's broker has long paid. Its
    // latency is printed on its own, not hidden.
    let producer = w.job_producer();
    let warm_job = "job-ch-warm";
    let warm_sent = Instant::now();
    producer.send(
        warm_job,
        &allocated("ch-ev-warm", warm_job, &[nodes[0].as_str()], &format!("--sanity-check-max-time={MAX_TIME_MIN}")),
    );
    let warm_latency = {
        let start = Instant::now();
        loop {
            let s = seen.lock().expect("lock");
            let started = s
                .iter()
                .find(|(v, _, _)| v["job_id"] == warm_job && v["type"] == "SanityCheckStarted")
                .map(|(_, at, _)| *at);
            let ended = s
                .iter()
                .any(|(v, _, _)| v["job_id"] == warm_job && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed"));
            drop(s);
            if let (Some(at), true) = (started, ended) {
                break at.duration_since(warm_sent).as_secs_f64() * 1e3;
            }
            assert!(start.elapsed() < Duration::from_secs(120), "the warm-up job got no verdict in 120 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // The jobs, one every PACE at most, on a thread of their own, each on a node whose last job
    // has its verdict (a node runs one job at a time, as on a cluster); (job, published at).
    let publishing = {
        let (nodes, seen) = (nodes.clone(), seen.clone());
        std::thread::spawn(move || {
            let mut sent = Vec::with_capacity(JOBS);
            let mut last: Vec<Option<String>> = vec![None; NODES];
            let ended = |job: &str| {
                seen.lock()
                    .expect("lock")
                    .iter()
                    .any(|(v, _, _)| v["job_id"] == job && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed"))
            };
            for j in 0..JOBS {
                let k = loop {
                    if let Some(k) = (0..NODES).find(|&k| last[k].as_deref().is_none_or(&ended)) {
                        break k;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                let job = format!("job-ch-{j}");
                let ev = allocated(
                    &format!("ch-ev-{j}"),
                    &job,
                    &[nodes[k].as_str()],
                    &format!("--sanity-check-max-time={MAX_TIME_MIN}"),
                );
                let (at, wall) = (Instant::now(), chrono::Utc::now().timestamp_millis());
                producer.send(&job, &ev);
                sent.push((job.clone(), at, wall));
                last[k] = Some(job);
                std::thread::sleep(PACE);
            }
            sent
        })
    };

    // The chaos, while the jobs arrive: a replica killed every 3-5 s and restarted a second
    // later; the broker restarted at about 15 s, PostgreSQL at about 30 s.
    let t0 = Instant::now();
    let (mut kills, mut kafka_done, mut pg_done) = (Vec::new(), false, false);
    // (start, end) of every disruption, Unix ms.
    let mut disrupted: Vec<(i64, i64)> = Vec::new();
    let wall = || chrono::Utc::now().timestamp_millis();
    // The first ten seconds are calm: the load alone, for the latency figure.
    std::thread::sleep(CALM);
    while !publishing.is_finished() {
        std::thread::sleep(Duration::from_millis(3000 + 500 * pick(5) as u64));
        let i = pick(REPLICAS);
        let start = wall();
        w.kill(&format!("serve-{i}"));
        kills.push(start);
        std::thread::sleep(Duration::from_secs(1));
        w.serve_replica(i, REPLICA);
        disrupted.push((start, wall()));
        if !kafka_done && t0.elapsed() > Duration::from_secs(18) {
            let start = wall();
            kafka.halt();
            std::thread::sleep(Duration::from_secs(3));
            kafka.resume();
            disrupted.push((start, wall()));
            kafka_done = true;
        } else if !pg_done && t0.elapsed() > Duration::from_secs(30) {
            let start = wall();
            pg.halt();
            std::thread::sleep(Duration::from_secs(3));
            pg.resume();
            disrupted.push((start, wall()));
            pg_done = true;
        }
    }
    let sent = publishing.join().expect("publisher thread");
    assert!(kafka_done && pg_done, "the jobs went out before both outages: make PACE longer");

    // Every job's verdict, within max time and grace.
    let limit = Duration::from_secs_f64(MAX_TIME_MIN * 60.0 + GRACE_S);
    let wait_start = Instant::now();
    loop {
        let s = seen.lock().expect("lock");
        let all: Vec<Value> = s.iter().map(|(v, _, _)| v.clone()).collect();
        drop(s);
        let by_job = verdicts(&all);
        if by_job.len() == JOBS + 1 {
            break;
        }
        assert!(
            wait_start.elapsed() < limit,
            "{} of {JOBS} jobs and the warm-up have a verdict; missing: {:?}",
            by_job.len(),
            (0..JOBS).map(|j| format!("job-ch-{j}")).filter(|j| !by_job.contains_key(j)).take(20).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    reading.join().expect("reader thread");
    let seen = std::mem::take(&mut *seen.lock().expect("lock"));
    let all: Vec<Value> = seen.iter().map(|(v, _, _)| v.clone()).collect();
    let by_job = verdicts(&all);
    let mut passed = 0;
    for (job, v) in &by_job {
        assert_eq!(v.len(), 1, "{job} has {} verdicts: {v:?}", v.len());
        passed += usize::from(v[0] == "CheckPassed" && job != warm_job);
    }
    // Healthy CPU nodes: every verdict is a pass (a failure here is a false positive).
    let failed: Vec<&Value> = all.iter().filter(|v| v["type"] == "CheckFailed").collect();
    assert!(failed.is_empty(), "healthy nodes failed: {failed:#?}");

    // Publish to SanityCheckStarted, and its stages.
    let ways = ways(&seen, &sent);
    let mut latency: Vec<f64> = ways.iter().map(|w| w.total).collect();
    latency.sort_by(f64::total_cmp);
    assert_eq!(latency.len(), JOBS, "a job has no SanityCheckStarted, or two");
    // The same for the jobs published away from every disruption (from 1 s before one starts
    // to 8 s after it ends: a moved partition, a restarted broker): the load alone.
    let calm: std::collections::HashSet<&str> = sent
        .iter()
        .filter(|(_, _, t)| disrupted.iter().all(|(a, b)| *t < a - 1000 || *t > b + 8000))
        .map(|(j, _, _)| j.as_str())
        .collect();
    let mut calm_ways: Vec<&Way> = ways.iter().filter(|w| calm.contains(w.job.as_str())).collect();
    calm_ways.sort_by(|a, b| b.total.total_cmp(&a.total));
    let mut calm_latency: Vec<f64> = calm_ways.iter().map(|w| w.total).collect();
    calm_latency.sort_by(f64::total_cmp);
    let stage = |f: fn(&Way) -> f64| {
        let mut v: Vec<f64> = calm_ways.iter().map(|w| f(w)).collect();
        v.sort_by(f64::total_cmp);
        format!("{:.0}/{:.0}", percentile(&v, 0.5), percentile(&v, 0.99))
    };
    let mut slowest: Vec<&Way> = ways.iter().collect();
    slowest.sort_by(|a, b| b.total.total_cmp(&a.total));
    let list = |w: &[&Way]| w.iter().take(3).map(|w| w.to_string()).collect::<Vec<_>>().join(", ");
    let stages = format!(
        "chaos: away from the disruptions, stages p50/p99 ms: to the outbox row {}, to the send {}, to the reader {}; \
         slowest calm {}; slowest of all {}",
        stage(|w| w.ingest),
        stage(|w| w.outbox),
        stage(|w| w.delivery),
        list(&calm_ways),
        list(&slowest)
    );

    // Every notification once.
    let got = hook.wait_for(JOBS + 1, Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(3));
    let mut keys: HashMap<String, usize> = HashMap::new();
    for r in hook.requests() {
        *keys.entry(r.header("idempotency-key").to_string()).or_default() += 1;
    }
    let twice = keys.values().filter(|&&n| n > 1).count();
    assert_eq!(keys.len(), JOBS + 1, "{} notifications for {JOBS} verdicts and the warm-up's", got.len());
    assert_eq!(twice, 0, "notifications that arrived twice: {twice}");

    // No run left in Checking, none past max time and grace.
    assert_eq!(w.sql("SELECT COUNT(*) FROM runs WHERE state = 'Checking'"), ["0"]);
    let longest: i64 =
        w.sql("SELECT MAX(finished_at - created_at) FROM runs").first().and_then(|v| v.parse().ok()).unwrap_or(0);
    assert!((longest as f64) < limit.as_secs_f64() * 1000.0, "a run took {longest} ms");

    // Failover: from each kill to the takeovers that followed it (before the next kill).
    let mut taken: Vec<i64> = (0..REPLICAS)
        .flat_map(|i| times_of(&w.log(&format!("serve-{i}")), "taking up a run left in Checking"))
        .collect();
    taken.sort_unstable();
    let mut failover: Vec<f64> =
        taken.iter().filter_map(|t| kills.iter().rev().find(|k| *k <= t).map(|k| (t - k) as f64 / 1000.0)).collect();
    failover.sort_by(f64::total_cmp);
    let paused: usize =
        (0..REPLICAS).map(|i| times_of(&w.log(&format!("serve-{i}")), "not renewed in time").len()).sum();
    w.shutdown();
    eprintln!("{stages}; {paused} pauses of the publisher for a late lease renewal; the warm-up job before them (a fresh broker) {warm_latency:.0} ms");
    eprintln!(
        "chaos: {JOBS} jobs, {passed} passed, {} failed; {} replica kills; broker and PostgreSQL restarted once each; \
         {} output events, 0 duplicated; {} notifications, 0 twice; {} runs taken over, failover p50 {:.1} s p99 {:.1} s; \
         publish to SanityCheckStarted p50 {:.0} ms p99 {:.0} ms, away from the disruptions ({} jobs) p50 {:.0} ms p99 {:.0} ms; \
         longest run {:.1} s",
        JOBS - passed,
        kills.len(),
        all.len(),
        keys.len(),
        failover.len(),
        percentile(&failover, 0.5),
        percentile(&failover, 0.99),
        percentile(&latency, 0.5),
        percentile(&latency, 0.99),
        calm_latency.len(),
        percentile(&calm_latency, 0.5),
        percentile(&calm_latency, 0.99),
        longest as f64 / 1000.0
    );
}
