//! A node that cannot run the job's GPUs never passes, through the real binary: a fake node
//! tree (`GPUSANITY_TEST_HW_ROOT`, the operator's variable) with an NVIDIA GPU on the PCI bus,
//! and a CUDA that cannot use it (`CUDA_VISIBLE_DEVICES` naming no GPU, as a broken device
//! plugin gives; on this machine there is no CUDA at all).

use gpusanity_testkit::common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);
const BUS_ID: &str = "0000:19:00.0";

/// A node with one H200-like GPU: the driver loaded, `/dev/nvidia0`, a 3D controller of
/// NVIDIA's on the PCI bus.
fn gpu_node(root: &Path) {
    std::fs::create_dir_all(root.join("proc/driver/nvidia/gpus").join(BUS_ID)).unwrap();
    std::fs::create_dir_all(root.join("dev")).unwrap();
    std::fs::write(root.join("dev/nvidia0"), b"").unwrap();
    let dev = root.join("sys/bus/pci/devices").join(BUS_ID);
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
    std::fs::write(dev.join("class"), "0x030200\n").unwrap();
}

/// `gpusanity check` with `args` (no `--device` unless given) on the node tree at `root`.
fn check(run: &Run, root: &Path, args: &[&str]) -> std::process::Output {
    run_with_timeout(command(run, root, args), LIMIT)
}

fn command(run: &Run, root: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(bin());
    c.arg("check").arg("--report-dir").arg(run.report_dir()).args(args);
    c.env("GPUSANITY_TEST_HW_ROOT", root).env("GPUSANITY_TEST_TAG", &run.tag).env("CUDA_VISIBLE_DEVICES", "99");
    for v in [
        "SANITY_CHECK_ARGS",
        "ENABLE_SANITY_CHECK",
        "TORCHELASTIC_RESTART_COUNT",
        "GPUSANITY_RESTART_COUNT",
        "WORLD_SIZE",
        "RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "SLURM_NNODES",
        "SLURM_NODEID",
        "SLURM_JOB_NODELIST",
        "SLURMD_NODENAME",
        "SLURM_GPUS_ON_NODE",
        "SLURM_JOB_GPUS",
        "GPUSANITY_RDZV_SECRET",
    ] {
        c.env_remove(v);
    }
    c.stdin(Stdio::null());
    c
}

/// Node `rank` of a two-node loopback run with an authenticated rendezvous, on the node tree
/// at `root`, named `name`.
fn node(run: &Run, root: &Path, rank: usize, port: u16, name: &str) -> std::process::Child {
    let (r, p) = (rank.to_string(), port.to_string());
    let args = ["--nnodes", "2", "--node-rank", &r, "--master-addr", "127.0.0.1", "--master-port", &p];
    let mut c = command(run, root, &args);
    c.args(["--nproc-per-node", "1", "--rdzv-timeout", "30", "--node-name", name]);
    c.args(["--micro-benchmarks=gemm", "--check-param", "gemm.size=64"]);
    c.env("GPUSANITY_RDZV_SECRET", "a-secret-of-the-two-node-run-0123456789");
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c.spawn().expect("spawn gpusanity")
}

/// A two-node run, node K on the tree `roots[K]` named `names[K]`: both nodes' output.
fn two_nodes(run: &Run, roots: [&Path; 2], names: [&str; 2]) -> (std::process::Output, std::process::Output) {
    let port = free_port();
    let n0 = node(run, roots[0], 0, port, names[0]);
    let n1 = node(run, roots[1], 1, port, names[1]);
    (wait_output(n0, LIMIT), wait_output(n1, LIMIT))
}

/// The NODE_GPU_UNUSABLE finding of node `rank` in `r`, checked for its evidence.
fn named_unusable(r: &serde_json::Value, rank: u64, host: &str) {
    let all = r["findings"].as_array().unwrap();
    let f = all.iter().find(|f| f["node_rank"] == rank).unwrap_or_else(|| panic!("node {rank} not named: {r}"));
    assert_eq!(f["code"], "NODE_GPU_UNUSABLE", "{r}");
    assert_eq!(f["severity"], "critical");
    assert_eq!(f["host"], host);
    let msg = f["message"].as_str().unwrap();
    assert!(msg.contains(host) && msg.contains(BUS_ID), "{msg}");
    assert!(f["evidence"].to_string().contains("CUDA_VISIBLE_DEVICES=99"), "{f}");
}

