//! The micro-benchmarks beyond gemm and all-reduce, end to end on CPU workers through the real
//! binary: real figures and statuses, injected faults named, nothing left running.

use gpusanity_testkit::common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(90);

/// These tests are about statuses, exact results and figures. On a shared two-core machine
/// under load, a rank's speed against its peers is noise, so the slow-rank threshold is lowered
/// (slowness is tested by the diagnosis unit tests and in tests/check/faults.rs).
const CALM: &str = "--check-param=diagnosis.slow-fraction=0.05";

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
    let out =
        run_with_timeout(run.command(&["--micro-benchmarks=all-gather,all-to-all", "--nproc-per-node=3", CALM]), LIMIT);
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
        a_wrong_rank_is_named("all-gather,all-to-all", &[], fault, code_name, rank);
    }
}

#[test]
fn the_moved_all_reduce_still_sweeps_exactly_next_to_all_gather() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(run.command(&["--micro-benchmarks=all-reduce,all-gather", CALM]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    assert_exact_sweep(check(&r, "all-gather"));
    assert_eq!(check(&r, "all-reduce")["status"], "passed");
    run.assert_nothing_left();
}

/// Runs a job of `nnodes` nodes x `nproc` CPU workers on loopback; returns each node's output.
fn loopback_job(run: &Run, extra: &[&str], nnodes: usize, nproc: usize) -> Vec<std::process::Output> {
    let port = free_port().to_string();
    let (n, p) = (nnodes.to_string(), nproc.to_string());
    let children: Vec<_> = (0..nnodes)
        .rev()
        .map(|node| {
            let r = node.to_string();
            let mut args: Vec<&str> = extra.to_vec();
            args.extend(["--nnodes", &n, "--node-rank", &r, "--nproc-per-node", &p, "--master-addr", "127.0.0.1"]);
            args.extend(["--master-port", &port]);
            let mut c = run.command(&args);
            c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
            c.spawn().expect("spawn gpusanity")
        })
        .collect();
    let mut outs: Vec<_> = children.into_iter().map(|c| wait_output(c, LIMIT)).collect();
    outs.reverse();
    outs
}

#[test]
fn connectivity_names_a_node_whose_port_is_closed_within_the_probe_timeout() {
    let _g = serial();
    let run = Run::new();
    let start = std::time::Instant::now();
    let args = [
        "--micro-benchmarks=network-connectivity",
        "--test-faults",
        "--sanity-check-envs=GPUSANITY_FAULT=net-closed@1",
        "--check-param=network-connectivity.timeout-ms=1000",
        CALM,
    ];
    let outs = loopback_job(&run, &args, 2, 1);
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
    for o in &outs {
        assert_eq!(code(o), 1, "{}", stderr(o));
    }
    let r = run.report();
    let f: Vec<&Value> = r["findings"].as_array().unwrap().iter().collect();
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0]["code"], "NET_FRONTEND_UNREACHABLE");
    assert_eq!(f[0]["node_rank"], 1);
    assert!(f[0]["message"].as_str().unwrap().contains("refused"), "{}", f[0]["message"]);
    let c = check(&r, "network-connectivity");
    let d = &c["ranks"][0]["detail"];
    assert_eq!(d["front_end"][0][1], "FAIL", "{d}");
    assert_ne!(d["front_end"][1][0], "FAIL", "{d}");
    // The back end between the two nodes works.
    assert_eq!(d["back_end"][0][1], "ok 1/1", "{d}");
    run.assert_nothing_left();
}

