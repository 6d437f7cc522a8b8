//! The multi-node fault-injection test bed: three nodes as network namespaces on a bridge, each
//! running the real `gpusanity check` on CPU; one fault per scenario, and the verdict and the
//! named node or rank asserted. Skips (saying why) where root, iproute2, tc or cgroup v1 cpu
//! are missing.

mod common;
mod netns;

use std::time::Duration;

use common::*;
use netns::scenarios::*;
use serde_json::Value;

/// The report names `code` on the bad node (and its rank, `rank`), and nothing else.
fn assert_named(r: &Value, code: &str, rank: Option<u64>) {
    assert!(
        critical(r).contains(&(code.into(), Some(BAD), rank)),
        "{}",
        r["findings"]
    );
    assert_only_bad_named(r);
}

/// Every critical finding places the bad node (or its rank), none another node, and the
/// verdict isolates the bad node alone.
fn assert_only_bad_named(r: &Value) {
    let c = critical(r);
    assert!(!c.is_empty(), "no critical finding: {}", r["findings"]);
    for (code, node, _) in &c {
        assert!(
            *node == Some(BAD) || (*node).is_none() && code == "RUN_TIMEOUT",
            "{code} names node {node:?}: {}",
            r["findings"]
        );
    }
    assert_eq!(faulty(r), [BAD], "{}", r["node_verdicts"]);
    for v in r["node_verdicts"].as_array().unwrap() {
        if v["node_rank"].as_u64() != Some(BAD) {
            assert_eq!(v["health"], "healthy", "{v}");
        }
    }
}

#[test]
fn testbed_1_clean_three_nodes_pass_with_no_finding() {
    let Some((_g, bed, run, out, _)) = Kind::Clean.run() else {
        return;
    };
    for (k, o) in out.iter().enumerate() {
        assert_eq!(code(o), 0, "node {k}: {}", stderr(o));
    }
    let r = bed.report(&run);
    assert_eq!(r["status"], "passed");
    assert_eq!(r["findings"], serde_json::json!([]), "{}", r["findings"]);
    assert_eq!(faulty(&r), Vec::<u64>::new());
    assert!(r["node_verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .all(|v| v["health"] == "healthy"));
    // The link test ran and measured every node.
    let pairs = r["pair_bandwidth"].as_array().expect("pair matrix");
    for k in 0..NODES as u64 {
        assert!(
            pairs
                .iter()
                .any(|p| p["nodes"].as_array().unwrap().contains(&k.into())),
            "node {k} unmeasured: {pairs:?}"
        );
    }
    assert!(pairs
        .iter()
        .all(|p| p["busbw_gbps"].as_f64().unwrap() > 0.0));
    run.assert_nothing_left();
}

#[test]
fn testbed_2_a_rate_limited_link_names_its_node_slow_in_communication() {
    let Some((_g, bed, run, out, _)) = Kind::RateLimit.run() else {
        return;
    };
    assert_eq!(code(&out[0]), 1, "{}", stderr(&out[0]));
    assert_named(&bed.report(&run), "NODE_COMM_SLOW", None);
    let summary = String::from_utf8_lossy(&out[0].stdout);
    assert!(
        summary.contains("faulty nodes (to isolate): 2"),
        "{summary}"
    );
    assert!(
        summary.contains("link test, GB/s per node pair"),
        "{summary}"
    );
    run.assert_nothing_left();
}

#[test]
fn testbed_3_a_node_whose_link_goes_down_is_named_and_the_run_ends_in_time() {
    let Some((_g, bed, run, out, took)) = Kind::LinkDown.run() else {
        return;
    };
    // Per-test 6 s, then node 0 waits 6 + 30 s for the silent node; node 2 gives up on its own.
    assert!(took < Duration::from_secs(75), "took {took:?}");
    assert_ne!(code(&out[0]), 0, "{}", stderr(&out[0]));
    assert_ne!(code(&out[BAD as usize]), 0);
    assert!(
        stderr(&out[BAD as usize]).contains("cannot reach the rendezvous store"),
        "{}",
        stderr(&out[BAD as usize])
    );
    let r = bed.report(&run);
    assert_named(&r, "NODE_LOST", None);
    run.assert_nothing_left();
}

#[test]
fn testbed_4_a_node_under_a_cpu_quota_is_named_slow_in_compute() {
    let Some((_g, bed, run, out, _)) = Kind::CpuQuota.run() else {
        return;
    };
    let r = bed.report(&run);
    assert_eq!(
        code(&out[0]),
        1,
        "{}\n{}",
        String::from_utf8_lossy(&out[0].stdout),
        r["checks"][0]
    );
    assert_named(&r, "GEMM_SLOW", Some(BAD));
    // Named only after a re-measure on every rank.
    assert!(
        r["remeasured"].as_array().is_some_and(|a| a
            .iter()
            .any(|s| s.as_str().unwrap_or("").starts_with("gemm"))),
        "{}",
        r["remeasured"]
    );
    run.assert_nothing_left();
}

#[test]
fn testbed_5_a_stopped_worker_is_named_for_the_hang() {
    let Some((_g, bed, run, out, took)) = Kind::Stop.run() else {
        return;
    };
    assert_eq!(code(&out[0]), 3, "{}", stderr(&out[0]));
    assert!(took < Duration::from_secs(40), "took {took:?}");
    let r = bed.report(&run);
    assert_eq!(r["status"], "timed_out");
    assert_eq!(
        critical(&r),
        [("TEST_HANG".to_string(), Some(BAD), Some(BAD))],
        "{}",
        r["findings"]
    );
    let hang = &r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["code"] == "TEST_HANG")
        .unwrap()["message"];
    assert!(hang.as_str().unwrap().contains("no heartbeat"), "{hang}");
    assert_only_bad_named(&r);
    run.assert_nothing_left();
}

#[test]
fn testbed_6_a_killed_worker_is_named_for_the_crash_and_nothing_is_left() {
    let Some((_g, bed, run, out, took)) = Kind::Kill.run() else {
        return;
    };
    assert!(took < Duration::from_secs(40), "took {took:?}");
    for (k, o) in out.iter().enumerate() {
        assert_eq!(code(o), 1, "node {k}: {}", stderr(o));
    }
    let r = bed.report(&run);
    assert_eq!(
        critical(&r),
        [("WORKER_CRASHED".to_string(), Some(BAD), Some(BAD))],
        "{}",
        r["findings"]
    );
    let crash = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["code"] == "WORKER_CRASHED")
        .unwrap();
    assert!(
        crash["message"]
            .as_str()
            .unwrap()
            .contains("killed by signal SIGKILL"),
        "{crash}"
    );
    assert_only_bad_named(&r);
    run.assert_nothing_left();
}

