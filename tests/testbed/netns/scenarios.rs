//! The test bed's scenarios: a clean run and five faults on node 2, each run on a fresh
//! three-node bed, and how a report is scored against the fault injected.

use std::process::{Child, Output};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::Value;

use super::{skip, Bed, Prereq};
use crate::common::{find_worker, serial, wait_output, Run};

pub const NODES: usize = 3;
pub const PORT: u16 = 29500;
pub const LIMIT: Duration = Duration::from_secs(120);

/// The faulty node in every fault scenario, and its one rank.
pub const BAD: u64 = 2;

/// Settings of every scenario: the default checks, a short sweep, deadlines a slow run meets.
pub const BASE: &[&str] = &["--micro-benchmarks=gemm,all-reduce", "--check-param", "all-reduce.max-bytes=1048576"];

pub fn bed(test: &str) -> Option<Bed> {
    match Bed::new(NODES) {
        Ok(b) => Some(b),
        Err(why) => {
            skip(Prereq::Root, test, &why);
            None
        }
    }
}

/// A finished scenario: the serial guard, the bed, the run, every node's output, the time.
pub type Scenario = (std::sync::MutexGuard<'static, ()>, Bed, Run, Vec<Output>, Duration);

/// One scenario at a time (CPU figures), on a fresh bed, with a fresh run.
pub fn setup(test: &str) -> Option<(std::sync::MutexGuard<'static, ()>, Bed, Run)> {
    let g = serial();
    let bed = bed(test)?;
    Some((g, bed, Run::new()))
}

/// A scenario with a fault set up before the nodes start (skipped if it cannot be made here).
pub fn fault_scenario(test: &str, fault: impl FnOnce(&Bed) -> Result<(), String>) -> Option<Scenario> {
    let (g, bed, run) = setup(test)?;
    if let Err(why) = fault(&bed) {
        skip(Prereq::Root, test, &why);
        return None;
    }
    let start = Instant::now();
    let out = wait_all(spawn_all(&bed, &run, &[]));
    Some((g, bed, run, out, start.elapsed()))
}

pub fn spawn_all(bed: &Bed, run: &Run, extra: &[&str]) -> Vec<Child> {
    let mut args: Vec<&str> = BASE.to_vec();
    if !extra.iter().any(|a| a.starts_with("--sanity-check-timeout-per-test")) {
        args.push("--sanity-check-timeout-per-test=0.5");
    }
    args.extend_from_slice(extra);
    (0..NODES).map(|k| bed.spawn(run, k, PORT, &args)).collect()
}

pub fn wait_all(children: Vec<Child>) -> Vec<Output> {
    children.into_iter().map(|c| wait_output(c, LIMIT)).collect()
}

/// The critical findings of a report as (code, node, rank).
pub fn critical(r: &Value) -> Vec<(String, Option<u64>, Option<u64>)> {
    r["findings"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|f| f["severity"] == "critical")
                .map(|f| (f["code"].as_str().unwrap_or("").to_string(), f["node_rank"].as_u64(), f["rank"].as_u64()))
                .collect()
        })
        .unwrap_or_default()
}

/// The report's faulty nodes.
pub fn faulty(r: &Value) -> Vec<u64> {
    r["faulty_nodes"].as_array().map(|a| a.iter().filter_map(Value::as_u64).collect()).unwrap_or_default()
}

/// The scenarios, each with the finding it must produce on the bad node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Clean,
    RateLimit,
    LinkDown,
    CpuQuota,
    Stop,
    Kill,
}

impl Kind {
    pub const ALL: [Kind; 6] = [Kind::Clean, Kind::RateLimit, Kind::LinkDown, Kind::CpuQuota, Kind::Stop, Kind::Kill];

    pub fn expected_code(self) -> Option<&'static str> {
        match self {
            Kind::Clean => None,
            Kind::RateLimit => Some("NODE_COMM_SLOW"),
            Kind::LinkDown => Some("NODE_LOST"),
            Kind::CpuQuota => Some("GEMM_SLOW"),
            Kind::Stop => Some("TEST_HANG"),
            Kind::Kill => Some("WORKER_CRASHED"),
        }
    }

    pub fn run(self) -> Option<Scenario> {
        let name = format!("testbed {self:?}");
        match self {
            Kind::Clean => fault_scenario(&name, |_| Ok(())),
            Kind::RateLimit => fault_scenario(&name, |bed| bed.rate_limit(BAD as usize, "100mbit")),
            Kind::CpuQuota => fault_scenario(&name, |bed| bed.cpu_quota(BAD as usize, 20)),
            Kind::LinkDown => {
                // The link goes down during a GEMM of a few seconds.
                let down = |bed: &Bed, _| bed.link_down(BAD as usize).expect("link down");
                during_run(&name, &["--check-param", "gemm.iters=40"], down)
            }
            Kind::Stop => signal_scenario(&name, Signal::SIGSTOP),
            Kind::Kill => signal_scenario(&name, Signal::SIGKILL),
        }
    }

    /// Whether the report found this scenario's fault on the bad node (for the clean one: a
    /// pass with no finding at all), and how many findings name anything else.
    pub fn score(self, r: &Value) -> (bool, usize) {
        let all = r["findings"].as_array().cloned().unwrap_or_default();
        match self.expected_code() {
            None => (r["status"] == "passed" && all.is_empty(), all.len()),
            Some(code) => {
                let found = critical(r).iter().any(|(c, n, _)| c == code && *n == Some(BAD)) && faulty(r) == [BAD];
                let wrong = all
                    .iter()
                    .filter(|f| {
                        let node = f["node_rank"].as_u64();
                        let pair = f["pair"].as_array().map(|p| p.iter().filter_map(Value::as_u64).collect::<Vec<_>>());
                        node.is_some_and(|n| n != BAD) || pair.is_some_and(|p| !p.contains(&BAD))
                    })
                    .count();
                (found, wrong + faulty(r).iter().filter(|n| **n != BAD).count())
            }
        }
    }
}

/// Starts the bed with `extra` settings and a 6 s per-test deadline, waits until the bad
/// rank's worker runs, then injects `fault` (given the worker's pid). Returns the outputs and
/// the time the run took.
pub fn during_run(test: &str, extra: &[&str], fault: impl FnOnce(&Bed, i32)) -> Option<Scenario> {
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

pub fn signal_scenario(test: &str, sig: Signal) -> Option<Scenario> {
    const LONG_GEMM: &[&str] = &["--check-param", "gemm.size=256", "--check-param", "gemm.iters=100000"];
    during_run(test, LONG_GEMM, |_, pid| kill(Pid::from_raw(pid), sig).expect("signal the worker"))
}
