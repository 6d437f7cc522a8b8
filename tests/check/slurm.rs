//! `gpusanity check` under Slurm without a cluster (the real one is the test bed's,
//! tests/testbed/slurm/): `--quick` checks one node whatever the job's environment says, and
//! `--slurm-drain` / `--slurm-dry-run` act on node 0's verdict through a stand-in scontrol.

use gpusanity_testkit::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

/// A stand-in scontrol: `show node` prints STATE for the node asked, `update` appends its
/// arguments (one line per call) to scontrol.log.
fn fake_scontrol(dir: &Path, state: &str) -> String {
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = show ]; then echo \"NodeName=$4 {state}\"; exit 0; fi\n\
         echo \"$*\" >> {}/scontrol.log\n",
        dir.display()
    );
    let path = dir.join("scontrol");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_string_lossy().into_owned()
}

/// `gpusanity check --quick` as node gpu7 with `scontrol` and `flag` (`--slurm-drain` or
/// `--slurm-dry-run`), a wrong GEMM when `fault`: its exit code and stderr.
fn quick_on_gpu7(run: &Run, scontrol: &str, flag: &str, fault: bool) -> (i32, String) {
    let mut cmd =
        run.command(&["--quick", "--nproc-per-node", "1", "--node-name", "gpu7", "--scontrol", scontrol, flag]);
    if fault {
        cmd.arg("--test-faults").env("GPUSANITY_FAULT", "gemm-wrong@0");
    }
    let out = run_with_timeout(cmd, LIMIT);
    (code(&out), stderr(&out))
}

fn updates(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("scontrol.log")).unwrap_or_default()
}

#[test]
fn quick_checks_this_node_alone_whatever_the_job_environment_says() {
    let _g = serial();
    let run = Run::new();
    let mut cmd = run.command(&["--quick", "--nproc-per-node", "1"]);
    // A prolog of a three-node job: without --quick this node would wait for the others.
    cmd.env("SLURM_NNODES", "3").env("SLURM_NODEID", "1").env("SLURM_JOB_NODELIST", "gpu[1-3]");
    cmd.env("SLURMD_NODENAME", "gpu2");
    let out = run_with_timeout(cmd, LIMIT);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let r = run.report();
    let checks: Vec<&str> = r["checks"].as_array().unwrap().iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(checks, ["gpu-health", "gemm", "kernel-launch", "memory-bandwidth"], "{}", r["checks"]);
    assert_eq!(r["node_verdicts"][0]["host"], "gpu2", "{}", r["node_verdicts"]);
    assert_eq!(r["settings"]["timeout_per_test_minutes"], 0.5, "{}", r["settings"]);
    let bad = run_with_timeout(run.command(&["--quick", "--nnodes", "2"]), LIMIT);
    assert_eq!(code(&bad), 2, "{}", stderr(&bad));
    assert!(stderr(&bad).contains("--quick checks this node alone"), "{}", stderr(&bad));
    run.assert_nothing_left();
}

#[test]
fn slurm_drain_drains_a_failing_node_and_a_dry_run_only_says_so() {
    let (_g, run) = (serial(), Run::new());
    let (dir, scontrol) = (run.dir.path(), fake_scontrol(run.dir.path(), "State=IDLE"));
    let (code, err) = quick_on_gpu7(&run, &scontrol, "--slurm-dry-run", true);
    assert_eq!(code, 1, "{err}");
    let would = format!(
        "gpusanity: slurm: dry run: would run for gpu7: {scontrol} update nodename=gpu7 state=drain \
         \"reason=gpusanity: GEMM_WRONG_RESULT in gemm: "
    );
    assert!(err.contains(&would), "{err}");
    assert_eq!(updates(dir), "", "a dry run updated a node");

    let (code, err) = quick_on_gpu7(&run, &scontrol, "--slurm-drain", true);
    assert_eq!(code, 1, "{err}");
    let log = updates(dir);
    assert!(log.starts_with("update nodename=gpu7 state=drain reason=gpusanity: GEMM_WRONG_RESULT in gemm: "), "{log}");
    assert_eq!(log.lines().count(), 1, "{log}");
    run.assert_nothing_left();
}

#[test]
fn a_pass_resumes_only_a_drain_of_gpusanitys_and_a_refused_update_is_a_warning() {
    let (_g, run) = (serial(), Run::new());
    let dir = run.dir.path();
    // A drain of gpusanity's is resumed, once.
    let ours = fake_scontrol(dir, "State=IDLE+DRAIN Reason=gpusanity: GEMM_WRONG_RESULT x [root@2026-12-01T10:00:00]");
    let (code, err) = quick_on_gpu7(&run, &ours, "--slurm-drain", false);
    assert_eq!(code, 0, "{err}");
    assert_eq!(updates(dir), "update nodename=gpu7 state=resume\n");
    assert!(err.contains("resumed gpu7"), "{err}");

    std::fs::remove_file(dir.join("scontrol.log")).unwrap();
    let theirs = fake_scontrol(dir, "State=IDLE+DRAIN Reason=maintenance [admin@2026-12-01T10:00:00]");
    let (code, err) = quick_on_gpu7(&run, &theirs, "--slurm-drain", false);
    assert_eq!(code, 0, "{err}");
    assert_eq!(updates(dir), "", "someone else's drain was resumed");
    assert!(err.contains("gpu7 stays drained: drained by someone else (maintenance)"), "{err}");

    // scontrol refuses (a job step's user has no operator rights): a warning, the verdict stands.
    let (code, err) = quick_on_gpu7(&run, "false", "--slurm-drain", false);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("gpusanity: slurm: warning: `false show node -o gpu7` failed"), "{err}");
    run.assert_nothing_left();
}
