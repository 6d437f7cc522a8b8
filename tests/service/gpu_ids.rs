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
    with_ids_checking(event_id, job, nodes, ids, "--micro-benchmarks=all-reduce")
}

/// The same, checking with `args`.
fn with_ids_checking(event_id: &str, job: &str, nodes: &[&str], ids: &[Value], args: &str) -> String {
    let mut ev: Value = serde_json::from_str(&allocated(event_id, job, nodes, args)).unwrap();
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

/// The run of `job` (its id, created_at, finished_at) once it has ended.
fn run_of(w: &World, job: &str) -> (String, i64, i64) {
    let q = |col: &str| w.sql(&format!("SELECT {col} FROM runs WHERE job_id = '{job}'"));
    let id = q("run_id").pop().unwrap_or_else(|| panic!("no run of {job}"));
    let at = |col: &str| q(col).pop().and_then(|v| v.parse::<i64>().ok()).unwrap_or_else(|| panic!("{job}: {col}"));
    (id, at("created_at"), at("finished_at"))
}

/// The run's transitions: (detail, at).
fn transitions(w: &World, run_id: &str) -> Vec<(String, i64)> {
    let details = w.sql(&format!("SELECT detail FROM transitions WHERE run_id = '{run_id}' ORDER BY id"));
    let ats = w.sql(&format!("SELECT at FROM transitions WHERE run_id = '{run_id}' ORDER BY id"));
    details.into_iter().zip(ats.into_iter().map(|a| a.parse().unwrap())).collect()
}

/// Two jobs allocated on the same node at the same moment: on the same GPUs the later run waits
/// for the earlier one, saying so, and both pass; on disjoint GPUs they run side by side.
#[test]
fn two_jobs_on_one_node_wait_for_shared_gpus_and_run_side_by_side_on_disjoint_ones() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(FAST, &["shared-a"]);
    let nodes = ["shared-a"];
    for (round, (first, second)) in
        [(json!(["0", "1", "2", "3"]), json!(["2", "3"])), (json!(["0", "1"]), json!(["4", "5"]))]
            .into_iter()
            .enumerate()
    {
        let (job1, job2) = (format!("job-{round}-1"), format!("job-{round}-2"));
        // A check of a second or more on a CPU agent, so that the two runs could overlap.
        let args = "--micro-benchmarks=all-reduce,memory-bandwidth";
        w.publish(with_ids_checking(&format!("ev-{round}-1"), &job1, &nodes, &[first], args).as_bytes());
        w.publish(with_ids_checking(&format!("ev-{round}-2"), &job2, &nodes, &[second], args).as_bytes());
        for job in [&job1, &job2] {
            let end = out.wait_for(Duration::from_secs(120), "a verdict", |v| {
                v["job_id"] == job.as_str() && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed")
            });
            assert_eq!(end["type"], "CheckPassed", "{job}: {end:#}\n{}", w.log("serve"));
        }
        let (id1, created1, finished1) = run_of(&w, &job1);
        let (id2, created2, _) = run_of(&w, &job2);
        assert!(created1 <= created2, "the events' order");
        let t2 = transitions(&w, &id2);
        let waited = t2.iter().find(|(d, _)| d.starts_with("waiting for the GPUs of node shared-a"));
        if round == 0 {
            let (why, _) = waited.unwrap_or_else(|| panic!("the second run did not wait: {t2:?}"));
            assert!(why.contains(&id1), "{why}");
            let (_, started) = t2.iter().find(|(d, _)| d.contains("GPUs are free")).expect("started after waiting");
            assert!(*started >= finished1, "started at {started} before the first run ended at {finished1}");
        } else {
            assert!(waited.is_none(), "disjoint GPUs waited: {t2:?}");
            assert!(created2 < finished1, "the second run was not under way while the first ran");
        }
    }
    w.shutdown();
}

/// A run held on its GPUs (KeepJobHang after a hang) keeps them: a second job on the same GPU
/// waits, the run's page says for what, and a JobStopped still ends the waiting run.
#[test]
fn a_waiting_run_says_for_what_on_its_page_and_a_job_stop_ends_it() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(FAST, &["held-a"]);
    let nodes = ["held-a"];
    let hang = "--sanity-check-timeout-ops=KeepJobHang --sanity-check-timeout-per-test=0.05 --sanity-check-max-time=1 \
                --sanity-check-envs=GPUSANITY_FAULT=hang@0";
    w.publish(with_ids_checking("held-1", "job-held", &nodes, &[json!(["0"])], hang).as_bytes());
    // The first run is held (Checking, held = 1) before the second job comes.
    let deadline = Instant::now() + Duration::from_secs(60);
    while w.sql("SELECT held FROM runs WHERE job_id = 'job-held'") != ["1"] {
        assert!(Instant::now() < deadline, "the first run was never held\n{}", w.log("serve"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let first = w.sql("SELECT run_id FROM runs WHERE job_id = 'job-held'").pop().unwrap();
    w.publish(with_ids("wait-1", "job-waits", &nodes, &[json!(["0"])]).as_bytes());
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = loop {
        if let Some(id) = w.sql("SELECT run_id FROM runs WHERE job_id = 'job-waits'").pop() {
            let (_, v) = w.http_call("GET", &format!("/v1/runs/{id}"), Some(svc::TOKEN), None).unwrap();
            let summary = v["run"]["summary"].as_str().unwrap_or("").to_string();
            if summary.contains("waiting for the GPUs of node held-a") {
                assert!(summary.contains(&first), "{summary}");
                break id;
            }
        }
        assert!(Instant::now() < deadline, "the second run never said it waits\n{}", w.log("serve"));
        std::thread::sleep(Duration::from_millis(100));
    };
    w.publish(svc::stopped("stop-1", "job-waits").as_bytes());
    let cancelled = out.wait_for(Duration::from_secs(20), "CheckCancelled", |v| {
        v["job_id"] == "job-waits" && v["type"] == "CheckCancelled"
    });
    assert_eq!(cancelled["run_id"], second.as_str(), "{cancelled:#}");
    assert_eq!(w.sql(&format!("SELECT state FROM runs WHERE run_id = '{second}'")), ["CheckCancelled"]);
    w.publish(svc::stopped("stop-2", "job-held").as_bytes());
    out.wait_for(Duration::from_secs(20), "CheckCancelled", |v| {
        v["job_id"] == "job-held" && v["type"] == "CheckCancelled"
    });
    w.shutdown();
}
