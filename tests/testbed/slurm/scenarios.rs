//! The Slurm scenarios, in one test on one cluster (it starts in a few seconds; the scenarios
//! build on each other's node states):
//! 1. a healthy `srun` job step runs the training command on every node;
//! 2. a fault on node2 fails the step with exit 1 and drains node2 with gpusanity's reason;
//! 3. node3 is drained by hand ("maintenance");
//! 4. slurmd's HealthCheckProgram (`gpusanity check --quick --slurm-drain`) passes on every
//!    node: it resumes node2 (gpusanity's drain) and leaves node3 drained (someone else's);
//! 5. with a fault on node1, the HealthCheckProgram drains node1 with gpusanity's reason;
//! 6. node3 resumed by hand, a fault there in the prolog: a batch job on node3 never runs, node3
//!    is drained with gpusanity's reason and the job is requeued and held.
//!
//! Then the cluster is stopped and nothing it started is left.

use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use super::cluster::{wait_for, Cluster, NODES};
use crate::common::{bin, code, serial, stderr, tagged_processes};
use crate::netns::{skip, Bed, Prereq};

const STEP_LIMIT: Duration = Duration::from_secs(120);
/// slurmd runs the health check every 5 s; one quick check takes a few seconds here.
const HC_LIMIT: Duration = Duration::from_secs(60);

/// `srun -N3 gpusanity check ... -- COMMAND` with one CPU worker per node.
fn check_step(c: &Cluster, extra: &[&str], env: &[(&str, &str)], command: &[&str]) -> (Output, Duration) {
    let report = c.dir.path().join("report");
    let report = report.to_string_lossy();
    let mut args = vec!["-N3", "--ntasks-per-node=1", bin(), "check", "--device", "cpu", "--nproc-per-node", "1"];
    args.extend(["--micro-benchmarks=gemm", "--report-dir", &report]);
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(command);
    let master = c.bed.nodes[0].addr.clone();
    let mut env = env.to_vec();
    env.extend([("MASTER_ADDR", master.as_str()), ("GPUSANITY_RDZV_SECRET", "slurm-scenario-secret-0123456789")]);
    let start = Instant::now();
    let out = c.srun(&args, &env, STEP_LIMIT);
    (out, start.elapsed())
}

fn show(out: &Output) -> String {
    format!("stdout:\n{}\nstderr:\n{}", String::from_utf8_lossy(&out.stdout), stderr(out))
}

/// The health check runs of `node` that started after `since` (ns since the epoch): (start, end, rc).
fn hc_runs(dir: &Path, node: &str, since: u128) -> Vec<(u128, u128, i32)> {
    let text = std::fs::read_to_string(dir.join(format!("hc/runs-{node}"))).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.get(1)?.parse().ok()?, f.get(2)?.parse().ok()?))
        })
        .filter(|(s, _, _)| *s > since)
        .collect()
}

/// Only the daemons carry the tag: no check, step or job is running.
fn wait_quiet(c: &Cluster) -> bool {
    let daemons = ["munged", "slurmctld", "slurmd"];
    wait_for(Duration::from_secs(30), || {
        tagged_processes(&c.tag).iter().all(|(pid, _)| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            daemons.contains(&comm.trim())
        })
    })
}

fn now_ns() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos()
}