#[test]
fn connectivity_names_a_rank_whose_back_end_is_silent_and_the_probes_time_out() {
    let _g = serial();
    let run = Run::new();
    let start = std::time::Instant::now();
    let args = [
        "--micro-benchmarks=network-connectivity",
        "--test-faults",
        "--sanity-check-envs=GPUSANITY_FAULT=net-backend-down@3",
        "--check-param=network-connectivity.timeout-ms=1000",
        CALM,
    ];
    let outs = loopback_job(&run, &args, 2, 2);
    assert!(start.elapsed() < Duration::from_secs(15), "took {:?}", start.elapsed());
    assert_eq!(code(&outs[0]), 1, "{}", stderr(&outs[0]));
    let r = run.report();
    assert_eq!(findings(&r), [("NET_BACKEND_RANK_UNREACHABLE".to_string(), Some(3))]);
    let c = check(&r, "network-connectivity");
    // Rank 2 (node 1) reached both ranks of node 0; the front end is clean.
    assert_eq!(c["ranks"][2]["status"], "passed");
    assert_eq!(c["ranks"][2]["metrics"]["back_probes"], 2.0);
    assert_eq!(c["ranks"][0]["metrics"]["front_failed"], 0.0);
    let back = &c["ranks"][0]["detail"]["back_end"];
    assert!([&back[0][1], &back[1][0]].iter().any(|v| **v == "FAIL 2/4"), "{back}");
    run.assert_nothing_left();
}

#[test]
fn multi_all_reduce_runs_every_rail_node_and_world_group_at_once_on_two_nodes() {
    let _g = serial();
    let run = Run::new();
    let outs = loopback_job(&run, &["--micro-benchmarks=multi-all-reduce,network-connectivity", CALM], 2, 2);
    for o in &outs {
        assert_eq!(code(o), 0, "{}", stderr(o));
    }
    let r = run.report();
    let c = check(&r, "multi-all-reduce");
    assert_eq!(c["status"], "passed");
    assert_eq!(c["config"]["world_streams"], 2);
    // Each rank's detail: the groups it is in, typed, with their ranks and busbw.
    let groups = |rank: usize| -> Vec<(String, usize, Vec<u64>)> {
        let d = &c["ranks"][rank]["detail"];
        assert_eq!(d["kind"], "multi_all_reduce", "{d}");
        d["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                assert!(g["busbw_gbps"].as_f64().unwrap() > 0.0, "{g}");
                let ranks = g["ranks"].as_array().unwrap().iter().map(|r| r.as_u64().unwrap()).collect();
                (
                    g["group"]["kind"].as_str().unwrap().to_string(),
                    g["group"]["index"].as_u64().unwrap() as usize,
                    ranks,
                )
            })
            .collect()
    };
    let all = vec![0, 1, 2, 3];
    assert_eq!(
        groups(0),
        [
            ("rail".to_string(), 0, vec![0, 2]),
            ("node".into(), 0, vec![0, 1]),
            ("world".into(), 0, all.clone()),
            ("world".into(), 1, all.clone())
        ]
    );
    assert_eq!(
        groups(3),
        [
            ("rail".to_string(), 1, vec![1, 3]),
            ("node".into(), 1, vec![2, 3]),
            ("world".into(), 0, all.clone()),
            ("world".into(), 1, all)
        ]
    );
    for (rank, mine) in [(0, ["rail0", "node0"]), (3, ["rail1", "node1"])] {
        let m = &c["ranks"][rank]["metrics"];
        for g in mine.iter().chain(&["world0", "world1"]) {
            assert!(m[format!("busbw_gbps.{g}")].as_f64().unwrap() > 0.0, "rank {rank} {g}: {m}");
        }
        assert_eq!(m["wrong_elements"], 0.0);
    }
    // The connectivity matrices of a healthy job: every cell between the nodes passes.
    let d = &check(&r, "network-connectivity")["ranks"][0]["detail"];
    assert!(!d["front_end"].to_string().contains("FAIL"), "{d}");
    assert_eq!(d["back_end"].to_string().matches("ok 4/4").count(), 2, "{d}");
    run.assert_nothing_left();

    a_wrong_rank_is_named(
        "multi-all-reduce",
        &["--nproc-per-node=3"],
        "multi-all-reduce-wrong@2",
        "MULTI_ALLREDUCE_WRONG_RESULT",
        2,
    );
}

const SUITE: &str = "--micro-benchmarks=gemm,kernel-launch,all-reduce,all-to-all,all-gather,multi-all-reduce,\
network-connectivity,matmul-all-reduce-overlap";

