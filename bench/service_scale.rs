//! One job of N nodes through the real service (bench/service_scale.sh runs this against a
//! `gpusanity serve` it started): publishes the job event, plays every node's agent
//! (bench/sim_agents.rs: the real protocol over Kafka, an agent identity per node, node 0's
//! real report in the real chunking path), and prints per phase the wall time from the event
//! and the service's peak RSS, then the output events of the job by type. Exits non-zero
//! unless every node got one task, no command was refused or cancelled, node 0's report was
//! delivered, and the output topic holds exactly one SanityCheckStarted and one verdict.
//!
//! Usage: service_scale BOOTSTRAP TOPIC_PREFIX KEYS_FILE NODES SERVE_PID [GPUS_PER_NODE]

#[path = "sim_agents.rs"]
mod sim_agents;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use gpusanity_bus::kafka::KafkaConn;
use gpusanity_service::auth::Keyring;
use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::{json, Value};
use sim_agents::sim_ranks::peak_rss_mib;
use sim_agents::{Fleet, Tally};

/// The whole job's limit: past it the bench fails.
const LIMIT: Duration = Duration::from_secs(900);
/// How long the output topic is watched after the verdict for a duplicate.
const AFTER: Duration = Duration::from_secs(10);

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [boot, prefix, keys, nodes, pid, rest @ ..] = args.as_slice() else {
        bail!("usage: service_scale BOOTSTRAP TOPIC_PREFIX KEYS_FILE NODES SERVE_PID [GPUS_PER_NODE]");
    };
    let nnodes: usize = nodes.parse().context("NODES")?;
    let gpus: usize = rest.first().map(|g| g.parse()).transpose().context("GPUS_PER_NODE")?.unwrap_or(8);
    let rss = || peak_rss_mib(pid);
    let conn = KafkaConn::plain(boot);
    let topic = |name: &str| format!("{prefix}{name}");

    let t = Instant::now();
    let report = sim_agents::report(nnodes, gpus)?;
    println!(
        "node 0's report: {} ranks, {} findings, status {:?}, built in {:.1} s",
        report.ranks.len(),
        report.findings.len(),
        report.status,
        t.elapsed().as_secs_f64()
    );

    let tally = Arc::new(Mutex::new(Tally::default()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let fleet = Fleet {
        nnodes,
        conn: conn.clone(),
        agent_tasks: topic("agent-tasks"),
        agent_reports: topic("agent-reports"),
        ring: Keyring::load(std::path::Path::new(keys))?,
        heartbeat: Duration::from_secs(1),
        max_age: Duration::from_secs(600),
        telemetry: None,
    };
    let agents = tokio::spawn(fleet.run(report, tally.clone(), stopped));
    let output = topic("check-events");
    let reader = from_start(&conn, &output)?;
    // Two rounds of heartbeats: the service knows every agent before the job comes.
    tokio::time::sleep(Duration::from_millis(2500)).await;

    let job = format!("scale-job-{nnodes}");
    let names: Vec<Value> = (0..nnodes)
        .map(|k| json!({ "name": sim_agents::node_name(k), "address": "127.0.0.1", "gpus": gpus }))
        .collect();
    let event = json!({ "version": 1, "type": "JobResourcesAllocated", "event_id": format!("{job}-ev"), "job_id": job,
        "workspace_id": "bench", "attempt": 0, "nodes": names,
        "settings": { "EnableSanityCheck": true, "SanityCheckArgs": "--sanity-check-max-time=10" } })
    .to_string();
    println!("job event: {nnodes} nodes, {} bytes", event.len());
    let producer = gpusanity_bus::kafka::producer(&conn)?;
    let t0 = Instant::now();
    producer
        .send(FutureRecord::<str, str>::to(&topic("job-events")).key(&job).payload(&event), Duration::from_secs(30))
        .await
        .map_err(|(e, _)| anyhow::anyhow!("publishing the job event: {e}"))?;
    // (what, when, serve's peak RSS then), printed in time order at the end.
    let mut phases: Vec<(String, Instant, f64)> = Vec::new();
    let mut types: BTreeMap<String, usize> = BTreeMap::new();
    let (mut started, mut verdict): (Option<Instant>, Option<Instant>) = (None, None);
    let mut shown = [false; 3];
    loop {
        let snapshot = tally.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let marks = [
            ("node 0's task", snapshot.first_task),
            ("every node's task", snapshot.all_tasks),
            ("node 0's result and report delivered", snapshot.report_sent),
        ];
        for (i, (what, at)) in marks.iter().enumerate() {
            if let (false, Some(at)) = (shown[i], at) {
                shown[i] = true;
                phases.push((what.to_string(), *at, rss()));
            }
        }
        if let Some(e) = snapshot.errors.first() {
            bail!("the simulated agents: {e}");
        }
        let done_at = verdict.map(|v| v + AFTER);
        if done_at.is_some_and(|d| Instant::now() >= d) || t0.elapsed() > LIMIT {
            break;
        }
        let next = tokio::time::timeout(Duration::from_millis(200), reader.recv()).await;
        let Ok(m) = next else { continue };
        let m = m.context("reading the output topic")?;
        let v: Value = m.payload().and_then(|p| serde_json::from_slice(p).ok()).unwrap_or(Value::Null);
        if v["job_id"] != job.as_str() {
            continue;
        }
        let kind = v["type"].as_str().unwrap_or("?").to_string();
        let now = Instant::now();
        match kind.as_str() {
            "SanityCheckStarted" if started.is_none() => {
                started = Some(now);
                phases.push(("SanityCheckStarted".into(), now, rss()));
            }
            "CheckPassed" | "CheckFailed" if verdict.is_none() => {
                verdict = Some(now);
                phases.push((format!("verdict ({kind}, stored with the report)"), now, rss()));
                println!("verdict summary: {}", v["summary"].as_str().unwrap_or(""));
            }
            _ => {}
        }
        *types.entry(kind).or_default() += 1;
    }
    let _ = stop.send(true);
    agents.await.context("the simulated agents")??;
    let g = tally.lock().unwrap_or_else(|p| p.into_inner()).clone();
    phases.sort_by_key(|p| p.1);
    for (what, at, mib) in &phases {
        println!(
            "phase {what:<44} {:>7.2} s after the job event, serve peak RSS {mib:>6.1} MiB",
            at.duration_since(t0).as_secs_f64()
        );
    }
    println!("output events of the job: {types:?}");
    println!(
        "agents: {} of {nnodes} tasked, {} repeated, {} cancels, {} refused, {} heartbeats; node 0's report {} bytes of JSON in {} chunks",
        g.tasked, g.repeated, g.cancels, g.refused, g.heartbeats, g.report_json_bytes, g.report_chunks
    );
    println!("serve peak RSS {:.1} MiB", rss());
    if let Some(run) = &g.run_id {
        println!("RUN_ID={run}");
    }
    let verdicts = types.get("CheckPassed").unwrap_or(&0) + types.get("CheckFailed").unwrap_or(&0);
    let ok = types.get("SanityCheckStarted") == Some(&1)
        && verdicts == 1
        && g.tasked == nnodes
        && g.repeated == 0
        && g.cancels == 0
        && g.refused == 0
        && g.report_sent.is_some();
    if !ok {
        bail!("the job did not go through exactly once (see above)");
    }
    Ok(())
}

/// A consumer of every partition of `topic` from its start.
fn from_start(conn: &KafkaConn, topic: &str) -> Result<StreamConsumer> {
    let c: StreamConsumer = conn
        .client_config()
        .set("group.id", format!("scale-bench-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for (p, _) in gpusanity_bus::kafka::partition_ends(c.client(), topic)? {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    c.assign(&tpl)?;
    Ok(c)
}
