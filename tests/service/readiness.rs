//! A GPU job on a node whose GPUs CUDA cannot use ends CheckFailed naming the node, never
//! CheckPassed: an agent started as on a GPU node (`--device auto`, the default) whose node
//! tree (`GPUSANITY_TEST_HW_ROOT`, the operator's variable) has an NVIDIA GPU on the PCI bus,
//! and a CUDA that cannot use it (`CUDA_VISIBLE_DEVICES` naming no GPU; here no CUDA at all).

use gpusanity_testkit::svc;

use std::time::Duration;

use svc::World;

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";

/// A node tree with the NVIDIA driver loaded and an NVIDIA 3D controller at `bus`.
fn gpu_tree(bus: &str) -> tempfile::TempDir {
    let tree = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(tree.path().join("proc/driver/nvidia")).unwrap();
    let dev = tree.path().join("sys/bus/pci/devices").join(bus);
    std::fs::create_dir_all(&dev).unwrap();
    std::fs::write(dev.join("vendor"), "0x10de\n").unwrap();
    std::fs::write(dev.join("class"), "0x030200\n").unwrap();
    tree
}

/// An agent's wrapper: that node tree, and a CUDA that cannot use its GPU.
fn unusable_cuda(tree: &tempfile::TempDir) -> Vec<String> {
    vec![
        "env".to_string(),
        format!("GPUSANITY_TEST_HW_ROOT={}", tree.path().display()),
        "CUDA_VISIBLE_DEVICES=99".to_string(),
    ]
}

#[test]
fn a_gpu_job_on_a_node_whose_cuda_cannot_use_its_gpu_ends_check_failed_naming_the_node() {
    let _g = svc::common::serial();
    let bus = "0000:19:00.0";
    let tree = gpu_tree(bus);
    let mut w = World::new(None, FAST);
    w.serve();
    let wrap = unusable_cuda(&tree);
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

/// A two-node job whose node 1 has an NVIDIA GPU that CUDA cannot use: node 1's launcher
/// brings its finding to the rendezvous and node 0's report names it, so the verdict names
/// node 1 with NODE_GPU_UNUSABLE and its bus id (not a node that never arrived).
#[test]
fn a_two_node_job_whose_second_node_cannot_use_its_gpu_names_it_with_its_evidence() {
    let _g = svc::common::serial();
    let bus = "0000:3b:00.0";
    let tree = gpu_tree(bus);
    let mut w = World::new(None, FAST);
    w.serve();
    w.agent("cpu-0");
    let wrap = unusable_cuda(&tree);
    w.agent_via("gpu-1", &wrap, &["--device", "auto"]);
    let mut out = w.reader("check-events");
    w.allocate("rd-3", "job-two", "--micro-benchmarks=gemm");
    let end = out
        .wait_for(Duration::from_secs(90), "the verdict", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    assert_eq!(end["type"], "CheckFailed", "{end:#}");
    assert_eq!(end["faulty_nodes"], serde_json::json!(["gpu-1"]), "{end:#}");
    let summary = end["summary"].as_str().unwrap_or("");
    assert!(summary.contains("NODE_GPU_UNUSABLE") && summary.contains("gpu-1") && summary.contains(bus), "{end:#}");
    assert!(!summary.contains("NODE_MISSING"), "{end:#}");
    assert_eq!(w.sql("SELECT DISTINCT code FROM findings WHERE node_name = 'gpu-1'"), ["NODE_GPU_UNUSABLE"]);
    w.shutdown();
}

/// A GPU job (`gpus: 1`) checked by an agent started with `--device cpu` (the test kit's) says
/// so in its verdict event, a field and the text; and the agent's operator parameters reach its
/// launcher (here a GEMM size the job did not ask for, seen in the run's report).
#[test]
fn a_gpu_job_checked_on_the_cpu_backend_says_so_in_its_verdict_and_the_agent_passes_its_check_params() {
    let _g = svc::common::serial();
    let mut w = World::new(None, FAST);
    w.serve();
    w.agent_via("cpu-x", &[], &["--check-param", "gemm.size=48"]);
    let mut out = w.reader("check-events");
    w.allocate("rd-2", "job-cpu", "--micro-benchmarks=gemm");
    let end = out
        .wait_for(Duration::from_secs(90), "the verdict", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    assert_eq!(end["backend"], "cpu", "{end:#}");
    let summary = end["summary"].as_str().unwrap_or("");
    assert!(summary.contains("CPU backend") && summary.contains("GPUs were not checked"), "{end:#}");
    let run_id = end["run_id"].as_str().expect("run_id");
    let report = svc::common::read_json(&w.dir.path().join("agent-cpu-x").join(run_id).join("report/report.json"));
    let gemm = report["checks"].as_array().unwrap().iter().find(|c| c["name"] == "gemm").cloned().unwrap_or_default();
    assert_eq!(gemm["config"]["size"], 48, "{gemm:#}");
    w.shutdown();
}

/// An operator parameter the launchers would refuse stops the agent at its start (exit 2, one
/// line naming it), before it reads its keys or reaches Kafka; so do too many or too long ones.
#[test]
fn an_agent_with_an_unknown_or_bad_check_param_refuses_to_start() {
    let long = format!("gemm.size={}", "9".repeat(5000));
    let many: Vec<String> = (0..300).flat_map(|_| ["--check-param".to_string(), "gemm.size=64".to_string()]).collect();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--check-param".into(), "gpu-health.leftover-memory-share=0.1".into()],
            "gpu-health.leftover-memory-share",
        ),
        (vec!["--check-param".into(), "nope.key=1".into()], "nope.key"),
        (vec!["--check-param".into(), "gemm.size=-3".into()], "gemm.size"),
        (vec!["--check-param".into(), "no-equals-sign".into()], "no-equals-sign"),
        (vec!["--check-param".into(), long], "longer than"),
        (many, "at most 256"),
    ];
    for (args, says) in cases {
        let mut c = std::process::Command::new(svc::common::bin());
        c.args(["agent", "--node", "n1", "--kafka", "127.0.0.1:9"]).args(&args);
        c.env_remove("GPUSANITY_CONFIG").env_remove("GPUSANITY_AGENT_KEYS");
        let out = svc::common::run_with_timeout(c, Duration::from_secs(20));
        let err = svc::common::stderr(&out);
        assert_eq!(svc::common::code(&out), 2, "{says}: {err}");
        assert!(err.contains(says), "{says}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
}