/// The repeat figures (bench/testbed_repeat.sh): the clean scenario `TESTBED_CLEAN_RUNS` times
/// (20) and each fault `TESTBED_FAULT_RUNS` times (5); prints found / missed / false findings
/// and processes left behind per scenario.
#[test]
#[ignore = "takes about 15 minutes: run by bench/testbed_repeat.sh"]
fn testbed_repeat() {
    let runs = |var: &str, default: usize| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (clean, faults) = (
        runs("TESTBED_CLEAN_RUNS", 20),
        runs("TESTBED_FAULT_RUNS", 5),
    );
    println!(
        "{:<10} {:>5} {:>6} {:>7} {:>15} {:>5} {:>8}",
        "scenario", "runs", "found", "missed", "false findings", "left", "mean s"
    );
    for kind in Kind::ALL {
        let n = if kind == Kind::Clean { clean } else { faults };
        let (mut found, mut missed, mut wrong, mut left, mut secs) = (0, 0, 0, 0, 0.0);
        for _ in 0..n {
            let Some((g, bed, run, _out, took)) = kind.run() else {
                println!("{kind:?}: skipped");
                break;
            };
            secs += took.as_secs_f64();
            let report = std::fs::read_to_string(run.report_dir().join("report.json")).ok();
            match report.and_then(|t| serde_json::from_str::<Value>(&t).ok()) {
                Some(r) => {
                    let (ok, w) = kind.score(&r);
                    if ok {
                        found += 1;
                    } else {
                        missed += 1;
                        println!("{kind:?} missed: {} {}", r["summary"], r["findings"]);
                    }
                    wrong += w;
                }
                None => missed += 1,
            }
            std::thread::sleep(Duration::from_secs(1));
            left += usize::from(!tagged_processes(&run.tag).is_empty());
            drop((bed, g));
        }
        let mean = if n > 0 { secs / n as f64 } else { 0.0 };
        println!(
            "{:<10} {n:>5} {found:>6} {missed:>7} {wrong:>15} {left:>5} {mean:>8.1}",
            format!("{kind:?}")
        );
    }
}
