//! Figures of the service (bench/service_bench.sh runs this): ingest throughput of job events
//! that need no check, and the service's own latency from a job event to SanityCheckStarted
//! (Checking) and from the last agent result to CheckPassed, p50 and p99.
//!
//! Usage: service_bench BOOTSTRAP GPUSANITY_BIN [EVENTS] [RUNS]. Every time is a Kafka
//! message timestamp (CreateTime: set by the producing client when it sends), so the latencies
//! cover the service's consumption, database transaction, outbox and publication.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(boot), Some(bin)) = (args.get(1), args.get(2)) else {
        return Err("usage: service_bench BOOTSTRAP GPUSANITY_BIN [EVENTS] [RUNS]".into());
    };
    let events: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(20_000);
    let runs: usize = args.get(4).map(|s| s.parse()).transpose()?.unwrap_or(40);
    let dir = std::env::temp_dir().join(format!("gpusanity-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let prefix = format!("bench.{}.", std::process::id());
    let config = dir.join("gpusanity.toml");
    // The agent key the service and the agents share (a fresh random one, mode 0600).
    let keys = dir.join("agent-keys.toml");
    let mut secret = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut secret)?;
    let hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();
    {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&keys)?;
        writeln!(f, "[[key]]\nid = \"bench\"\nsecret = \"{hex}\"")?;
    }
    std::fs::write(
        &config,
        format!(
            "[kafka]\nbootstrap = \"{boot}\"\ngroup = \"{prefix}service\"\n[topics]\njob_events = \"{prefix}job-events\"\noutput = \"{prefix}check-events\"\n\
             dead_letter = \"{prefix}dead-letter\"\nagent_tasks = \"{prefix}agent-tasks\"\nagent_reports = \"{prefix}agent-reports\"\ntelemetry = \"{prefix}telemetry\"\n\
             [database]\nurl = \"sqlite://{}\"\n[http]\nlisten = \"127.0.0.1:0\"\ntoken = \"bench-token-0123456789\"\n\
             [agent_auth]\nkeys_file = \"{}\"\n",
            dir.join("bench.db").display(),
            keys.display()
        ),
    )?;
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", boot).set("linger.ms", "5").create()?;
    let jobs = format!("{prefix}job-events");

    // 1. Throughput: a backlog of events needing no check (EnableSanityCheck off), then the service.
    for i in 0..events {
        let ev = event(&format!("skip-{i}"), &format!("skip-job-{i}"), false, "");
        loop {
            match producer.send(BaseRecord::<(), str>::to(&jobs).payload(&ev)) {
                Ok(()) => break,
                Err((_, _)) => producer.poll(Duration::from_millis(10)),
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;
    let mut procs = Procs(vec![spawn(bin, &config, &["serve"], &dir, "serve")?]);
    let out_topic = format!("{prefix}check-events");
    let t0 = Instant::now();
    let skipped = read_until(boot, &out_topic, events, Duration::from_secs(300))?;
    let wall = t0.elapsed();
    let ts: Vec<i64> = skipped.iter().map(|(t, _)| *t).collect();
    let last_in = read_all(boot, &jobs, events)?.iter().map(|(t, _)| *t).max().unwrap_or(0);
    let (lo, hi) = (ts.iter().min().copied().unwrap_or(0), ts.iter().max().copied().unwrap_or(0));
    println!("ingest: {events} job events needing no check, backlog consumed by a fresh service");
    println!(
        "  {:.0} events/s from the first CheckSkipped to the last ({} ms); {:.0} events/s including start-up ({:.1} s wall, backlog published {} ms before the last output)",
        events as f64 / ((hi - lo).max(1) as f64 / 1000.0),
        hi - lo,
        events as f64 / wall.as_secs_f64(),
        wall.as_secs_f64(),
        hi - last_in
    );

    // 2. Latency: runs one after another on two CPU agents (all-reduce, one worker per node).
    procs.0.push(spawn(
        bin,
        &config,
        &[
            "agent",
            "--node",
            "bench-a",
            "--device",
            "cpu",
            "--nproc-per-node",
            "1",
            "--work-dir",
            &dir.join("a").to_string_lossy(),
        ],
        &dir,
        "a",
    )?);
    procs.0.push(spawn(
        bin,
        &config,
        &[
            "agent",
            "--node",
            "bench-b",
            "--device",
            "cpu",
            "--nproc-per-node",
            "1",
            "--work-dir",
            &dir.join("b").to_string_lossy(),
        ],
        &dir,
        "b",
    )?);
    std::thread::sleep(Duration::from_secs(3));
    let mut seen = events;
    for i in 0..runs {
        let ev = event(
            &format!("run-{i}"),
            &format!("run-job-{i}"),
            true,
            "--micro-benchmarks=all-reduce --sanity-check-max-time=1",
        );
        producer.send(BaseRecord::<(), str>::to(&jobs).payload(&ev)).map_err(|(e, _)| e)?;
        producer.flush(Duration::from_secs(10))?;
        seen += 2; // SanityCheckStarted and the verdict
        read_until(boot, &out_topic, seen, Duration::from_secs(120))?;
    }
    let outs = read_all(boot, &out_topic, seen)?;
    let ins = read_all(boot, &jobs, events + runs)?;
    let reports = read_all(boot, &format!("{prefix}agent-reports"), 0)?;
    let in_ts: HashMap<String, i64> =
        ins.iter().map(|(t, v)| (v["event_id"].as_str().unwrap_or("").to_string(), *t)).collect();
    let mut last_result: HashMap<String, i64> = HashMap::new();
    for (t, signed) in &reports {
        // Reports travel in signed envelopes: the report is the envelope's payload.
        let v: Value = signed["payload"].as_str().and_then(|p| serde_json::from_str(p).ok()).unwrap_or(Value::Null);
        if v["type"] == "Result" {
            let e = last_result.entry(v["run_id"].as_str().unwrap_or("").to_string()).or_insert(0);
            *e = (*e).max(*t);
        }
    }
    let (mut to_checking, mut to_passed, mut failed) = (Vec::new(), Vec::new(), 0);
    for (t, v) in &outs {
        let run = v["run_id"].as_str().unwrap_or("");
        match v["type"].as_str() {
            Some("SanityCheckStarted") => {
                to_checking.push(t - in_ts.get(v["cause_event_id"].as_str().unwrap_or("")).copied().unwrap_or(*t))
            }
            Some("CheckPassed") => to_passed.push(t - last_result.get(run).copied().unwrap_or(*t)),
            Some("CheckFailed") => failed += 1,
            _ => {}
        }
    }
    println!("latency over {runs} runs ({failed} failed), milliseconds:");
    println!("  job event -> SanityCheckStarted (Checking): {}", pct(&mut to_checking));
    println!("  last agent result -> CheckPassed:           {}", pct(&mut to_passed));
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The service and agents started here; stopped (SIGTERM, then SIGKILL) however main ends.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = nix_term(p);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        for p in &mut self.0 {
            while matches!(p.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

fn event(id: &str, job: &str, enabled: bool, args: &str) -> String {
    let nodes = json!([{ "name": "bench-a", "address": "127.0.0.1", "gpus": 1 }, { "name": "bench-b", "address": "127.0.0.1", "gpus": 1 }]);
    json!({ "version": 1, "type": "JobResourcesAllocated", "event_id": id, "job_id": job, "workspace_id": "bench", "attempt": 0,
            "nodes": nodes, "settings": { "EnableSanityCheck": enabled, "SanityCheckArgs": args } })
    .to_string()
}

fn spawn(bin: &str, config: &std::path::Path, args: &[&str], dir: &std::path::Path, name: &str) -> Res<Child> {
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    Ok(Command::new(bin)
        .args(args)
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?)
}

fn nix_term(c: &Child) -> std::io::Result<()> {
    let status = Command::new("kill").arg("-TERM").arg(c.id().to_string()).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other("kill failed"))
    }
}

/// Every message of `topic` (one partition) now there, as (timestamp ms, JSON); at least `at_least`.
fn read_all(boot: &str, topic: &str, at_least: usize) -> Res<Vec<(i64, Value)>> {
    read_until(boot, topic, at_least, Duration::from_secs(30))
}

/// Reads `topic` from the start until it holds at least `n` messages and everything up to its
/// end (high watermark) has been read.
fn read_until(boot: &str, topic: &str, n: usize, limit: Duration) -> Res<Vec<(i64, Value)>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", boot)
        .set("group.id", "bench-reader")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let start = Instant::now();
    let mut out = Vec::new();
    let mut next = 0i64;
    while start.elapsed() < limit {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let v: Value = m.payload().and_then(|p| serde_json::from_slice(p).ok()).unwrap_or(Value::Null);
                out.push((m.timestamp().to_millis().unwrap_or(0), v));
                next = m.offset() + 1;
            }
            Some(Err(e)) => return Err(e.into()),
            // Caught up with what was fetched: done once the end of the topic is reached.
            None if out.len() >= n => {
                let (_, high) = c.fetch_watermarks(topic, 0, Duration::from_secs(10))?;
                if next >= high {
                    return Ok(out);
                }
            }
            None => {}
        }
    }
    Err(format!("only {} of {n} messages on {topic} within {limit:?}", out.len()).into())
}

fn pct(v: &mut [i64]) -> String {
    if v.is_empty() {
        return "no samples".into();
    }
    v.sort_unstable();
    let at = |p: f64| v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1];
    format!("p50 {} ms, p99 {} ms, max {} ms ({} samples)", at(0.5), at(0.99), v[v.len() - 1], v.len())
}
