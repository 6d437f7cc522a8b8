//! The job's own GPUs on a shared node (`gpu_ids` of a node entry), through the real service
//! with CPU agents: named GPUs travel with the run; a malformed, duplicate or miscounted list is
//! a dead letter that names it, and consumption goes on.

use gpusanity_testkit::svc;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use svc::{allocated, World};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";

/// An allocation on `nodes` whose node k names the GPUs `ids[k]`.
fn with_ids(event_id: &str, job: &str, nodes: &[&str], ids: &[Value]) -> String {
    let mut ev: Value =
        serde_json::from_str(&allocated(event_id, job, nodes, "--micro-benchmarks=all-reduce")).unwrap();
    for (k, list) in ids.iter().enumerate() {
        ev["nodes"][k]["gpus"] = list.as_array().map_or(0, Vec::len).into();
        ev["nodes"][k]["gpu_ids"] = list.clone();
    }
    ev.to_string()
}

#[test]
fn named_gpus_travel_with_the_run_and_malformed_lists_are_dead_letters() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(FAST, &["ids-a", "ids-b"]);
    let mut dead = w.reader("dead-letter");
    let nodes = ["ids-a", "ids-b"];
    let uuid = "GPU-5cd893c3-e5fe-0df3-682b-a88f611dad99";
    w.publish(with_ids("bad-form", "job-bad1", &nodes, &[json!(["4", "GPU-nope"]), json!(["0"])]).as_bytes());
    w.publish(with_ids("bad-twice", "job-bad2", &nodes, &[json!(["4", "4"]), json!(["0"])]).as_bytes());
    let mut miscounted: Value =
        serde_json::from_str(&with_ids("bad-count", "job-bad3", &nodes, &[json!(["4", "5"]), json!(["0"])])).unwrap();
    miscounted["nodes"][0]["gpus"] = 3.into();
    w.publish(miscounted.to_string().as_bytes());
    w.publish(with_ids("bad-mixed", "job-bad4", &nodes, &[json!(["4", uuid]), json!(["0"])]).as_bytes());
    w.publish(with_ids("ids-1", "job-ids", &nodes, &[json!(["4", "5", "6", "7"]), json!([uuid])]).as_bytes());

    let end = out.wait_for(Duration::from_secs(90), "the verdict", |v| {
        v["job_id"] == "job-ids" && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed")
    });
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while dead.seen.len() < 4 {
        assert!(Instant::now() < deadline, "dead letters: {:#?}", dead.seen);
        dead.drain(Duration::from_millis(200));
    }
    let reasons: Vec<String> = dead.seen.iter().map(|d| d["reason"].as_str().unwrap_or("").to_string()).collect();
    assert!(reasons[0].contains("GPU-nope"), "{reasons:?}");
    assert!(reasons[1].contains("ids-a") && reasons[1].contains("names `4` twice"), "{reasons:?}");
    assert!(reasons[2].contains("names 2 GPU(s) but gpus is 3"), "{reasons:?}");
    assert!(reasons[3].contains("mixes forms"), "{reasons:?}");
    let stored = w.sql("SELECT nodes FROM runs");
    assert_eq!(stored.len(), 1, "{stored:?}");
    let stored: Value = serde_json::from_str(&stored[0]).unwrap();
    assert_eq!(stored[0]["gpu_ids"], json!(["4", "5", "6", "7"]), "{stored}");
    assert_eq!(stored[1]["gpu_ids"], json!([uuid]), "{stored}");
    w.shutdown();
}
