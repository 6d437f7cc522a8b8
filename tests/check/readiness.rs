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
    run_with_timeout(c, LIMIT)
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