#[test]
fn the_whole_micro_suite_passes_on_two_nodes_with_overlap_figures_and_kernel_launch_not_applicable() {
    let _g = serial();
    let run = Run::new();
    let start = std::time::Instant::now();
    let outs = loopback_job(&run, &[SUITE, CALM], 2, 1);
    for o in &outs {
        assert_eq!(code(o), 0, "{}", stderr(o));
    }
    assert!(start.elapsed() < Duration::from_secs(60), "took {:?}", start.elapsed());
    let r = run.report();
    assert_eq!(r["checks"].as_array().unwrap().len(), 8);
    let k = check(&r, "kernel-launch");
    assert_eq!(k["status"], "not_applicable");
    assert!(k["ranks"][0]["notes"]["not_applicable"].as_str().unwrap().contains("CPU"));
    assert!(r["summary"].as_str().unwrap().contains("kernel-launch (not applicable)"));
    let o = check(&r, "matmul-all-reduce-overlap");
    assert_eq!(o["status"], "passed");
    for rank in o["ranks"].as_array().unwrap() {
        let m = &rank["metrics"];
        let f = |k: &str| m[k].as_f64().unwrap_or_else(|| panic!("{k} in {m}"));
        for key in [
            "gemm_ms_alone",
            "allreduce_ms_alone",
            "gemm_ms_overlapped",
            "allreduce_ms_overlapped",
            "overlapped_step_ms",
        ] {
            assert!(f(key) > 0.0, "{key}: {m}");
        }
        assert!((f("serial_step_ms") - f("gemm_ms_alone") - f("allreduce_ms_alone")).abs() < 1e-9);
        assert!((f("gemm_slowdown") - f("gemm_ms_overlapped") / f("gemm_ms_alone")).abs() < 1e-9);
        assert!(f("overlapped_step_ms") >= f("gemm_ms_overlapped").max(f("allreduce_ms_overlapped")) - 1e-9);
        assert_eq!(f("wrong_elements"), 0.0);
    }
    run.assert_nothing_left();

    a_wrong_rank_is_named("matmul-all-reduce-overlap", &[], "overlap-wrong@1", "OVERLAP_WRONG_RESULT", 1);
}

#[test]
fn reduce_scatter_sums_exactly_on_three_cpu_workers_and_names_a_wrong_rank() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(run.command(&["--micro-benchmarks=reduce-scatter", "--nproc-per-node=3", CALM]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    let c = check(&r, "reduce-scatter");
    assert_eq!(c["status"], "passed", "{c}");
    assert_eq!(c["ranks"].as_array().unwrap().len(), 3);
    for rank in c["ranks"].as_array().unwrap() {
        let sweep = rank["sweep"].as_array().unwrap();
        assert!(sweep.len() >= 5, "sweep too short");
        for p in sweep {
            assert_eq!(p["wrong"], 0);
            // 3 ranks: busbw = algbw * 2/3; the size is the send buffer, whole blocks per rank.
            let (alg, bus) = (p["algbw_gbps"].as_f64().unwrap(), p["busbw_gbps"].as_f64().unwrap());
            assert!(bus > 0.0 && (alg * 2.0 / 3.0 - bus).abs() < 1e-9, "{p}");
            assert_eq!(p["bytes"].as_u64().unwrap() % 12, 0);
        }
    }
    assert!(c["config"]["sizes"].as_array().unwrap().len() >= 5);
    run.assert_nothing_left();

    a_wrong_rank_is_named(
        "reduce-scatter",
        &["--nproc-per-node=3"],
        "reduce-scatter-wrong@2",
        "REDUCESCATTER_WRONG_RESULT",
        2,
    );
}

/// Runs `checks` with the test fault `fault` (a wrong result on one rank): the run fails, and
/// its one finding is `code` on `rank`.
fn a_wrong_rank_is_named(checks: &str, extra: &[&str], fault: &str, code_name: &str, rank: u64) {
    let run = Run::new();
    let selected = format!("--micro-benchmarks={checks}");
    let envs = format!("--sanity-check-envs=GPUSANITY_FAULT={fault}");
    let mut args = vec![selected.as_str()];
    args.extend_from_slice(extra);
    args.extend(["--test-faults", envs.as_str(), CALM]);
    let out = run_with_timeout(run.command(&args), LIMIT);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_eq!(findings(&run.report()), [(code_name.to_string(), Some(rank))], "{fault}");
    run.assert_nothing_left();
}
