//! The multi-node fault-injection test bed: three nodes as network namespaces on a bridge, each
//! running the real `gpusanity check` on CPU; one fault per scenario, and the verdict and the
//! named node or rank asserted. Skips (saying why) where root, iproute2, tc or cgroup v1 cpu
//! are missing.

mod common;
mod netns;

use std::process::{Child, Output};
use std::time::{Duration, Instant};

use common::*;
use netns::{skip, Bed};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

const NODES: usize = 3;
const PORT: u16 = 29500;
const LIMIT: Duration = Duration::from_secs(120);

/// The faulty node in every fault scenario, and its one rank.
const BAD: u64 = 2;

/// Settings of every scenario: the default checks, a short sweep, deadlines a slow run meets.
const BASE: &[&str] = &[
    "--micro-benchmarks=gemm,all-reduce",
    "--check-param",
    "all-reduce.max-bytes=1048576",
];

fn bed(test: &str) -> Option<Bed> {
    match Bed::new(NODES) {
        Ok(b) => Some(b),
        Err(why) => {
            skip(test, &why);
            None
        }
    }
}

/// A finished scenario: the serial guard, the bed, the run, every node's output, the time.
type Scenario = (
    std::sync::MutexGuard<'static, ()>,
    Bed,
    Run,
    Vec<Output>,
    Duration,
);

/// One scenario at a time (CPU figures), on a fresh bed, with a fresh run.
fn setup(test: &str) -> Option<(std::sync::MutexGuard<'static, ()>, Bed, Run)> {
    let g = serial();
    let bed = bed(test)?;
    Some((g, bed, Run::new()))
}

/// A scenario with a fault set up before the nodes start (skipped if it cannot be made here).
fn fault_scenario(
    test: &str,
    fault: impl FnOnce(&Bed) -> Result<(), String>,
) -> Option<(std::sync::MutexGuard<'static, ()>, Bed, Run, Vec<Output>)> {
    let (g, bed, run) = setup(test)?;
    if let Err(why) = fault(&bed) {
        skip(test, &why);
        return None;
    }
    let out = wait_all(spawn_all(&bed, &run, &[]));
    Some((g, bed, run, out))
}

fn spawn_all(bed: &Bed, run: &Run, extra: &[&str]) -> Vec<Child> {
    let mut args: Vec<&str> = BASE.to_vec();
    if !extra
        .iter()
        .any(|a| a.starts_with("--sanity-check-timeout-per-test"))
    {
        args.push("--sanity-check-timeout-per-test=0.5");
    }
    args.extend_from_slice(extra);
    (0..NODES).map(|k| bed.spawn(run, k, PORT, &args)).collect()
}

fn wait_all(children: Vec<Child>) -> Vec<Output> {
    children
        .into_iter()
        .map(|c| wait_output(c, LIMIT))
        .collect()
}

fn critical(r: &Value) -> Vec<(String, Option<u64>, Option<u64>)> {
    r["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|f| f["severity"] == "critical")
                .map(|f| {
                    (
                        f["code"].as_str().unwrap_or("").to_string(),
                        f["node_rank"].as_u64(),
                        f["rank"].as_u64(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn faulty(r: &Value) -> Vec<u64> {
    r["faulty_nodes"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default()
}

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
    let Some((_g, bed, run)) = setup("testbed_1_clean") else {
        return;
    };
    let out = wait_all(spawn_all(&bed, &run, &[]));
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
    let fault = |bed: &Bed| bed.rate_limit(BAD as usize, "100mbit");
    let Some((_g, bed, run, out)) = fault_scenario("testbed_2_rate_limit", fault) else {
        return;
    };
    assert_eq!(code(&out[0]), 1, "{}", stderr(&out[0]));
    assert_named(&bed.report(&run), "NODE_COMM_SLOW", None);
    run.assert_nothing_left();
}

#[test]
fn testbed_3_a_node_whose_link_goes_down_is_named_and_the_run_ends_in_time() {
    // The link goes down during a GEMM of a few seconds.
    let down = |bed: &Bed, _| bed.link_down(BAD as usize).expect("link down");
    let Some((_g, bed, run, out, took)) = during_run(
        "testbed_3_link_down",
        &["--check-param", "gemm.iters=40"],
        down,
    ) else {
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
    let fault = |bed: &Bed| bed.cpu_quota(BAD as usize, 20);
    let Some((_g, bed, run, out)) = fault_scenario("testbed_4_cpu_quota", fault) else {
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

/// Starts the bed with `extra` settings and a 6 s per-test deadline, waits until the bad
/// rank's worker runs, then injects `fault` (given the worker's pid). Returns the outputs and
/// the time the run took.
fn during_run(test: &str, extra: &[&str], fault: impl FnOnce(&Bed, i32)) -> Option<Scenario> {
    let (g, bed, run) = setup(test)?;
    let start = Instant::now();
    let mut args = vec!["--sanity-check-timeout-per-test=0.1"];
    args.extend_from_slice(extra);
    let children = spawn_all(&bed, &run, &args);
    let pid = find_worker(&run.tag, BAD, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(1500));
    fault(&bed, pid);
    let out = wait_all(children);
    Some((g, bed, run, out, start.elapsed()))
}

fn signal_scenario(test: &str, sig: Signal) -> Option<Scenario> {
    const LONG_GEMM: &[&str] = &[
        "--check-param",
        "gemm.size=256",
        "--check-param",
        "gemm.iters=100000",
    ];
    during_run(test, LONG_GEMM, |_, pid| {
        kill(Pid::from_raw(pid), sig).expect("signal the worker")
    })
}

#[test]
fn testbed_5_a_stopped_worker_is_named_for_the_hang() {
    let Some((_g, bed, run, out, took)) = signal_scenario("testbed_5_sigstop", Signal::SIGSTOP)
    else {
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
    let Some((_g, bed, run, out, took)) = signal_scenario("testbed_6_sigkill", Signal::SIGKILL)
    else {
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
