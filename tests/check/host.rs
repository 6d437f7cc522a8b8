//! What the last job left in the kernel log and the node's settings, through the real binary on
//! a rig: a fake node tree (`GPUSANITY_TEST_HW_ROOT`) with one NVIDIA GPU and a kernel log file
//! (`GPUSANITY_TEST_KMSG`), both honoured only with `--test-faults`, on the CPU backend (the
//! census's GPU is the job's).

use gpusanity_testkit::common;

use std::path::Path;
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);
const GPU: &str = "0000:19:00.0";
const BRIDGE: &str = "0000:18:00.0";
const FALLEN: &str =
    "3,812,94571234,-;NVRM: Xid (PCI:0000:19:00): 79, pid=4242, name=python, GPU has fallen off the bus.";

/// A clean node: the driver (580, open module), the GPU below a bridge without ACS redirect,
/// a large /dev/shm, memlock unlimited, one RDMA device and nvidia_peermem loaded.
fn node(root: &Path) {
    let w = |p: &str, v: &[u8]| {
        let p = root.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, v).unwrap();
    };
    w(
        "proc/driver/nvidia/version",
        b"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n",
    );
    w("dev/nvidia0", b"");
    let dev = format!("sys/devices/pci0000:00/{BRIDGE}/{GPU}");
    w(&format!("{dev}/vendor"), b"0x10de\n");
    w(&format!("{dev}/class"), b"0x030200\n");
    w(&format!("sys/devices/pci0000:00/{BRIDGE}/config"), &acs_config(0x0001));
    std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
    std::os::unix::fs::symlink(root.join(&dev), root.join("sys/bus/pci/devices").join(GPU)).unwrap();
    w("rig/shm-bytes", format!("{}\n", 8u64 << 30).as_bytes());
    w("proc/self/limits", b"Limit  Soft Limit  Hard Limit  Units\nMax locked memory         unlimited            unlimited            bytes\n");
    w("proc/modules", b"nvidia_peermem 16384 0 - Live 0x0\nnvidia 1 0 - Live 0x0\n");
    w("proc/sys/kernel/osrelease", b"6.8.0-45-generic\n");
    w("sys/class/infiniband/mlx5_0/node_type", b"1: CA\n");
}

/// A bridge's 4096-byte configuration space holding an ACS capability with `control`.
fn acs_config(control: u16) -> Vec<u8> {
    let mut cfg = vec![0u8; 4096];
    cfg[0x100..0x104].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
    cfg[0x106..0x108].copy_from_slice(&control.to_le_bytes());
    cfg
}

/// `gpusanity check` on the rig at `root` with the kernel log `kmsg`: its output and report.
fn check(root: &Path, kmsg: &Path, extra: &[&str]) -> (std::process::Output, serde_json::Value, Run) {
    let run = Run::new();
    let mut args = vec!["--test-faults", "--micro-benchmarks=gemm", "--check-param", "gemm.size=64"];
    args.extend(extra);
    let mut c = run.command(&args);
    c.env("GPUSANITY_TEST_HW_ROOT", root).env("GPUSANITY_TEST_KMSG", kmsg);
    let out = run_with_timeout(c, LIMIT);
    let report = run.report();
    (out, report, run)
}

/// The host findings of the report: (code, severity).
fn host_findings(r: &serde_json::Value) -> Vec<(String, String)> {
    r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "device")
        .map(|f| (f["code"].as_str().unwrap().to_string(), f["severity"].as_str().unwrap().to_string()))
        .collect()
}

fn log(dir: &Path, lines: &[&str]) -> std::path::PathBuf {
    let p = dir.join("kmsg");
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    p
}

