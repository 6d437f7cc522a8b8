//! Re-check before isolation and quarantine through the real service, broker and CPU agents
//! (docs/fleet.md): a slow rank's node is re-checked alone and not isolated when the re-check
//! passes; the third failure in five runs quarantines it without a re-check; a wrong result
//! isolates at once (SQLite). On PostgreSQL, a re-check that fails again isolates the node,
//! after the job's own CheckFailed.

use gpusanity_testkit::svc;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use svc::{Reader, World};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 10.0\ndeadline_grace_s = 10.0";
/// Rank 1 (node rep-b) runs every timed product eight times: GEMM_SLOW against its peer.
const SLOW_B: &str = "--micro-benchmarks=gemm --sanity-check-envs=GPUSANITY_FAULT=gemm-slow@1";
const LIMIT: Duration = Duration::from_secs(60);

/// Waits until `query` returns `want` rows.
fn wait_rows(w: &World, query: &str, want: usize) -> Vec<String> {
    let start = Instant::now();
    loop {
        let rows = w.sql(query);
        if rows.len() >= want {
            return rows;
        }
        assert!(start.elapsed() < LIMIT, "{query}: {rows:?} after {LIMIT:?}\n{}", w.log("serve"));
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn failed(out: &mut Reader, job: &str) -> Value {
    out.wait_for(LIMIT, "CheckFailed", |v| {
        v["job_id"] == job && (v["type"] == "CheckFailed" || v["type"] == "CheckPassed")
    })
}

#[test]
fn a_slow_node_is_rechecked_then_quarantined_and_a_wrong_result_isolates_at_once() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(FAST, &["rep-a", "rep-b"]);
    for (i, job) in ["rep-1", "rep-2"].into_iter().enumerate() {
        w.allocate(&format!("rep-ev-{i}"), job, SLOW_B);
        let f = failed(&mut out, job);
        assert_eq!((&f["type"], &f["faulty_nodes"]), (&json!("CheckFailed"), &json!(["rep-b"])), "{f:#}");
        // The re-check of rep-b alone (without the failed run's fault injection) passes.
        let cleared = wait_rows(&w, "SELECT reason FROM node_decisions WHERE decision = 'cleared'", i + 1);
        assert!(cleared[i].contains("passed: not isolated"), "{cleared:?}");
    }
    let rechecks = w.sql("SELECT r.nodes FROM runs r WHERE r.recheck_of IS NOT NULL AND r.state = 'CheckPassed'");
    assert_eq!(rechecks.len(), 2, "{rechecks:?}");
    assert!(rechecks.iter().all(|n| n.contains("rep-b") && !n.contains("rep-a")), "{rechecks:?}");
    let started = w.sql("SELECT reason FROM node_decisions WHERE decision = 'rechecking' ORDER BY at");
    assert_eq!(started.len(), 2, "{started:?}");
    assert!(started[1].contains("failed 2 of its last 2 runs"), "{started:?}");
    // A re-check publishes no verdict of its own, and nothing was isolated.
    out.drain(Duration::from_millis(500));
    assert!(out.seen.iter().all(|v| v["type"] != "NodeIsolated"), "{:#?}", out.seen);
    let verdicts = out.seen.iter().filter(|v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed").count();
    assert_eq!(verdicts, 2, "{:#?}", out.seen);

    // The third failure in five runs: quarantined, no re-check.
    w.allocate("rep-ev-3", "rep-3", SLOW_B);
    failed(&mut out, "rep-3");
    let iso = out.wait_for(LIMIT, "NodeIsolated", |v| v["type"] == "NodeIsolated");
    assert_eq!((&iso["node"], &iso["job_id"]), (&json!("rep-b"), &json!("rep-3")), "{iso:#}");
    assert_eq!(iso["codes"], json!(["GEMM_SLOW"]), "{iso:#}");
    let d = &iso["decision"];
    assert_eq!((&d["basis"], &d["failures"], &d["window"]), (&json!("quarantine"), &json!(3), &json!(3)), "{iso:#}");
    assert!(iso["reason"].as_str().unwrap_or("").contains("quarantine: failed 3 of its last 3 runs"), "{iso:#}");
    assert_eq!(w.sql("SELECT run_id FROM runs WHERE recheck_of IS NOT NULL").len(), 2, "no third re-check");

    // A wrong result on rep-a: definitive, isolated at once.
    w.allocate("rep-ev-4", "rep-4", "--micro-benchmarks=gemm --sanity-check-envs=GPUSANITY_FAULT=gemm-wrong@0");
    failed(&mut out, "rep-4");
    let iso = out.wait_for(LIMIT, "NodeIsolated", |v| v["type"] == "NodeIsolated" && v["job_id"] == "rep-4");
    assert_eq!((&iso["node"], &iso["decision"]["basis"]), (&json!("rep-a"), &json!("definitive")), "{iso:#}");
    assert_eq!(iso["decision"]["failed_run"], iso["run_id"], "{iso:#}");
    assert_eq!(w.sql("SELECT run_id FROM runs WHERE recheck_of IS NOT NULL").len(), 2, "no re-check");
    // Each decision in the node's history, as stored.
    let b = w.sql("SELECT decision || ':' || basis FROM node_decisions WHERE node_name = 'rep-b' ORDER BY at, id");
    let want = ["rechecking:recheck", "cleared:recheck_passed", "rechecking:recheck", "cleared:recheck_passed"];
    assert_eq!(b[..4], want, "{b:?}");
    assert_eq!(b[4], "isolated:quarantine", "{b:?}");
    looked_at(&w);
    w.shutdown();
}

/// The same record through the API and the metrics, and the fleet's figures through /v1/fleet
/// (the pages need a login in this world: not looked at here).
fn looked_at(w: &World) {
    let (code, rep) = w.http_call("GET", "/v1/nodes/rep-b/reputation?window=5", Some(svc::TOKEN), None).expect("HTTP");
    assert_eq!(code, 200, "{rep:#}");
    let r = &rep["reputation"];
    assert_eq!((&r["runs"], &r["failures"]), (&json!(4), &json!(3)), "{rep:#}");
    assert_eq!((&r["by_code"][0]["code"], &r["by_code"][0]["n"]), (&json!("GEMM_SLOW"), &json!(3)), "{rep:#}");
    assert_eq!(rep["decisions"].as_array().map(Vec::len), Some(5), "{rep:#}");
    for bad in ["?window=0", "?window=1001", "?window=-1", "?window=x"] {
        let path = format!("/v1/nodes/rep-b/reputation{bad}");
        assert_eq!(w.http_call("GET", &path, Some(svc::TOKEN), None).expect("HTTP").0, 400, "{bad}");
    }
    assert_eq!(w.http_call("GET", "/v1/nodes/rep-b/reputation", None, None).expect("HTTP").0, 401);
    let (code, metrics) = w.http_text("/metrics", Some(svc::TOKEN)).expect("metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("gpusanity_node_failures{node=\"rep-b\"} 3"), "{metrics}");
    assert!(metrics.contains("gpusanity_nodes_failing 2"), "{metrics}");
    // The fleet page over samples of 8 nodes, one of them 10% slow.
    let key = r#"{"device":"NVIDIA H200","driver":580,"check":"gemm","metric":"tflops","size":8192,"max_bytes":null,"ranks_per_node":8,"single_node":true,"link":null}"#;
    // Learned in the last minute (the percentile metric reads the last 24 h).
    let now = chrono::Utc::now().timestamp_millis() - 60_000;
    for i in 0..80 {
        let node = i % 8;
        let v = if node == 7 { 612.0 } else { 680.0 } + f64::from(i % 5);
        let at = now + i64::from(i);
        w.sql(&format!(
            "INSERT INTO fleet_samples (run_id, rank, fkey, node_name, value, at) VALUES ('f-{i}', 0, '{key}', 'gpu-{node}', {v}, {at})"
        ));
    }
    let (code, fleet) = w.http_call("GET", "/v1/fleet", Some(svc::TOKEN), None).expect("HTTP");
    assert_eq!(code, 200, "{fleet:#}");
    assert_eq!(fleet["keys"][0]["samples"], 80, "{fleet:#}");
    assert_eq!(fleet["keys"][0]["lowest"][0]["node"], "gpu-7", "{fleet:#}");
    figures_looked_at(w);
}

/// The slow node's figures over time against the baseline, and its percentile as a metric.
fn figures_looked_at(w: &World) {
    let (code, f) = w.http_call("GET", "/v1/nodes/gpu-7/figures", Some(svc::TOKEN), None).expect("HTTP");
    assert_eq!(code, 200, "{f:#}");
    let k = &f["keys"][0];
    assert_eq!(k["points"].as_array().map(Vec::len), Some(10), "{f:#}");
    assert_eq!((&k["baseline"]["samples"], &k["key"]["check"]), (&json!(80), &json!("gemm")), "{f:#}");
    let values: Vec<f64> =
        k["points"].as_array().unwrap_or(&Vec::new()).iter().filter_map(|p| p["value"].as_f64()).collect();
    assert_eq!(values.first().copied(), Some(612.0 + 7.0 % 5.0), "oldest first: {values:?}");
    assert!(k["percentile"].as_f64().is_some_and(|p| p < 1.0), "{f:#}");
    assert!(k["floor"].as_f64().is_some_and(|fl| fl > 620.0), "{f:#}");
    let (code, one) = w.http_call("GET", "/v1/nodes/gpu-7/figures?limit=3", Some(svc::TOKEN), None).expect("HTTP");
    assert_eq!((code, one["keys"][0]["points"].as_array().map(Vec::len)), (200, Some(3)), "{one:#}");
    let (code, none) = w.http_call("GET", "/v1/nodes/no-such-node/figures", Some(svc::TOKEN), None).expect("HTTP");
    assert_eq!((code, &none["keys"]), (200, &json!([])), "{none:#}");
    for bad in ["?limit=0", "?limit=2001", "?limit=-1", "?limit=x", "?limit=99999999999"] {
        let path = format!("/v1/nodes/gpu-7/figures{bad}");
        assert_eq!(w.http_call("GET", &path, Some(svc::TOKEN), None).expect("HTTP").0, 400, "{bad}");
    }
    assert_eq!(w.http_call("GET", "/v1/nodes/gpu-7/figures", None, None).expect("HTTP").0, 401);
    let (_, metrics) = w.http_text("/metrics", Some(svc::TOKEN)).expect("metrics");
    let pct = |node: &str| {
        let series = format!("gpusanity_node_fleet_percentile{{check=\"gemm\",node=\"{node}\"}} ");
        let line = metrics.lines().find(|l| l.starts_with(&series));
        line.and_then(|l| l[series.len()..].parse::<f64>().ok())
    };
    assert!(pct("gpu-7").is_some_and(|p| p < 1.0), "{metrics}");
    assert!(pct("gpu-0").is_some_and(|p| p > 10.0), "{metrics}");
    assert!(metrics.contains("gpusanity_nodes_judged 8"), "{metrics}");
}

#[test]
fn a_recheck_that_fails_again_isolates_the_node_after_the_jobs_verdict_on_postgresql() {
    let _g = svc::common::serial();
    let url = svc::postgres_database("gpusanity_recheck");
    // The re-check's own fault (test rigs): node rep-d's product comes out wrong.
    let recheck = "\n[coordinator.recheck]\nextra_args = \"--sanity-check-envs=GPUSANITY_FAULT=gemm-wrong@0\"";
    let mut w = World::new(Some(url), &format!("{FAST}{recheck}"));
    let mut out = w.start(&["rep-c", "rep-d"]);
    w.allocate("rep-ev-5", "rep-5", SLOW_B);
    let f = failed(&mut out, "rep-5");
    assert_eq!(f["faulty_nodes"], json!(["rep-d"]), "{f:#}");
    let iso = out.wait_for(LIMIT, "NodeIsolated", |v| v["type"] == "NodeIsolated");
    let pos = |t: &str| out.seen.iter().position(|v| v["type"] == t);
    assert!(pos("CheckFailed") < pos("NodeIsolated"), "the job's verdict first: {:#?}", out.seen);
    assert_eq!(iso["node"], "rep-d", "{iso:#}");
    let d = &iso["decision"];
    assert_eq!((&d["basis"], &d["failed_run"]), (&json!("reproduced"), &f["run_id"]), "{iso:#}");
    assert_eq!(d["recheck_run"], iso["run_id"], "{iso:#}");
    assert_eq!(iso["codes"], json!(["GEMM_WRONG_RESULT"]), "{iso:#}");
    let origin =
        w.sql(&format!("SELECT recheck_of FROM runs WHERE run_id = '{}'", iso["run_id"].as_str().unwrap_or("")));
    assert_eq!(origin, [f["run_id"].as_str().unwrap_or("-")]);
    // One verdict event for the job: the re-check publishes none.
    out.drain(Duration::from_millis(500));
    assert_eq!(out.of("rep-5", "CheckFailed").len(), 1, "{:#?}", out.seen);
    w.shutdown();
}

/// Rank 1 (node lk-b) closes its front-end listener: NET_FRONTEND_UNREACHABLE names lk-b.
const CLOSED_B: &str = "--micro-benchmarks=network-connectivity --sanity-check-envs=GPUSANITY_FAULT=net-closed@1";

#[test]
fn a_link_finding_is_rechecked_paired_with_a_known_good_node_and_only_the_suspect_is_isolated() {
    let _g = svc::common::serial();
    // The re-check's own fault (test rigs): the node under re-check, its first, closes its port.
    let recheck = "\n[coordinator.recheck]\nextra_args = \"--sanity-check-envs=GPUSANITY_FAULT=net-closed@0\"";
    let (mut w, mut out) = World::running(&format!("{FAST}{recheck}"), &["lk-a", "lk-b"]);
    // No history yet: no node of the run is known to be good, so nothing to pair a link
    // re-check with; lk-b is isolated at once and the decision says why.
    w.allocate("lk-ev-1", "lk-1", CLOSED_B);
    let f = failed(&mut out, "lk-1");
    assert_eq!(f["faulty_nodes"], json!(["lk-b"]), "{f:#}");
    let iso = out.wait_for(LIMIT, "NodeIsolated", |v| v["type"] == "NodeIsolated" && v["job_id"] == "lk-1");
    assert_eq!((&iso["node"], &iso["decision"]["basis"]), (&json!("lk-b"), &json!("immediate")), "{iso:#}");
    assert!(iso["reason"].as_str().unwrap_or("").contains("no node of the run known to be good"), "{iso:#}");
    assert_eq!(w.sql("SELECT run_id FROM runs WHERE recheck_of IS NOT NULL").len(), 0, "no re-check alone");

    // A clean run: both nodes pass, lk-a is now known to be good.
    w.allocate("lk-ev-2", "lk-2", "--micro-benchmarks=network-connectivity");
    let p = failed(&mut out, "lk-2");
    assert_eq!(p["type"], "CheckPassed", "{p:#}");

    // The link finding again: lk-b is re-checked paired with lk-a (lk-b first); the pair's run
    // fails on lk-b's port and isolates lk-b, never its partner.
    w.allocate("lk-ev-3", "lk-3", CLOSED_B);
    let f = failed(&mut out, "lk-3");
    assert_eq!(f["faulty_nodes"], json!(["lk-b"]), "{f:#}");
    let iso = out.wait_for(LIMIT, "NodeIsolated", |v| v["type"] == "NodeIsolated" && v["job_id"] == "lk-3");
    assert_eq!(iso["node"], "lk-b", "{iso:#}");
    let d = &iso["decision"];
    assert_eq!((&d["basis"], &d["failed_run"]), (&json!("reproduced"), &f["run_id"]), "{iso:#}");
    assert_eq!(iso["codes"], json!(["NET_FRONTEND_UNREACHABLE"]), "{iso:#}");
    let pair = w.sql(&format!("SELECT nodes FROM runs WHERE run_id = '{}'", d["recheck_run"].as_str().unwrap_or("")));
    assert_eq!(pair.len(), 1, "{pair:?}");
    let (a, b) = (pair[0].find("lk-a"), pair[0].find("lk-b"));
    assert!(b.is_some() && a.is_some() && b < a, "lk-b first, then its partner lk-a: {pair:?}");
    let why = w.sql("SELECT reason FROM node_decisions WHERE decision = 'rechecking'");
    assert!(why.len() == 1 && why[0].contains("paired with known-good node lk-a"), "{why:?}");
    out.drain(Duration::from_millis(500));
    let isolated: Vec<&Value> = out.seen.iter().filter(|v| v["type"] == "NodeIsolated").collect();
    assert!(isolated.iter().all(|v| v["node"] == "lk-b"), "the partner is never isolated: {isolated:#?}");
    assert_eq!(isolated.len(), 2, "{isolated:#?}");
    w.shutdown();
}
