//! The micro-benchmarks beyond gemm and all-reduce, end to end on CPU workers through the real
//! binary: real figures and statuses, injected faults named, nothing left running.

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(90);

fn check<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no check {name}"))
}

/// Every point of every rank's sweep is exact, with busbw = algbw (n-1)/n for 2 ranks.
fn assert_exact_sweep(c: &Value) {
    assert_eq!(c["status"], "passed", "{c}");
    for rank in c["ranks"].as_array().unwrap() {
        let sweep = rank["sweep"].as_array().unwrap();
        assert!(sweep.len() >= 5, "sweep too short");
        for p in sweep {
            assert_eq!(p["wrong"], 0);
            let (alg, bus) = (p["algbw_gbps"].as_f64().unwrap(), p["busbw_gbps"].as_f64().unwrap());
            assert!(bus > 0.0 && (alg * 0.5 - bus).abs() < 1e-9, "{p}");
        }
        assert!(rank["metrics"]["busbw_gbps"].as_f64().unwrap() > 0.0);
    }
}

#[test]
fn all_gather_and_all_to_all_pass_on_three_cpu_workers_and_name_a_wrong_rank() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(run.command(&["--micro-benchmarks=all-gather,all-to-all", "--nproc-per-node=3"]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    for name in ["all-gather", "all-to-all"] {
        let c = check(&r, name);
        assert_eq!(c["status"], "passed", "{c}");
        assert_eq!(c["ranks"].as_array().unwrap().len(), 3);
        for rank in c["ranks"].as_array().unwrap() {
            for p in rank["sweep"].as_array().unwrap() {
                assert_eq!(p["wrong"], 0);
                // 3 ranks: busbw = algbw * 2/3; sizes are whole elements per rank.
                let (alg, bus) = (p["algbw_gbps"].as_f64().unwrap(), p["busbw_gbps"].as_f64().unwrap());
                assert!(bus > 0.0 && (alg * 2.0 / 3.0 - bus).abs() < 1e-9, "{p}");
                assert_eq!(p["bytes"].as_u64().unwrap() % 12, 0);
            }
        }
        assert!(c["config"]["sizes"].as_array().unwrap().len() >= 5);
    }
    run.assert_nothing_left();

    for (fault, code_name, rank) in
        [("all-gather-wrong@1", "ALLGATHER_WRONG_RESULT", 1), ("all-to-all-wrong@0", "ALLTOALL_WRONG_RESULT", 0)]
    {
        let run = Run::new();
        let envs = format!("--sanity-check-envs=GPUSANITY_FAULT={fault}");
        let out = run_with_timeout(run.command(&["--micro-benchmarks=all-gather,all-to-all", &envs]), LIMIT);
        assert_eq!(code(&out), 1, "{}", stderr(&out));
        let f = findings(&run.report());
        assert_eq!(f, [(code_name.to_string(), Some(rank))], "{fault}");
        run.assert_nothing_left();
    }
}

#[test]
fn the_moved_all_reduce_still_sweeps_exactly_next_to_all_gather() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(run.command(&["--micro-benchmarks=all-reduce,all-gather"]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    assert_exact_sweep(check(&r, "all-gather"));
    assert_eq!(check(&r, "all-reduce")["status"], "passed");
    run.assert_nothing_left();
}