#[test]
fn a_fatal_xid_left_in_the_kernel_log_fails_the_node_until_a_reset_or_reboot_clears_it() {
    let _g = serial();
    let tree = tempfile::tempdir().unwrap();
    node(tree.path());
    let logs = tempfile::tempdir().unwrap();
    let boot = "6,1,0,-;Linux version 6.8.0-45-generic (buildd@lcy02) #45-Ubuntu SMP";

    let (out, r, run) = check(tree.path(), &log(logs.path(), &[boot, FALLEN]), &[]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_eq!(host_findings(&r), [("NODE_KERNEL_XID_FATAL".to_string(), "critical".to_string())], "{r}");
    let f = r["findings"].as_array().unwrap().iter().find(|f| f["code"] == "NODE_KERNEL_XID_FATAL").unwrap();
    let msg = f["message"].as_str().unwrap();
    assert!(msg.contains("0000:19:00") && msg.contains("XID 79") && msg.contains("94.6 s after boot"), "{msg}");
    assert!(f["evidence"][0].as_str().unwrap().contains("GPU has fallen off the bus"), "{f}");
    assert!(f["action"].as_str().unwrap().contains("reboot"), "{f}");
    assert_eq!(f["node_rank"], 0);
    assert_eq!(r["faulty_nodes"], serde_json::json!([0]));
    assert!(r["summary"].as_str().unwrap().starts_with("NODE_KERNEL_XID_FATAL"), "{}", r["summary"]);
    assert_eq!(r["hosts"][0]["readings"]["kernel_log"]["scan"]["outstanding"][0]["xid"], 79, "{}", r["hosts"]);
    run.assert_nothing_left();

    let reset = "6,900,95000000,-;gpusanity: GPU 0000:19:00.0 reset";
    let reload = "6,900,95000000,-;NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.95.05";
    for cleared in [vec![boot, FALLEN, reset], vec![boot, FALLEN, reload], vec![FALLEN, boot]] {
        let (out, r, _) = check(tree.path(), &log(logs.path(), &cleared), &[]);
        assert_eq!(code(&out), 0, "{cleared:?}: {}", stderr(&out));
        assert_eq!(host_findings(&r), [], "{cleared:?}: {r}");
        assert!(r["hosts"][0]["readings"]["kernel_log"]["scan"]["cleared"].as_u64().unwrap() >= 1, "{}", r["hosts"]);
    }

    // Another GPU's XID is not this job's.
    let other = "3,812,94571234,-;NVRM: Xid (PCI:0000:9a:00): 79, pid=1, GPU has fallen off the bus.";
    let (out, r, _) = check(tree.path(), &log(logs.path(), &[boot, other]), &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(host_findings(&r), [], "{r}");
    // The operator's policy: warn, or leave the log unread.
    let (out, r, _) =
        check(tree.path(), &log(logs.path(), &[boot, FALLEN]), &["--check-param", "gpu-health.kernel-xids=warning"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(host_findings(&r), [("NODE_KERNEL_XID_FATAL".to_string(), "warning".to_string())], "{r}");
}

#[test]
fn a_benign_xid_warns_and_an_unreadable_log_warns() {
    let _g = serial();
    let tree = tempfile::tempdir().unwrap();
    node(tree.path());
    let logs = tempfile::tempdir().unwrap();
    let benign = "4,813,95000000,-;NVRM: Xid (PCI:0000:19:00): 13, pid=4242, Graphics SM Warp Exception";
    let (out, r, _) = check(tree.path(), &log(logs.path(), &[benign]), &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(host_findings(&r), [("NODE_KERNEL_XID".to_string(), "warning".to_string())], "{r}");
    assert_eq!(r["status"], "passed");

    let (out, r, _) = check(tree.path(), &logs.path().join("no-such-log"), &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(host_findings(&r), [("NODE_KERNEL_LOG_UNREADABLE".to_string(), "warning".to_string())], "{r}");
    assert!(r["findings"].to_string().contains("no-such-log"), "{r}");
}

#[test]
fn each_node_setting_fails_or_warns_as_documented_and_a_clean_node_passes() {
    let _g = serial();
    let logs = tempfile::tempdir().unwrap();
    let kmsg = log(logs.path(), &["6,1,0,-;Linux version 6.8.0"]);
    let clean = tempfile::tempdir().unwrap();
    node(clean.path());
    let (out, r, run) = check(clean.path(), &kmsg, &["--nproc-per-node", "4"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(host_findings(&r), [], "{r}");
    let h = &r["hosts"][0]["readings"];
    assert_eq!(h["gpus"], serde_json::json!([GPU]), "{h}");
    assert_eq!(h["memlock"], "unlimited", "{h}");
    assert_eq!(h["acs"][0]["control"], 1, "{h}");
    run.assert_nothing_left();

    type Change = fn(&Path);
    let cases: [(&str, Change, &str, &str); 5] = [
        (
            "NODE_SHM_SMALL",
            |t| std::fs::write(t.join("rig/shm-bytes"), format!("{}", 64u64 << 20)).unwrap(),
            "critical",
            "--nproc-per-node=4",
        ),
        (
            "NODE_MEMLOCK_LIMITED",
            |t| {
                std::fs::write(
                    t.join("proc/self/limits"),
                    "Max locked memory         65536                65536                bytes\n",
                )
                .unwrap()
            },
            "critical",
            "--nproc-per-node=1",
        ),
        (
            "NODE_NO_GPUDIRECT_RDMA",
            |t| {
                std::fs::write(t.join("proc/modules"), "nvidia 1 0 - Live 0x0\n").unwrap();
                std::fs::write(t.join("proc/sys/kernel/osrelease"), "5.4.0-200-generic\n").unwrap();
            },
            "warning",
            "--nproc-per-node=1",
        ),
        (
            "NODE_PCIE_ACS_ENABLED",
            |t| std::fs::write(t.join(format!("sys/devices/pci0000:00/{BRIDGE}/config")), acs_config(0x001d)).unwrap(),
            "warning",
            "--nproc-per-node=1",
        ),
        (
            "NODE_DRIVER_TOO_OLD",
            |t| {
                std::fs::write(
                    t.join("proc/driver/nvidia/version"),
                    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.124.06  Release Build\n",
                )
                .unwrap()
            },
            "critical",
            "--nproc-per-node=1",
        ),
    ];
    for (want, change, severity, nproc) in cases {
        let tree = tempfile::tempdir().unwrap();
        node(tree.path());
        change(tree.path());
        let (out, r, _) = check(tree.path(), &kmsg, &[nproc]);
        assert_eq!(host_findings(&r), [(want.to_string(), severity.to_string())], "{want}: {r}");
        assert_eq!(code(&out), if severity == "critical" { 1 } else { 0 }, "{want}: {}", stderr(&out));
    }
}

#[test]
fn without_test_faults_the_rigs_log_and_tree_are_not_read() {
    let _g = serial();
    let tree = tempfile::tempdir().unwrap();
    node(tree.path());
    let logs = tempfile::tempdir().unwrap();
    let run = Run::new();
    let mut c = run.command(&["--micro-benchmarks=gemm", "--check-param", "gemm.size=64"]);
    c.env("GPUSANITY_TEST_HW_ROOT", tree.path()).env("GPUSANITY_TEST_KMSG", log(logs.path(), &[FALLEN]));
    let out = run_with_timeout(c, LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    // This machine's own root has no NVIDIA hardware: nothing of the host is judged.
    if !Path::new("/proc/driver/nvidia").exists() {
        assert_eq!(host_findings(&r), [], "{r}");
        assert!(r.get("hosts").is_none(), "{r}");
    }
    assert!(!r["findings"].to_string().contains("NODE_KERNEL_XID_FATAL"), "{r}");
}

/// Node `rank` of a two-node loopback run on the rig `root` with the kernel log `kmsg`.
fn node_of_two(run: &Run, root: &Path, kmsg: &Path, rank: usize, port: u16, name: &str) -> std::process::Child {
    let (r, p) = (rank.to_string(), port.to_string());
    let mut c = run.command(&[
        "--test-faults",
        "--micro-benchmarks=gemm",
        "--check-param=gemm.size=64",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--master-addr=127.0.0.1",
        "--rdzv-timeout=30",
    ]);
    c.args(["--node-rank", &r, "--master-port", &p, "--node-name", name]);
    c.env("GPUSANITY_TEST_HW_ROOT", root).env("GPUSANITY_TEST_KMSG", kmsg);
    c.env("GPUSANITY_RDZV_SECRET", "a-secret-of-the-two-node-run-0123456789");
    c.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    c.spawn().expect("spawn gpusanity")
}

#[test]
fn node_0_names_the_other_node_whose_kernel_log_holds_a_fatal_xid_and_only_that_node() {
    let _g = serial();
    let tree = tempfile::tempdir().unwrap();
    node(tree.path());
    let (clean, broken) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let clean_log = log(clean.path(), &["6,1,0,-;Linux version 6.8.0"]);
    let broken_log = log(broken.path(), &[FALLEN]);
    let run = Run::new();
    let port = free_port();
    let n0 = node_of_two(&run, tree.path(), &clean_log, 0, port, "gpu-a");
    let n1 = node_of_two(&run, tree.path(), &broken_log, 1, port, "gpu-b");
    let (o0, o1) = (wait_output(n0, LIMIT), wait_output(n1, LIMIT));
    assert_eq!((code(&o0), code(&o1)), (1, 1), "{}\n{}", stderr(&o0), stderr(&o1));
    let r = run.report();
    assert_eq!(host_findings(&r), [("NODE_KERNEL_XID_FATAL".to_string(), "critical".to_string())], "{r}");
    let f = r["findings"].as_array().unwrap().iter().find(|f| f["code"] == "NODE_KERNEL_XID_FATAL").unwrap();
    assert_eq!((f["node_rank"].as_u64(), f["host"].as_str()), (Some(1), Some("gpu-b")), "{f}");
    assert_eq!(r["faulty_nodes"], serde_json::json!([1]));
    assert_eq!(r["hosts"].as_array().unwrap().len(), 2, "{}", r["hosts"]);
    run.assert_nothing_left();
}
