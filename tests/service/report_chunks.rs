//! Node 0's report past the broker's message limit reaches the service whole, in chunks
//! (service/src/report_chunks.rs), through the real service and broker; node 0's agent is
//! played by the test, signing with the world's agent key as a real agent does. Chunks that
//! are forged, about another node, out of order or missing never make a report: a broken
//! stream ends the run without one, with the reason.

use gpusanity_testkit::svc;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpusanity_common::report::Report;
use gpusanity_common::wire::agent::{AgentReport, NodeResult, ReportBody};
use gpusanity_service::auth::{envelope, Direction, Keyring};
use gpusanity_service::report_chunks;
use svc::{allocated, Reader, World, TOKEN};

const QUICK: &str = "agent_timeout_s = 2.0\nagent_wait_s = 6.0\ndeadline_grace_s = 10.0";
const AGENT: &str = "sim-agent";

/// The example report with a note of `n` bytes that gzip cannot shrink below the limit.
fn large(n: usize) -> Report {
    let mut r: Report =
        serde_json::from_str(include_str!("../../docs/examples/report-cpu.json")).expect("example report");
    let mut s = String::with_capacity(n + 16);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while s.len() < n {
        // xorshift: text that does not compress much, the same on every run.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push_str(&format!("{x:016x}"));
    }
    // In notes of 512 KiB: the report page shows no single text over 1 MiB (reports/src/validate.rs).
    for (i, piece) in s.as_bytes().chunks(512 * 1024).enumerate() {
        let piece = String::from_utf8(piece.to_vec()).expect("hex digits");
        r.checks[0].ranks[0].notes.insert(format!("filler-{i:03}"), piece);
    }
    r
}

fn sealed(ring: &Keyring, node: &str, body: ReportBody) -> Vec<u8> {
    let r = AgentReport { version: 1, node: node.into(), agent_id: AGENT.into(), at: chrono::Utc::now(), body };
    envelope::seal(ring.first(), Direction::Report, serde_json::to_string(&r).expect("json")).into_bytes()
}

/// Heartbeats of the simulated agents until dropped.
struct Beats(Arc<AtomicBool>);

impl Beats {
    fn start(w: &World, nodes: &[&str]) -> Beats {
        let stop = Arc::new(AtomicBool::new(false));
        let (ring, topic) = (Keyring::load(&w.agent_keys()).expect("keys"), w.topic("agent-reports"));
        let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
        let s = stop.clone();
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                for n in &nodes {
                    let body = ReportBody::Heartbeat { address: "127.0.0.1".into(), run_id: None, elapsed_s: None };
                    svc::publish_to(&topic, &sealed(&ring, n, body));
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        });
        Beats(stop)
    }
}

impl Drop for Beats {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Starts a one-node run on `node` and waits until its task went to the simulated agent.
fn run_on(w: &World, out: &mut Reader, tasks: &mut Reader, event: &str, node: &str) -> String {
    w.publish(allocated(event, &format!("job-{event}"), &[node], "--sanity-check-max-time=2").as_bytes());
    let started = out.wait_for(Duration::from_secs(30), "SanityCheckStarted", |v| {
        v["type"] == "SanityCheckStarted" && v["job_id"] == format!("job-{event}").as_str()
    });
    let run_id = started["run_id"].as_str().expect("run_id").to_string();
    tasks.wait_for(Duration::from_secs(30), "the task", |v| v["payload"].as_str().is_some_and(|p| p.contains(&run_id)));
    run_id
}

fn verdict(out: &mut Reader, run_id: &str) -> serde_json::Value {
    out.wait_for(Duration::from_secs(40), "the verdict", |v| {
        v["run_id"] == run_id && (v["type"] == "CheckFailed" || v["type"] == "CheckPassed")
    })
}

#[test]
fn a_report_past_the_message_limit_reaches_the_service_whole_and_broken_streams_make_none() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(QUICK, &[]);
    let mut tasks = w.reader("agent-tasks");
    let ring = Keyring::load(&w.agent_keys()).expect("keys");
    let stranger =
        Keyring::parse(&format!("[[key]]\nid = \"test\"\nsecret = \"{}\"\n", "5a".repeat(32))).expect("ring");
    let _beats = Beats::start(&w, &["big-0", "gap-0"]);
    let publish = |bytes: &[u8]| w.publish_on("agent-reports", bytes);

