//! What the fleet's baselines may learn from, through the real service, broker and CPU agents
//! (docs/fleet.md, "Learning"): results forged on the agent-reports topic (unsigned, signed
//! with a key the service does not have, signed but about a node or as a task), carrying a
//! passed report with figures ten times the fleet's, and runs with fault injection (from the
//! job's settings, or from an agent's own environment) leave the learned figures and the
//! exported baseline exactly as they were.

use gpusanity_testkit::svc;

use std::time::Duration;

use gpusanity_common::report::Report;
use gpusanity_common::wire::agent::{AgentReport, NodeResult, ReportBody};
use gpusanity_service::auth::{envelope, Direction, Keyring};
use serde_json::Value;
use svc::{allocated, Reader, World};

const QUICK: &str = "agent_timeout_s = 2.0\nagent_wait_s = 4.0\ndeadline_grace_s = 10.0";
const GEMM: &str = "--micro-benchmarks=gemm";
const LIMIT: Duration = Duration::from_secs(60);

fn verdict(out: &mut Reader, job: &str) -> Value {
    out.wait_for(LIMIT, "a verdict", |v| {
        v["job_id"] == job && (v["type"] == "CheckFailed" || v["type"] == "CheckPassed")
    })
}

/// The learned figures, and the baseline `gpusanity baseline export` writes from them (every
/// key, however few its samples; the line saying when it was exported left out).
fn memory(w: &World) -> (Vec<String>, String) {
    let rows = w.sql(
        "SELECT run_id || '|' || CAST(rank AS TEXT) || '|' || fkey || '|' || node_name || '|' || CAST(value AS TEXT) \
         FROM fleet_samples ORDER BY run_id, rank, fkey",
    );
    let mut c = std::process::Command::new(svc::common::bin());
    c.args(["baseline", "export", "--database", &w.db_url, "--min-samples", "1", "--min-nodes", "1"]);
    let out = svc::common::run_with_timeout(c, LIMIT);
    assert_eq!(svc::common::code(&out), 0, "{}", svc::common::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let file: String = text.lines().filter(|l| !l.contains("exported")).map(|l| format!("{l}\n")).collect();
    assert!(file.contains("[[entry]]"), "{text}");
    (rows, file)
}

/// Node 0's result with `report`, as an agent would send it.
fn result(node: &str, run_id: &str, node_rank: usize, report: &Report) -> String {
    let r = AgentReport {
        version: 1,
        node: node.into(),
        agent_id: "forger".into(),
        at: chrono::Utc::now(),
        body: ReportBody::Result(NodeResult {
            run_id: run_id.into(),
            node_rank,
            exit_code: Some(0),
            report: Some(Box::new(report.clone())),
            report_chunks: None,
            error: None,
        }),
    };
    serde_json::to_string(&r).expect("json")
}

/// A passed report of this world, made out for `run_id` with every figure ten times higher.
fn boasting(w: &World, run_id: &str) -> Report {
    let stored = w.sql("SELECT report FROM runs WHERE state = 'CheckPassed' AND report IS NOT NULL");
    let mut r: Value = serde_json::from_str(stored.first().expect("a passed run")).expect("stored report");
    r["run_id"] = Value::String(run_id.into());
    for c in r["checks"].as_array_mut().into_iter().flatten() {
        for rank in c["ranks"].as_array_mut().into_iter().flatten() {
            for (_, v) in rank["metrics"].as_object_mut().into_iter().flatten() {
                if let Some(x) = v.as_f64() {
                    *v = serde_json::json!(x * 10.0);
                }
            }
        }
    }
    serde_json::from_value(r).expect("a report")
}

#[test]
fn forged_results_and_fault_injected_runs_leave_the_fleets_baseline_unmoved() {
    let _g = svc::common::serial();
    let (mut w, mut out) = World::running(QUICK, &["ft-a", "ft-b"]);
    for i in 0..3 {
        w.allocate(&format!("ft-ev-{i}"), &format!("ft-{i}"), GEMM);
        assert_eq!(verdict(&mut out, &format!("ft-{i}"))["type"], "CheckPassed");
    }
    let before = memory(&w);
    assert_eq!(before.0.len(), 6, "two ranks a run: {:?}", before.0);

    // Forged results for a run that waits for a node with no agent: a passed report with
    // figures ten times the fleet's, for either rank, as node 0 (a real agent's node) and as
    // the missing node: unsigned, signed with another key, signed but from a node outside the
    // run, signed as a task. None is taken; the run fails for its missing node.
    w.publish(allocated("ft-ev-forged", "ft-forged", &["ft-a", "ft-ghost"], GEMM).as_bytes());
    let started =
        out.wait_for(LIMIT, "SanityCheckStarted", |v| v["type"] == "SanityCheckStarted" && v["job_id"] == "ft-forged");
    let run_id = started["run_id"].as_str().expect("run_id").to_string();
    let report = boasting(&w, &run_id);
    let real = Keyring::load(&w.agent_keys()).expect("the world's agent keys");
    let other = Keyring::parse(&format!("[[key]]\nid = \"test\"\nsecret = \"{}\"\n", "5a".repeat(32))).expect("ring");
    for (k, node) in [(0, "ft-a"), (1, "ft-ghost")] {
        let forged = result(node, &run_id, k, &report);
        w.publish_on("agent-reports", forged.as_bytes());
        w.publish_on("agent-reports", envelope::seal(other.first(), Direction::Report, forged.clone()).as_bytes());
        w.publish_on("agent-reports", envelope::seal(real.first(), Direction::Task, forged).as_bytes());
        let elsewhere = result("ft-elsewhere", &run_id, k, &report);
        w.publish_on("agent-reports", envelope::seal(real.first(), Direction::Report, elsewhere).as_bytes());
    }
    let end = verdict(&mut out, "ft-forged");
    assert_eq!(end["type"], "CheckFailed", "{end:#}");
    assert_eq!(end["faulty_nodes"], serde_json::json!(["ft-ghost"]), "{end:#}");
    let log = w.log("serve");
    assert!(log.matches("agent report refused").count() >= 8, "{log}");
    assert_eq!(memory(&w), before, "forged results moved the baseline");

    // A run with fault injection in the job's settings that passes (its first check starts late).
    w.allocate("ft-ev-late", "ft-late", &format!("{GEMM} --sanity-check-envs=GPUSANITY_FAULT=delay-start@0"));
    assert_eq!(verdict(&mut out, "ft-late")["type"], "CheckPassed");
    // A node whose agent's own environment injects a fault (10% more GEMM products): its run
    // passes (no baseline judges it: judging is off) and is not learned either.
    w.agent_via("ft-c", &["env".to_string(), "GPUSANITY_FAULT=gemm-extra-10@0".to_string()], &[]);
    let up = std::time::Instant::now();
    while !w.log("ft-c").contains("agent up") {
        assert!(up.elapsed() < LIMIT, "{}", w.log("ft-c"));
        std::thread::sleep(Duration::from_millis(50));
    }
    w.publish(allocated("ft-ev-env", "ft-env", &["ft-c"], GEMM).as_bytes());
    assert_eq!(verdict(&mut out, "ft-env")["type"], "CheckPassed");
    let stored = w.sql("SELECT report FROM runs WHERE job_id = 'ft-env'");
    let r: Value = serde_json::from_str(stored.first().expect("stored report")).expect("report");
    assert_eq!(r["settings"]["envs"], serde_json::json!([["GPUSANITY_FAULT", "gemm-extra-10@0"]]), "{r:#}");
    assert_eq!(memory(&w), before, "a fault-injected run moved the baseline");

    // And a clean run still teaches it (what was refused was refused for a reason).
    w.publish(allocated("ft-ev-clean", "ft-clean", &["ft-a", "ft-b"], GEMM).as_bytes());
    assert_eq!(verdict(&mut out, "ft-clean")["type"], "CheckPassed");
    assert_eq!(memory(&w).0.len(), 8);
    w.shutdown();
}
