//! One rank on one node: the checks that need peers say `not_applicable` with the reason and
//! cost nothing; the default check passes a healthy rank and still names a slow or wrong one.

use gpusanity_testkit::common;

use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(90);

const ALL_MICRO: &str = "--micro-benchmarks=gemm,kernel-launch,all-reduce,all-to-all,all-gather,multi-all-reduce,\
network-connectivity,matmul-all-reduce-overlap";

fn check<'a>(r: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    r["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no check {name}"))
}

#[test]
fn one_cpu_worker_passes_the_default_check_and_says_what_it_compared() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(run.command(&["--nproc-per-node=1"]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(r["status"], "passed", "{}", r["summary"]);
    assert!(r["findings"].as_array().unwrap().is_empty(), "{}", r["findings"]);
    let gemm = check(&r, "gemm");
    assert_eq!(gemm["status"], "passed");
    let note = gemm["ranks"][0]["notes"]["compared_with"].as_str().unwrap();
    assert!(note.starts_with("nothing: no peer of its model and no expected figure"), "{note}");
    let ar = check(&r, "all-reduce");
    assert_eq!(ar["status"], "not_applicable");
    let why = ar["ranks"][0]["notes"]["not_applicable"].as_str().unwrap();
    assert!(why.starts_with("one rank"), "{why}");
    assert!(ar["ranks"][0]["sweep"].as_array().is_none_or(|s| s.is_empty()), "measured nothing");
    assert!(ar["duration_s"].as_f64().unwrap() < 1.0, "costs no time: {}", ar["duration_s"]);
    assert_eq!(run.events(), ["Checking", "CheckPassed"]);
    run.assert_nothing_left();
}

#[test]
fn the_whole_micro_suite_on_one_rank_measures_what_means_something() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(run.command(&["--nproc-per-node=1", ALL_MICRO]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(r["status"], "passed", "{}", r["summary"]);
    assert_eq!(check(&r, "gemm")["status"], "passed");
    for name in ["all-reduce", "all-to-all", "all-gather", "multi-all-reduce", "matmul-all-reduce-overlap"] {
        let c = check(&r, name);
        assert_eq!(c["status"], "not_applicable", "{name}");
        assert!(c["ranks"][0]["notes"]["not_applicable"].as_str().unwrap().starts_with("one rank"), "{name}");
    }
    let net = check(&r, "network-connectivity");
    assert_eq!(net["status"], "not_applicable");
    assert!(net["ranks"][0]["notes"]["not_applicable"].as_str().unwrap().starts_with("one node"));
    // Rendered too: the page of a run with checks that do not apply.
    assert!(run.report_dir().join("report.html").exists());
    run.assert_nothing_left();
}

#[test]
fn two_workers_on_one_node_skip_only_the_probes_between_nodes() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&[
            "--micro-benchmarks=all-reduce,network-connectivity,multi-all-reduce",
            "--check-param=gemm.size=64",
        ]),
        LIMIT,
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(check(&r, "all-reduce")["status"], "passed");
    assert_eq!(check(&r, "multi-all-reduce")["status"], "passed");
    assert_eq!(check(&r, "network-connectivity")["status"], "not_applicable");
    run.assert_nothing_left();
}

#[test]
fn a_wrong_product_on_one_rank_is_still_named() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&[
            "--nproc-per-node=1",
            "--micro-benchmarks=gemm",
            "--test-faults",
            "--sanity-check-envs=GPUSANITY_FAULT=gemm-wrong@0",
        ]),
        LIMIT,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    let codes: Vec<&str> = r["findings"].as_array().unwrap().iter().filter_map(|f| f["code"].as_str()).collect();
    assert!(codes.contains(&"GEMM_WRONG_RESULT"), "{codes:?}");
    run.assert_nothing_left();
}