/// Was: node 0 named a node whose GPUs CUDA cannot use only NODE_MISSING, after the whole
/// rendezvous wait, with no bus id and no error.
#[test]
fn a_node_other_than_node_0_that_cannot_use_its_gpu_is_named_by_node_0_with_its_evidence() {
    let _g = serial();
    let (cpu, gpu) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    gpu_node(gpu.path());
    let run = Run::new();
    let started = std::time::Instant::now();
    let (o0, o1) = two_nodes(&run, [cpu.path(), gpu.path()], ["cpu-a", "gpu-b"]);
    assert!(started.elapsed() < Duration::from_secs(25), "waited for the rendezvous: {:?}", started.elapsed());
    assert_eq!(code(&o0), 1, "{}", stderr(&o0));
    assert_eq!(code(&o1), 1, "{}", stderr(&o1));
    assert!(stderr(&o1).contains("NODE_GPU_UNUSABLE"), "{}", stderr(&o1));
    let r = run.report();
    assert_eq!(r["status"], "failed");
    assert_eq!(findings(&r), [("NODE_GPU_UNUSABLE".to_string(), None)], "{r}");
    named_unusable(&r, 1, "gpu-b");
    assert_eq!(r["faulty_nodes"], serde_json::json!([1]));
    assert!(r["summary"].as_str().unwrap().contains("gpu-b"), "{}", r["summary"]);
    assert_eq!(run.events(), ["Checking", "CheckFailed"]);
    assert!(String::from_utf8_lossy(&o0.stdout).contains("NODE_GPU_UNUSABLE"));
    run.assert_nothing_left();
}

#[test]
fn when_node_0_and_another_node_cannot_use_their_gpus_node_0_names_both() {
    let _g = serial();
    let gpu = tempfile::tempdir().unwrap();
    gpu_node(gpu.path());
    let run = Run::new();
    let (o0, o1) = two_nodes(&run, [gpu.path(), gpu.path()], ["gpu-a", "gpu-b"]);
    assert_eq!((code(&o0), code(&o1)), (1, 1), "{}\n{}", stderr(&o0), stderr(&o1));
    let r = run.report();
    named_unusable(&r, 0, "gpu-a");
    named_unusable(&r, 1, "gpu-b");
    assert_eq!(r["faulty_nodes"], serde_json::json!([0, 1]));
    run.assert_nothing_left();
}

#[test]
fn a_gpu_node_whose_cuda_cannot_use_its_gpu_fails_under_check_quick_and_cuda() {
    let _g = serial();
    let tree = tempfile::tempdir().unwrap();
    gpu_node(tree.path());
    for args in [vec![], vec!["--quick"], vec!["--device", "cuda"], vec!["--device", "auto", "--nproc-per-node", "1"]] {
        let run = Run::new();
        let mut all = args.clone();
        all.extend(["--node-name", "gpu-a"]);
        let out = check(&run, tree.path(), &all);
        assert_eq!(code(&out), 1, "{args:?}: {}", stderr(&out));
        let r = run.report();
        assert_eq!(r["status"], "failed", "{args:?}");
        let f = &r["findings"][0];
        assert_eq!(f["code"], "NODE_GPU_UNUSABLE", "{args:?}: {r}");
        assert_eq!(f["severity"], "critical");
        assert_eq!(f["host"], "gpu-a");
        assert_eq!(f["node_rank"], 0);
        let msg = f["message"].as_str().unwrap();
        assert!(msg.contains("gpu-a") && msg.contains(BUS_ID), "{msg}");
        let evidence = f["evidence"].to_string();
        assert!(evidence.contains("CUDA_VISIBLE_DEVICES=99"), "{evidence}");
        assert_eq!(r["faulty_nodes"], serde_json::json!([0]));
        assert_eq!(run.events(), ["Checking", "CheckFailed"]);
        assert!(String::from_utf8_lossy(&out.stdout).contains("NODE_GPU_UNUSABLE"), "{args:?}");
        run.assert_nothing_left();
    }
}

#[test]
fn auto_on_a_node_without_nvidia_hardware_checks_on_the_cpu_and_says_so() {
    let _g = serial();
    let tree = tempfile::tempdir().unwrap();
    let run = Run::new();
    let out = check(
        &run,
        tree.path(),
        &["--micro-benchmarks=gemm", "--check-param", "gemm.size=64", "--nproc-per-node", "1"],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("no NVIDIA hardware on this node"), "{}", stderr(&out));
    assert_eq!(run.report()["backend"], "cpu");
}

/// Was `a_missing_gpu_is_a_usage_error` (exit 2): a GPU check on a node without any GPU is the
/// node's failure, not bad input.
#[test]
fn cuda_asked_on_a_node_without_gpus_fails_the_node() {
    let _g = serial();
    let tree = tempfile::tempdir().unwrap();
    let run = Run::new();
    let out = check(&run, tree.path(), &["--device", "cuda", "--nproc-per-node", "1", "--node-name", "cpu-b"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let r = run.report();
    assert_eq!(findings(&r), [("NODE_NO_GPU".to_string(), None)]);
    assert_eq!(r["findings"][0]["host"], "cpu-b");
}