#[test]
fn slurm_1_job_step_drain_health_check_program_and_resume() {
    let test = "slurm_1_job_step_drain_health_check_program_and_resume";
    let _g = serial();
    if let Some(why) = super::missing_programs() {
        return skip(Prereq::Slurm, test, &why);
    }
    let bed = match Bed::with_host(NODES.len()) {
        Ok(b) => b,
        Err(why) => return skip(Prereq::Root, test, &why),
    };
    let started = Instant::now();
    let mut c = match Cluster::start(bed) {
        Ok(c) => c,
        Err(why) => return skip(Prereq::Slurm, test, &why),
    };
    let up = started.elapsed();
    let dir = c.dir.path().to_path_buf();
    let state = |c: &Cluster, n: &str| c.state(n).unwrap_or_else(|e| panic!("{n}: {e}\n{}", c.logs()));

    // 1. A healthy job step hands over to the training command on every node.
    let train = format!("echo trained > {}/trained-$SLURMD_NODENAME", dir.display());
    let (out, healthy) = check_step(&c, &[], &[], &["sh", "-c", &train]);
    assert_eq!(code(&out), 0, "{}", show(&out));
    for n in NODES {
        let marker = std::fs::read_to_string(dir.join(format!("trained-{n}"))).unwrap_or_default();
        assert_eq!(marker.trim(), "trained", "{n}: {}", show(&out));
        std::fs::remove_file(dir.join(format!("trained-{n}"))).unwrap_or_default();
    }
    // The report names the nodes by their Slurm names (SLURMD_NODENAME).
    let report = crate::common::read_json(&dir.join("report/report.json"));
    let hosts: Vec<&str> =
        report["node_verdicts"].as_array().unwrap().iter().filter_map(|v| v["host"].as_str()).collect();
    assert_eq!(hosts, NODES, "{}", report["node_verdicts"]);

    // 2. A wrong GEMM on node2 (rank 1) fails the step and drains node2, and only node2.
    let (out, failing) = check_step(
        &c,
        &["--test-faults", "--slurm-drain"],
        &[("GPUSANITY_FAULT", "gemm-wrong@1")],
        &["sh", "-c", &train],
    );
    assert_eq!(code(&out), 1, "{}", show(&out));
    assert!(NODES.iter().all(|n| !dir.join(format!("trained-{n}")).exists()), "the training ran after a failure");
    let node2 = state(&c, "node2");
    assert!(node2.drained_by("gpusanity:"), "{node2:?}\n{}", show(&out));
    assert!(node2.reason.as_deref().unwrap_or("").starts_with("gpusanity: GEMM_WRONG_RESULT"), "{node2:?}");
    assert!(stderr(&out).contains("gpusanity: slurm: drained node2"), "{}", show(&out));
    for n in ["node1", "node3"] {
        assert_eq!(state(&c, n).state, ["IDLE"], "{n}");
    }

    // 3. Someone else drains node3.
    let out = c.slurm("scontrol", &["update", "nodename=node3", "state=drain", "reason=maintenance"]);
    assert!(out.status.success(), "{}", show(&out));

    // 4. The HealthCheckProgram passes everywhere: node2 resumed, node3 left drained.
    let t0 = now_ns();
    std::fs::write(dir.join("hc/on"), "").unwrap();
    let resumed = wait_for(HC_LIMIT, || c.state("node2").is_ok_and(|s| !s.is_drained()));
    assert!(resumed, "node2 was not resumed: {:?}\n{}", c.state("node2"), c.logs());
    assert!(wait_for(HC_LIMIT, || hc_runs(&dir, "node3", t0).iter().any(|r| r.2 == 0)), "{}", c.logs());
    let node3 = state(&c, "node3");
    assert!(node3.is_drained() && node3.reason.as_deref() == Some("maintenance"), "{node3:?}");
    let out3 = std::fs::read_to_string(dir.join("hc/out-node3")).unwrap_or_default();
    assert!(out3.contains("node3 stays drained: drained by someone else (maintenance)"), "{out3}");

    // 5. A fault on node1: its HealthCheckProgram drains it with gpusanity's reason.
    let t1 = now_ns();
    std::fs::write(dir.join("hc/fault-node1"), "gemm-wrong@0").unwrap();
    let drained = wait_for(HC_LIMIT, || c.state("node1").is_ok_and(|s| s.drained_by("gpusanity:")));
    let marked = Duration::from_nanos((now_ns() - t1) as u64);
    let node1 = state(&c, "node1");
    assert!(drained, "node1 was not drained: {node1:?}\n{}", c.logs());
    assert!(node1.reason.as_deref().unwrap_or("").starts_with("gpusanity: GEMM_WRONG_RESULT"), "{node1:?}");
    assert!(hc_runs(&dir, "node1", t1).iter().any(|r| r.2 == 1), "the failed check exits 1");
    assert!(!state(&c, "node2").is_drained(), "node2 passes: left resumed");

    // The quick check's own time, as slurmd ran it (it must end well inside slurmd's 60 s).
    let quick: Vec<f64> =
        NODES.iter().flat_map(|n| hc_runs(&dir, n, t0)).map(|(s, e, _)| (e - s) as f64 / 1e9).collect();
    let longest = quick.iter().copied().fold(0.0, f64::max);
    assert!(!quick.is_empty() && longest < 30.0, "{quick:?}");
    eprintln!(
        "slurm figures: cluster up {:.1} s; healthy step {:.1} s; failing step {:.1} s; health check drained \
         node1 {:.1} s after the fault; quick check under slurmd {} runs, mean {:.1} s, longest {longest:.1} s",
        up.as_secs_f64(),
        healthy.as_secs_f64(),
        failing.as_secs_f64(),
        marked.as_secs_f64(),
        quick.len(),
        quick.iter().sum::<f64>() / quick.len() as f64,
    );

    // 6. The prolog: a failing quick check on node3 stops a batch job there.
    std::fs::remove_file(dir.join("hc/on")).unwrap();
    assert!(wait_quiet(&c), "checks still running: {:?}", tagged_processes(&c.tag));
    let out = c.slurm("scontrol", &["update", "nodename=node3", "state=resume"]);
    assert!(out.status.success(), "{}", show(&out));
    std::fs::write(dir.join("prolog/fault-node3"), "gemm-wrong@0").unwrap();
    std::fs::write(dir.join("prolog/on"), "").unwrap();
    let ran = dir.join("batch-ran");
    let wrap = format!("echo ran > {}", ran.display());
    let out = c.slurm("sbatch", &["--parsable", "-N1", "-w", "node3", "-o", "/dev/null", "--wrap", &wrap]);
    assert!(out.status.success(), "{}", show(&out));
    let job = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let drained = wait_for(HC_LIMIT, || c.state("node3").is_ok_and(|s| s.drained_by("gpusanity:")));
    assert!(drained, "node3 was not drained by its prolog: {:?}\n{}", c.state("node3"), c.logs());
    let squeue =
        || String::from_utf8_lossy(&c.slurm("squeue", &["-h", "-j", &job, "-o", "%T|%r"]).stdout).trim().to_string();
    let held = wait_for(Duration::from_secs(30), || {
        let q = squeue();
        q.starts_with("PENDING|") && q.to_ascii_lowercase().contains("held")
    });
    assert!(held, "job {job} is `{}`, not requeued and held\n{}", squeue(), c.logs());
    assert!(!ran.exists(), "the batch job ran after a failed prolog");
    let node3 = state(&c, "node3");
    assert!(node3.reason.as_deref().unwrap_or("").starts_with("gpusanity: GEMM_WRONG_RESULT"), "{node3:?}");
    eprintln!("slurm prolog: job {job} `{}`, node3 `{}`", squeue(), node3.reason.unwrap_or_default());
    let _ = c.slurm("scancel", &[&job]);
    std::fs::remove_file(dir.join("prolog/on")).unwrap();

    // Nothing left: the checks have ended, the daemons stop, no process carries the tag.
    assert!(wait_quiet(&c), "checks still running: {:?}", tagged_processes(&c.tag));
    let left = c.stop();
    assert!(left.is_empty(), "processes left after the daemons stopped: {left:?}");
    for k in 0..NODES.len() {
        assert!(c.bed.pids(k).is_empty(), "processes left in node {k}'s namespace: {:?}", c.bed.pids(k));
    }
}
