//! A job of 256 nodes x 8 ranks through the real service and broker (the CI-sized version of
//! bench/service_scale.sh, which runs 2,048): every node's agent is simulated over the real
//! protocol (bench/sim_agents.rs) with a key of its own, node 0 sends a real report of 2,048
//! ranks in the real chunking path. Exactly one SanityCheckStarted and one CheckPassed, every
//! node one task and no cancel, and the stored report is the one sent, every rank of it.

#[path = "../../bench/sim_agents.rs"]
pub(crate) mod sim_agents;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use gpusanity_common::report::Report;
use gpusanity_service::auth::Keyring;
use gpusanity_testkit::svc;
use sim_agents::{Fleet, SimTelemetry, Tally};
use svc::{allocated, World, TOKEN};

const NODES: usize = 256;
const GPUS: usize = 8;

/// Simulated agents of `nodes` nodes running on a thread of their own, and how to stop them.
pub(crate) struct SimFleet {
    pub tally: Arc<Mutex<Tally>>,
    pub stop: tokio::sync::watch::Sender<bool>,
    pub agents: std::thread::JoinHandle<anyhow::Result<()>>,
}

/// Starts the simulated agents of `nodes` nodes of the world (their keys written by
/// [`node_keys_for`]): node 0 sends `report` once every node has its task; with `telemetry`,
/// each node publishes synthetic telemetry once watched.
pub(crate) fn start_fleet(w: &World, nodes: usize, report: Report, telemetry: Option<SimTelemetry>) -> SimFleet {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let fleet = Fleet {
        nnodes: nodes,
        conn: gpusanity_bus::kafka::KafkaConn::plain(svc::broker()),
        agent_tasks: w.topic("agent-tasks"),
        agent_reports: w.topic("agent-reports"),
        ring: Keyring::load(&w.agent_keys()).expect("keys"),
        heartbeat: Duration::from_millis(500),
        max_age: Duration::from_secs(600),
        telemetry,
    };
    let agents = {
        let tally = tally.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().expect("runtime");
            rt.block_on(fleet.run(report, tally, stopped))
        })
    };
    SimFleet { tally, stop, agents }
}

/// A key per node (`nodes = ["node-K"]`), mode 0600, in place of the world's cluster key.
fn node_keys(path: &std::path::Path) {
    node_keys_for(path, NODES);
}

/// [`node_keys`] for `nodes` nodes.
pub(crate) fn node_keys_for(path: &std::path::Path, nodes: usize) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::remove_file(path).expect("the world's key file");
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).expect("key file");
    for k in 0..nodes {
        let secret: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
        let name = sim_agents::node_name(k);
        writeln!(f, "[[key]]\nid = \"{name}\"\nsecret = \"{secret}\"\nnodes = [\"{name}\"]").expect("key file");
    }
}

#[test]
fn a_256_node_job_goes_through_the_service_once_with_its_whole_report() {
    let _g = svc::common::serial();
    let mut w = World::new(None, "");
    node_keys(&w.agent_keys());
    w.serve();
    let mut out = w.reader("check-events");
    let report = sim_agents::report(NODES, GPUS).expect("node 0's report");
    let ranks = report.ranks.len();
    let SimFleet { tally, stop, agents } = start_fleet(&w, NODES, report.clone(), None);
    // Every agent heard before the job comes (the service waits for them otherwise, up to agent_wait_s).
    std::thread::sleep(Duration::from_secs(2));
    let names: Vec<String> = (0..NODES).map(sim_agents::node_name).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    w.publish(allocated("scale-1", "job-scale", &names, "--sanity-check-max-time=5").as_bytes());
    let started = out.wait_for(Duration::from_secs(60), "SanityCheckStarted", |v| {
        v["type"] == "SanityCheckStarted" && v["job_id"] == "job-scale"
    });
    let run_id = started["run_id"].as_str().expect("run_id").to_string();
    let end = out.wait_for(Duration::from_secs(120), "the verdict", |v| {
        v["run_id"] == run_id.as_str() && (v["type"] == "CheckFailed" || v["type"] == "CheckPassed")
    });
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    // Anything repeated would come within the outbox's rounds: a few seconds more.
    out.drain(Duration::from_secs(5));
    let _ = stop.send(true);
    agents.join().expect("the agents' thread").expect("the simulated agents");
    assert_eq!(out.of("job-scale", "SanityCheckStarted").len(), 1);
    assert_eq!(out.of("job-scale", "CheckPassed").len(), 1);
    assert!(out.of("job-scale", "CheckFailed").is_empty());
    let g = tally.lock().expect("tally").clone();
    assert_eq!((g.tasked, g.repeated, g.cancels, g.refused), (NODES, 0, 0, 0), "{g:?}");
    assert!(g.errors.is_empty() && g.report_sent.is_some(), "{g:?}");
    assert!(g.report_chunks >= 1, "a report of {ranks} ranks sent inline ({} bytes)", g.report_json_bytes);

    let (code, stored) = w.http_call("GET", &format!("/v1/runs/{run_id}/report"), Some(TOKEN), None).expect("HTTP");
    assert_eq!(code, 200);
    let stored: Report = serde_json::from_value(stored).expect("a report");
    assert_eq!(stored.ranks.len(), NODES * GPUS);
    assert!(stored.checks.iter().all(|c| c.ranks.len() == NODES * GPUS));
    // The report as sent (its figures within a float's last digits: JSON text between them).
    assert!(stored.run_id == run_id && stored.status == report.status && stored.summary == report.summary);
    assert!(stored.nodes == report.nodes && stored.ranks == report.ranks, "the nodes or ranks differ");
    assert!(stored.node_verdicts == report.node_verdicts && stored.findings == report.findings);
    assert_eq!(stored.checks.len(), report.checks.len());
    for (s, r) in stored.checks.iter().zip(&report.checks) {
        for (a, b) in s.ranks.iter().zip(&r.ranks) {
            assert!(a.rank == b.rank && a.status == b.status && a.metrics.len() == b.metrics.len(), "rank {}", b.rank);
            for (k, v) in &b.metrics {
                let got = a.metrics.get(k).copied().unwrap_or(f64::NAN);
                assert!((got - v).abs() <= v.abs() * 1e-12, "rank {} {k}: {got} stored, {v} sent", b.rank);
            }
        }
    }
    // Bounded memory: far below what an n x n table of 2,048 ranks would take.
    let rss = sim_agents::sim_ranks::peak_rss_mib(&w.pid("serve").to_string());
    assert!(rss > 0.0 && rss < 512.0, "serve's peak RSS {rss:.1} MiB");
    w.shutdown();
}