    // A report larger than the producer's 8,000,000 bytes and the broker's 1 MiB.
    let run_id = run_on(&w, &mut out, &mut tasks, "big-1", "big-0");
    let report = large(9_000_000);
    let json_len = serde_json::to_vec(&report).expect("json").len();
    assert!(json_len > 8_000_000, "{json_len}");
    let (chunks, meta) = report_chunks::split(&report, &run_id, 0).expect("split");
    assert!(chunks.len() > 2, "{} chunks", chunks.len());
    publish(&sealed(
        &ring,
        "big-0",
        ReportBody::Started { run_id: run_id.clone(), node_rank: 0, master_port: Some(29500) },
    ));
    // Forged first: the same chunks signed with a key the service does not have, and signed
    // chunks about the run from a node that does not hold it; then a stream with a gap.
    let forged = report_chunks::split(&large(1_000_000), &run_id, 0).expect("split").0;
    for c in &forged {
        publish(&sealed(&stranger, "big-0", ReportBody::ReportChunk(c.clone())));
        publish(&sealed(&ring, "gap-0", ReportBody::ReportChunk(c.clone())));
    }
    publish(&sealed(&ring, "big-0", ReportBody::ReportChunk(chunks[0].clone())));
    publish(&sealed(&ring, "big-0", ReportBody::ReportChunk(chunks[2].clone())));
    // The whole stream from its first chunk starts it again; the result names it.
    for c in &chunks {
        publish(&sealed(&ring, "big-0", ReportBody::ReportChunk(c.clone())));
    }
    let result = NodeResult {
        run_id: run_id.clone(),
        node_rank: 0,
        exit_code: Some(1),
        report: None,
        report_chunks: Some(meta),
        error: None,
    };
    publish(&sealed(&ring, "big-0", ReportBody::Result(result)));
    let end = verdict(&mut out, &run_id);
    // The example's verdict: node 1 slow (gemm-slow@1), named in the report's findings.
    assert_eq!(end["type"], "CheckFailed", "{end:#}");
    let (code, stored) = w.http_call("GET", &format!("/v1/runs/{run_id}/report"), Some(TOKEN), None).expect("HTTP");
    assert_eq!(code, 200);
    let stored: Report = serde_json::from_value(stored).expect("a report");
    assert_eq!(stored, report, "the stored report differs from the one sent");
    // The run's page, with a browser session (the pages answer 303 to the login form without one).
    let (code, head, _) = crate::browser::login(w.http, TOKEN);
    assert_eq!(code, 303, "{head}");
    let session = crate::browser::header(&head, "set-cookie").and_then(|c| c.split(';').next()).expect("a session");
    let (code, _, page) =
        crate::browser::http(w.http, "GET", &format!("/ui/runs/{run_id}"), &format!("Cookie: {session}\r\n"), "");
    assert_eq!(code, 200, "{page}");

    // A stream whose last chunk never came: no report, and the run says why.
    let run_id = run_on(&w, &mut out, &mut tasks, "gap-1", "gap-0");
    let (chunks, meta) = report_chunks::split(&large(2_000_000), &run_id, 0).expect("split");
    for c in &chunks[..chunks.len() - 1] {
        publish(&sealed(&ring, "gap-0", ReportBody::ReportChunk(c.clone())));
    }
    let result = NodeResult {
        run_id: run_id.clone(),
        node_rank: 0,
        exit_code: Some(0),
        report: None,
        report_chunks: Some(meta),
        error: None,
    };
    publish(&sealed(&ring, "gap-0", ReportBody::Result(result)));
    let end = verdict(&mut out, &run_id);
    assert_eq!(end["type"], "CheckFailed", "{end:#}");
    assert!(end.to_string().contains("arrived incomplete"), "{end:#}");
    assert_eq!(w.http_call("GET", &format!("/v1/runs/{run_id}/report"), Some(TOKEN), None).expect("HTTP").0, 404);
    let log = w.log("serve");
    assert!(log.contains("chunk 2 came where chunk 1 was due"), "{log}");
    w.shutdown();
}
