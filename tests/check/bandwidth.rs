//! `memory-bandwidth`, `host-bandwidth` and `rdma-ports` through the real binary on CPU
//! workers: host memory copies verified and a corrupting or slow rank named; the host link not
//! applicable without a device; RDMA ports read from a fake sysfs tree (the test hook honoured
//! only with `--test-faults`).

use gpusanity_testkit::common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;

const LIMIT: Duration = Duration::from_secs(90);
/// Small copies: the figures are not what these tests are about.
const SMALL: &str = "--check-param=memory-bandwidth.size=8388608";
const IB_ROOT_ENV: &str = "GPUSANITY_TEST_IB_ROOT";

fn check<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["checks"].as_array().unwrap().iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no check {name}"))
}

#[test]
fn memory_bandwidth_passes_on_cpu_and_names_a_corrupting_or_slow_rank() {
    let _g = serial();
    let run = Run::new();
    let calm = "--check-param=diagnosis.slow-fraction=0.05";
    let out = run_with_timeout(run.command(&["--micro-benchmarks=memory-bandwidth", SMALL, calm]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    let c = check(&r, "memory-bandwidth");
    assert_eq!(c["status"], "passed", "{c}");
    assert_eq!(c["config"]["size"], 8_388_608);
    for rank in c["ranks"].as_array().unwrap() {
        assert!(rank["metrics"]["gbps"].as_f64().unwrap() > 0.0, "{rank}");
        assert_eq!(rank["metrics"]["wrong_words"], 0.0);
    }
    run.assert_nothing_left();

    // One byte of rank 1's destination overwritten before verification: that rank is named.
    let run = Run::new();
    let envs = "--sanity-check-envs=GPUSANITY_FAULT=memory-bandwidth-wrong@1";
    let out = run_with_timeout(
        run.command(&["--micro-benchmarks=memory-bandwidth", SMALL, calm, "--test-faults", envs]),
        LIMIT,
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(findings(&r), [("MEMORY_BW_WRONG_RESULT".to_string(), Some(1))]);
    let bad = &check(&r, "memory-bandwidth")["ranks"][1];
    assert_eq!(bad["metrics"]["wrong_words"], 1.0, "{bad}");
    run.assert_nothing_left();

    // Rank 0 copies eight times per timed copy: slow against its peer in both measurements. At
    // the CPU default size (64 MiB, two buffers per rank), not SMALL: two ranks' 16 MiB of
    // small buffers fit a shared 32 MiB L3 together, and the rank copying four times as often
    // keeps its buffers cached while its peer's are evicted (at four times), so the peer measured as slow as the
    // faulty rank in 7 of 12 runs on the CI machine (none of 12 at 64 MiB).
    let run = Run::new();
    let envs = "--sanity-check-envs=GPUSANITY_FAULT=memory-bandwidth-slow@0";
    let out = run_with_timeout(run.command(&["--micro-benchmarks=memory-bandwidth", "--test-faults", envs]), LIMIT);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_eq!(findings(&run.report()), [("MEMORY_BW_SLOW".to_string(), Some(0))]);
    run.assert_nothing_left();
}

#[test]
fn hostile_sizes_are_refused_before_any_worker_starts() {
    let _g = serial();
    for param in [
        "memory-bandwidth.size=18446744073709551615",
        "memory-bandwidth.size=24",
        "host-bandwidth.size=18446744073709551616",
    ] {
        let run = Run::new();
        let out = run_with_timeout(
            run.command(&["--micro-benchmarks=memory-bandwidth", &format!("--check-param={param}")]),
            Duration::from_secs(30),
        );
        let err = stderr(&out);
        assert_eq!(code(&out), 2, "{param}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        run.assert_nothing_left();
    }
    // A size that parses but cannot fit in this host's memory: refused by the memory fit.
    let run = Run::new();
    let out = run_with_timeout(
        run.command(&["--micro-benchmarks=memory-bandwidth", "--check-param=memory-bandwidth.size=1099511627776"]),
        Duration::from_secs(30),
    );
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("memory-bandwidth needs"), "{}", stderr(&out));
}

#[test]
fn host_bandwidth_is_not_applicable_on_cpu() {
    let _g = serial();
    let run = Run::new();
    let out = run_with_timeout(run.command(&["--micro-benchmarks=host-bandwidth"]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let c = check(&run.report(), "host-bandwidth").clone();
    assert_eq!(c["status"], "not_applicable", "{c}");
    let why = c["ranks"][0]["notes"]["not_applicable"].as_str().unwrap();
    assert!(why.contains("no device link"), "{why}");
    run.assert_nothing_left();
}

/// Writes one port of a fake /sys/class/infiniband.
fn port(root: &Path, dev: &str, state: &str, phys: &str, rate: &str, link_downed: u64) {
    let d = root.join(dev).join("ports").join("1");
    std::fs::create_dir_all(d.join("counters")).unwrap();
    for (f, v) in [("state", state), ("phys_state", phys), ("rate", rate), ("link_layer", "InfiniBand")] {
        std::fs::write(d.join(f), format!("{v}\n")).unwrap();
    }
    set_counter(root, dev, "link_downed", link_downed);
    for c in ["link_error_recovery", "symbol_error", "port_rcv_errors", "excessive_buffer_overrun_errors"] {
        set_counter(root, dev, c, 0);
    }
}

fn set_counter(root: &Path, dev: &str, counter: &str, v: u64) {
    std::fs::write(root.join(dev).join("ports/1/counters").join(counter), format!("{v}\n")).unwrap();
}

fn rdma_run(run: &Run, root: &Path, extra: &[&str]) -> std::process::Command {
    let mut args = vec!["--micro-benchmarks=rdma-ports", "--test-faults", "--check-param=rdma-ports.window-ms=50"];
    args.extend(extra);
    let mut c = run.command(&args);
    c.env(IB_ROOT_ENV, root);
    c
}

#[test]
fn rdma_ports_pass_healthy_name_a_down_port_and_are_not_applicable_without_devices() {
    let _g = serial();
    let tree = tempfile::tempdir().unwrap();
    let root = tree.path().join("infiniband");
    for dev in ["mlx5_0", "mlx5_1"] {
        port(&root, dev, "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", 0);
    }
    let run = Run::new();
    let out = run_with_timeout(rdma_run(&run, &root, &[]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    let c = check(&r, "rdma-ports");
    assert_eq!(c["status"], "passed", "{c}");
    assert_eq!(c["ranks"][0]["metrics"]["ports"], 2.0);
    assert!(c["ranks"][0]["notes"]["span"].as_str().unwrap().starts_with("since the worker started"), "{c}");
    run.assert_nothing_left();

    // Without --test-faults the fake tree is not honoured: this machine has no RDMA devices.
    let run = Run::new();
    let mut cmd = run.command(&["--micro-benchmarks=rdma-ports"]);
    cmd.env(IB_ROOT_ENV, &root);
    let out = run_with_timeout(cmd, LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let c = check(&run.report(), "rdma-ports").clone();
    if !Path::new("/sys/class/infiniband").exists() {
        assert_eq!(c["status"], "not_applicable", "{c}");
        let why = c["ranks"][0]["notes"]["not_applicable"].as_str().unwrap();
        assert!(why.starts_with("no RDMA devices"), "{why}");
    }

    // A port down, another at half the rate of the fastest: both named, on node 0.
    port(&root, "mlx5_1", "1: DOWN", "2: Polling", "400 Gb/sec (4X NDR)", 0);
    port(&root, "mlx5_2", "4: ACTIVE", "5: LinkUp", "200 Gb/sec (4X HDR)", 0);
    let run = Run::new();
    let out = run_with_timeout(rdma_run(&run, &root, &[]), LIMIT);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    let f = r["findings"].as_array().unwrap();
    let named: Vec<(&str, u64, bool)> = f
        .iter()
        .map(|f| {
            (
                f["code"].as_str().unwrap(),
                f["node_rank"].as_u64().unwrap(),
                f["message"].as_str().unwrap().contains("mlx5_"),
            )
        })
        .collect();
    assert_eq!(named, [("RDMA_PORT_DOWN", 0, true), ("RDMA_PORT_RATE_LOW", 0, true)], "{f:?}");
    assert!(f[0]["message"].as_str().unwrap().contains("mlx5_1 port 1"));
    assert!(f[1]["message"].as_str().unwrap().contains("mlx5_2 port 1"));
    assert_eq!(r["node_verdicts"][0]["health"], "faulty");
    run.assert_nothing_left();

    // No devices at all: not applicable, with the reason.
    let empty = tree.path().join("none");
    std::fs::create_dir_all(&empty).unwrap();
    let run = Run::new();
    let out = run_with_timeout(rdma_run(&run, &empty, &[]), LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let c = check(&run.report(), "rdma-ports").clone();
    assert_eq!(c["status"], "not_applicable", "{c}");
    assert!(c["ranks"][0]["notes"]["not_applicable"].as_str().unwrap().starts_with("no RDMA devices"), "{c}");
}

#[test]
fn a_port_whose_link_went_down_during_the_run_is_named_flapped() {
    let _g = serial();
    let tree = tempfile::tempdir().unwrap();
    let root = tree.path().join("infiniband");
    for dev in ["mlx5_0", "mlx5_1"] {
        port(&root, dev, "4: ACTIVE", "5: LinkUp", "400 Gb/sec (4X NDR)", 3);
    }
    let run = Run::new();
    // The check watches for 4 s; once the worker has taken its first reading, the link of
    // mlx5_1 goes down and comes back (its counter grows by one).
    let mut cmd = rdma_run(&run, &root, &["--check-param=rdma-ports.window-ms=4000"]);
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("spawn gpusanity");
    find_worker(&run.tag, 0, LIMIT);
    std::thread::sleep(Duration::from_millis(1500));
    set_counter(&root, "mlx5_1", "link_downed", 4);
    let out = wait_output(child, LIMIT);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    let f = r["findings"].as_array().unwrap();
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0]["code"], "RDMA_PORT_FLAPPED");
    assert_eq!(f[0]["node_rank"], 0);
    let msg = f[0]["message"].as_str().unwrap();
    assert!(msg.contains("mlx5_1 port 1") && msg.contains("link_downed +1"), "{msg}");
    run.assert_nothing_left();
}
