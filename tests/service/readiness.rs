//! A GPU job on a node whose GPUs CUDA cannot use ends CheckFailed naming the node, never
//! CheckPassed: an agent started as on a GPU node (`--device auto`, the default) whose node
//! tree (`GPUSANITY_TEST_HW_ROOT`, the operator's variable) has an NVIDIA GPU on the PCI bus,
//! and a CUDA that cannot use it (`CUDA_VISIBLE_DEVICES` naming no GPU; here no CUDA at all).

use gpusanity_testkit::svc;

use std::time::Duration;

use svc::World;

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";

#[test]
fn a_gpu_job_on_a_node_whose_cuda_cannot_use_its_gpu_ends_check_failed_naming_the_node() {
    let _g = svc::common::serial();
    let tree = tempfile::tempdir().unwrap();
    let bus = "0000:19:00.0";
    std::fs::create_dir_all(tree.path().join("proc/driver/nvidia")).unwrap();
    let dev = tree.path().join("sys/bus/pci/devices").join(bus);
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
    std::fs::write(dev.join("class"), "0x030200\n").unwrap();

    let mut w = World::new(None, FAST);
    w.serve();
    let wrap = vec![
        "env".to_string(),
        format!("GPUSANITY_TEST_HW_ROOT={}", tree.path().display()),
        "CUDA_VISIBLE_DEVICES=99".to_string(),
    ];
    // The last --device counts: the test kit's `cpu`, then the default of a GPU node.
    w.agent_via("gpu-x", &wrap, &["--device", "auto"]);
    let mut out = w.reader("check-events");
    w.allocate("rd-1", "job-rd", "--micro-benchmarks=gemm");
    let end = out
        .wait_for(Duration::from_secs(90), "the verdict", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    assert_eq!(end["type"], "CheckFailed", "{end:#}");
    assert_eq!(end["faulty_nodes"], serde_json::json!(["gpu-x"]), "{end:#}");
    let summary = end["summary"].as_str().unwrap_or("");
    assert!(summary.contains("NODE_GPU_UNUSABLE") && summary.contains("gpu-x") && summary.contains(bus), "{end:#}");
    assert_eq!(w.sql("SELECT state FROM runs"), ["CheckFailed"]);
    assert_eq!(w.sql("SELECT DISTINCT node_name FROM findings WHERE severity = 'critical'"), ["gpu-x"]);
    w.shutdown();
}
