//! The model checks through the real binary with two CPU workers: real training, data- and
//! tensor-parallel groups over TCP, and the findings of injected faults.

use gpusanity_testkit::common;

use std::time::Duration;

use common::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(120);

fn check<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {name} in {r}"))
}

fn note<'a>(c: &'a Value, rank: usize, key: &str) -> &'a str {
    c["ranks"][rank]["notes"][key].as_str().unwrap_or_else(|| panic!("no note {key} in {c}"))
}

/// A field of a rank's structured detail.
fn detail<'a>(c: &'a Value, rank: usize, key: &str) -> &'a Value {
    let v = &c["ranks"][rank]["detail"][key];
    assert!(!v.is_null(), "no detail {key} in {c}");
    v
}

fn metric(c: &Value, rank: usize, key: &str) -> f64 {
    c["ranks"][rank]["metrics"][key].as_f64().unwrap_or_else(|| panic!("no metric {key} in {c}"))
}

#[test]
fn the_three_models_train_and_agree_across_ranks() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&["--micro-benchmarks=", "--model-benchmarks=mini-gpt,megatron-gpt,resnet"]),
        LIMIT,
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    assert!(findings(&r).is_empty(), "{:?}", findings(&r));
    let mini = check(&r, "mini-gpt");
    assert_eq!(mini["status"], "passed");
    assert_eq!(mini["config"]["layers"], 2);
    for rank in 0..2 {
        assert!(metric(mini, rank, "loss_final") < 0.8 * metric(mini, rank, "loss_first"));
        assert!(metric(mini, rank, "tokens_per_s") > 0.0 && metric(mini, rank, "step_ms_median") > 0.0);
        assert_eq!(note(mini, rank, "layout"), "TP 1 x DP 2");
        // No GPU here: no power or clock figure, and a note that says why.
        for c in [mini, check(&r, "megatron-gpt"), check(&r, "resnet")] {
            let metrics = c["ranks"][rank]["metrics"].as_object().unwrap();
            assert!(!metrics.keys().any(|k| k.starts_with("power_") || k.starts_with("sm_mhz")), "{metrics:?}");
            assert!(note(c, rank, "power_not_sampled").starts_with("CPU backend"));
        }
    }
    // Data parallel: both ranks end with the same parameters.
    assert_eq!(detail(mini, 0, "param_checksum"), detail(mini, 1, "param_checksum"));
    let meg = check(&r, "megatron-gpt");
    assert_eq!(meg["status"], "passed");
    assert_eq!(note(meg, 0, "layout"), "TP 2 x DP 1");
    // Tensor parallel: each rank holds its own shard, and both see the same (reduced) loss.
    assert_ne!(detail(meg, 0, "param_checksum"), detail(meg, 1, "param_checksum"));
    assert_eq!(detail(meg, 0, "losses"), detail(meg, 1, "losses"));
    let res = check(&r, "resnet");
    assert_eq!(res["status"], "passed");
    assert!(metric(res, 1, "loss_final") < 0.8 * metric(res, 1, "loss_first"));
    assert!(metric(res, 0, "images_per_s") > 0.0);
    assert_eq!(detail(res, 0, "param_checksum"), detail(res, 1, "param_checksum"));
    assert!(note(res, 0, "convolution").starts_with("im2col + GEMM"));
    run.assert_nothing_left();
}

#[test]
fn a_parameter_corrupted_on_one_rank_is_silent_data_corruption_of_that_rank() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&[
            "--micro-benchmarks=",
            "--model-benchmarks=mini-gpt",
            "--test-faults",
            "--sanity-check-envs=GPUSANITY_FAULT=model-corrupt@1",
        ]),
        LIMIT,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(findings(&r), [("MODEL_SILENT_DATA_CORRUPTION".to_string(), Some(1))]);
    let mini = check(&r, "mini-gpt");
    assert_eq!(mini["status"], "failed");
    assert_ne!(detail(mini, 0, "param_checksum"), detail(mini, 1, "param_checksum"));
    assert_eq!(r["status"], "failed");
    run.assert_nothing_left();
}

