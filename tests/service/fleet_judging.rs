//! The service judges its own runs against the fleet's baselines (docs/fleet.md, "Judging the
//! service's own runs"), through the real service, broker and CPU agents on SQLite: a run
//! before the fleet has enough samples is judged against the static floor alone and passes;
//! once the fleet's window holds enough samples from enough nodes (seeded here at 3 times
//! this machine's figure, as a fleet of faster nodes would have learned it), node 0's task
//! carries the baseline, the next run's GEMM figures fall below the fleet and the run fails
//! with BELOW_FLEET, each rank's entry naming the baseline it was judged against.

use gpusanity_testkit::svc;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use svc::{Reader, World};

/// Judging on, the baselines exported every half second; no re-check (the verdict is what is tested).
const CONFIG: &str = "agent_timeout_s = 2.0\nagent_wait_s = 10.0\ndeadline_grace_s = 10.0\n\
                      [coordinator.fleet]\njudge = true\nrefresh_s = 0.5\n[coordinator.recheck]\nenabled = false";
const GEMM: &str = "--micro-benchmarks=gemm";
const LIMIT: Duration = Duration::from_secs(60);

fn verdict(out: &mut Reader, job: &str) -> Value {
    out.wait_for(LIMIT, "a verdict", |v| {
        v["job_id"] == job && (v["type"] == "CheckFailed" || v["type"] == "CheckPassed")
    })
}

fn report(w: &World, job: &str) -> Value {
    let rows = w.sql(&format!("SELECT report FROM runs WHERE job_id = '{job}' AND report IS NOT NULL"));
    assert_eq!(rows.len(), 1, "{job}: {rows:?}");
    serde_json::from_str(&rows[0]).expect("stored report")
}

fn codes(r: &Value) -> Vec<String> {
    r["findings"]
        .as_array()
        .map(|f| f.iter().map(|f| f["code"].as_str().unwrap_or("").to_string()).collect())
        .unwrap_or_default()
}

#[test]
fn a_run_is_judged_against_the_fleets_baseline_once_the_fleet_has_learned_one() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(CONFIG, &["fj-a", "fj-b"]);
    // Two samples (one per node): far fewer than a baseline needs; the static floor alone judges.
    w.allocate("fj-ev-1", "fj-1", GEMM);
    let v = verdict(&mut out, "fj-1");
    assert_eq!(v["type"], "CheckPassed", "{v:#}\n{}", w.log("serve"));
    assert!(!codes(&report(&w, "fj-1")).contains(&"BELOW_FLEET".to_string()));
    let learned = w.sql(
        "SELECT fkey || '|' || CAST(value AS TEXT) FROM fleet_samples WHERE run_id IN \
                         (SELECT run_id FROM runs WHERE job_id = 'fj-1')",
    );
    assert_eq!(learned.len(), 2, "one GEMM figure per rank: {learned:?}");
    let (key, _) = learned[0].rsplit_once('|').expect("key|value");
    let best = learned.iter().filter_map(|l| l.rsplit_once('|')?.1.parse::<f64>().ok()).fold(0.0, f64::max);
    assert!(best > 0.0, "{learned:?}");
    // A fleet of eight faster nodes: 40 figures around 3 times this machine's best (far above
    // what a busy 2-core machine's figure varies by from one run to the next).
    for i in 0..40 {
        let v = best * (3.0 + f64::from(i % 5) * 0.01);
        let key = key.replace('\'', "''");
        w.sql(&format!(
            "INSERT INTO fleet_samples (run_id, rank, fkey, node_name, value, at) \
             VALUES ('seed-{i}', 0, '{key}', 'seed-{}', {v}, {i})",
            i % 8
        ));
    }
    // The next run: node 0 gets the baseline in its task and judges with it.
    let start = Instant::now();
    std::thread::sleep(Duration::from_millis(700));
    w.allocate("fj-ev-2", "fj-2", GEMM);
    let v = verdict(&mut out, "fj-2");
    assert_eq!(v["type"], "CheckFailed", "{v:#}\n{}", w.log("serve"));
    let r = report(&w, "fj-2");
    let below: Vec<&Value> =
        r["findings"].as_array().into_iter().flatten().filter(|f| f["code"] == "BELOW_FLEET").collect();
    assert!(!below.is_empty(), "{:#}", r["findings"]);
    assert!(below.iter().all(|f| f["check"] == "gemm"), "{below:#?}");
    // Each judged rank names the baseline it was judged against: the 40 seeded figures and the
    // two this machine's first run taught it, from 8 + 2 nodes.
    let gemm = r["checks"].as_array().into_iter().flatten().find(|c| c["name"] == "gemm").expect("gemm");
    let judged: Vec<&Value> = gemm["ranks"].as_array().into_iter().flatten().map(|k| &k["fleet"]).collect();
    assert_eq!(judged.len(), 2, "{gemm:#}");
    for j in judged {
        assert_eq!((&j["samples"], &j["nodes"], &j["below"]), (&json!(42), &json!(10), &json!(true)), "{j:#}");
        assert!(j["percentile"].as_f64().is_some_and(|p| p < 1.0), "{j:#}");
    }
    assert!(start.elapsed() < LIMIT);
    let faulty = v["faulty_nodes"].as_array().cloned().unwrap_or_default();
    assert!(!faulty.is_empty() && faulty.iter().all(|n| n == &json!("fj-a") || n == &json!("fj-b")), "{v:#}");
    w.shutdown();
}