#[test]
fn a_forced_nan_fails_the_check_naming_the_rank_and_the_step() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&[
            "--micro-benchmarks=",
            "--model-benchmarks=mini-gpt",
            "--check-param",
            "mini-gpt.steps=12",
            "--test-faults",
            "--sanity-check-envs=GPUSANITY_FAULT=model-nan@0",
        ]),
        LIMIT,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    let f: Vec<&Value> = r["findings"].as_array().unwrap().iter().collect();
    let critical: Vec<&&Value> = f.iter().filter(|f| f["severity"] == "critical").collect();
    assert_eq!(critical.len(), 1, "{f:?}");
    assert_eq!(critical[0]["code"], "MODEL_LOSS_NOT_FINITE");
    assert_eq!(critical[0]["rank"], 0);
    // NaN poisoned before step 12 / 3 = 4: rank 0's loss is NaN there, rank 1's one step later.
    assert!(critical[0]["message"].as_str().unwrap().contains("at step 4"), "{f:?}");
    assert!(f.iter().any(|f| f["severity"] == "warning" && f["rank"] == 1), "{f:?}");
    run.assert_nothing_left();
}

#[test]
fn bad_model_parameters_are_refused_before_anything_starts() {
    let _g = serial();
    let run = Run::new();
    for bad in ["mini-gpt.heads=3", "resnet.blocks=1:x", "megatron-gpt.colour=2"] {
        let out = run_with_timeout(
            run.command(&["--micro-benchmarks=", "--model-benchmarks=mini-gpt", "--check-param", bad]),
            LIMIT,
        );
        assert_eq!(code(&out), 2, "{bad}: {}", stderr(&out));
        assert!(stderr(&out).contains(bad.split('=').next().unwrap()), "{bad}: {}", stderr(&out));
    }
    // A tensor-parallel size that does not divide the node's workers: an error naming it.
    let out = run_with_timeout(
        run.command(&["--micro-benchmarks=", "--model-benchmarks=megatron-gpt", "--check-param", "megatron-gpt.tp=3"]),
        LIMIT,
    );
    assert_ne!(code(&out), 0);
    let r = run.report();
    let meg = check(&r, "megatron-gpt");
    assert!(meg["ranks"][0]["error"].as_str().unwrap().contains("tensor-parallel size 3"), "{meg}");
    run.assert_nothing_left();
}

#[test]
fn a_rank_with_slow_compute_is_named() {
    let _g = serial();
    let run = Run::new();
    // Rank 1 runs each step's forward and backward six times over.
    let out = run_with_timeout(
        run.command(&[
            "--micro-benchmarks=",
            "--model-benchmarks=mini-gpt",
            "--test-faults",
            "--sanity-check-envs=GPUSANITY_FAULT=model-slow@1",
        ]),
        LIMIT,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(findings(&r), [("MODEL_SLOW_STEP".to_string(), Some(1))]);
    let mini = check(&r, "mini-gpt");
    // Not six times: while rank 0 waits in the step's all-reduce, rank 1 has the cores to itself,
    // and where the two CPUs are one core's hyperthreads it then runs up to twice as fast.
    assert!(metric(mini, 1, "compute_ms_median") > 2.5 * metric(mini, 0, "compute_ms_median"), "{mini}");
    run.assert_nothing_left();
}

#[test]
fn megatron_gpt_runs_tensor_parallel_inside_nodes_and_data_parallel_across_them() {
    let _g = serial();
    let run = Run::new();
    let port = free_port().to_string();
    let node = |rank: &str| {
        let mut c = run.command(&[
            "--micro-benchmarks=",
            "--model-benchmarks=megatron-gpt",
            "--nnodes",
            "2",
            "--node-rank",
            rank,
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            &port,
        ]);
        c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        c.spawn().expect("spawn gpusanity")
    };
    let n1 = node("1");
    let n0 = node("0");
    let (o0, o1) = (wait_output(n0, LIMIT), wait_output(n1, LIMIT));
    assert_eq!(code(&o0), 0, "{}", stderr(&o0));
    assert_eq!(code(&o1), 0, "{}", stderr(&o1));
    let r = run.report();
    let meg = check(&r, "megatron-gpt");
    assert_eq!(meg["status"], "passed");
    let sum = |rank: usize| detail(meg, rank, "param_checksum").clone();
    for rank in 0..4 {
        assert_eq!(note(meg, rank, "layout"), "TP 2 x DP 2");
    }
    // Ranks 0 and 2 hold the same shard on different nodes and end identical; so do 1 and 3.
    assert_eq!((sum(0), sum(1)), (sum(2), sum(3)));
    assert_ne!(sum(0), sum(1));
    assert_eq!((detail(meg, 0, "dp_group"), detail(meg, 3, "dp_group")), (&Value::from(0), &Value::from(1)));
    // Each node's TP pair saw its own data: the same losses inside a node, different across.
    assert_eq!(detail(meg, 0, "losses"), detail(meg, 1, "losses"));
    assert_ne!(detail(meg, 0, "losses"), detail(meg, 2, "losses"));
    run.assert_nothing_left();
}
