//! The test bed through the service: `gpusanity serve` on the host, one `gpusanity agent` in
//! each node's namespace. The agents reach the Kafka broker through the bridge (a second
//! listener of this test binary's broker on the bridge's host address) and each other through
//! the bridge: node 0's agent address, in its namespace, hosts the run's rendezvous. A job is
//! allocated on the three nodes by a JobResourcesAllocated event; the published events are
//! the verdict.

use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::scenarios::{BAD, NODES};
use super::{skip, Bed, Prereq};
use crate::common::{find_worker, serial};
use crate::svc::{allocated, broker_listening_on, Reader, World, TOKEN};

/// The service's timing: agents beat every 0.3 s and count as lost after 2 s.
const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";

/// How long a run may take from its allocation to its verdict (the clean run takes ~2 s).
pub const VERDICT_LIMIT: Duration = Duration::from_secs(60);

/// Node `k`'s name in the job events.
pub fn node_name(k: usize) -> String {
    format!("bed-node-{k}")
}

/// The names of the bed's nodes, in node order.
pub fn node_names() -> Vec<String> {
    (0..NODES).map(node_name).collect()
}

/// The service on the host, an agent in each node's namespace, a reader of the output topic.
/// Fields drop in order: the processes are killed before the bed goes.
pub struct ServiceBed {
    pub w: World,
    pub out: Reader,
    pub bed: Bed,
    _serial: MutexGuard<'static, ()>,
}

impl ServiceBed {
    /// A fresh bed with the service and its agents up (None, saying why, where the bed cannot
    /// be built here).
    pub fn new(test: &str) -> Option<ServiceBed> {
        let g = serial();
        let bed = match Bed::with_host(NODES) {
            Ok(b) => b,
            Err(why) => {
                skip(Prereq::Root, test, &why);
                return None;
            }
        };
        let kafka = broker_listening_on(bed.host.as_deref().expect("the bridge's host address"));
        let mut w = World::new(None, FAST);
        w.serve();
        for k in 0..NODES {
            let addr = bed.nodes[k].addr.clone();
            w.agent_via(&node_name(k), &bed.wrap(k), &["--address", &addr, "--kafka", kafka]);
        }
        let out = w.reader("check-events");
        Some(ServiceBed { w, out, bed, _serial: g })
    }

    /// Publishes a JobResourcesAllocated for `job` on the bed's nodes with these
    /// SanityCheckArgs; returns the run's id once SanityCheckStarted names the three nodes.
    pub fn allocate(&mut self, job: &str, args: &str) -> String {
        let names = node_names();
        let nodes: Vec<&str> = names.iter().map(String::as_str).collect();
        self.allocate_on(job, &nodes, args)
    }

    /// [`ServiceBed::allocate`] on some of the bed's nodes (`nodes`, in node-rank order).
    pub fn allocate_on(&mut self, job: &str, nodes: &[&str], args: &str) -> String {
        self.w.publish(allocated(&format!("{job}-allocated"), job, nodes, args).as_bytes());
        let started = self.wait(Duration::from_secs(60), "SanityCheckStarted", |v| {
            v["job_id"] == job && v["type"] == "SanityCheckStarted"
        });
        assert_eq!(started["nodes"], json!(nodes), "{started:#}");
        started["run_id"].as_str().expect("run_id").to_string()
    }

    /// The job's CheckPassed or CheckFailed.
    pub fn verdict(&mut self, job: &str) -> Value {
        let ended = |v: &Value| v["job_id"] == job && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed");
        self.wait(VERDICT_LIMIT, "the verdict", ended)
    }

    /// The first output event that matches `pred` (seen before or arriving within `limit`);
    /// panics with everything seen and the processes' logs if none does.
    pub fn wait(&mut self, limit: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(v) = self.out.seen.iter().find(|v| pred(v)) {
                return v.clone();
            }
            if Instant::now() > deadline {
                panic!("no {what} within {limit:?}; seen: {:#?}\n{}", self.out.seen, self.logs());
            }
            self.out.drain(Duration::from_millis(100));
        }
    }

    /// The service's and the agents' logs.
    pub fn logs(&self) -> String {
        let names = std::iter::once("serve".to_string()).chain(node_names());
        names.map(|n| format!("--- {n} log:\n{}", self.w.log(&n))).collect()
    }

    /// The run's report as the service serves it.
    pub fn report(&self, run_id: &str) -> Value {
        let path = format!("/v1/runs/{run_id}/report");
        let (code, report) = self.w.http_call("GET", &path, Some(TOKEN), None).expect("the service answers");
        assert_eq!(code, 200, "{report:#}");
        report
    }

    /// The agents' pids, in node order.
    fn agents(&self) -> Vec<i32> {
        node_names().iter().map(|n| self.w.pid(n)).collect()
    }

    /// Processes in the nodes' namespaces other than the agents (launchers, workers).
    pub fn run_processes(&self) -> Vec<i32> {
        let agents = self.agents();
        (0..NODES).flat_map(|k| self.bed.pids(k)).filter(|p| !agents.contains(p)).collect()
    }

    /// Waits until only the agents are left in the namespaces; the processes still there
    /// after `limit` (none: the run's launchers and workers have all ended).
    pub fn wait_for_run_end(&self, limit: Duration) -> Vec<i32> {
        let deadline = Instant::now() + limit;
        loop {
            let left = self.run_processes();
            if left.is_empty() || Instant::now() > deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the run's launchers and workers to end (the agents stay), then stops the
    /// service and the agents (SIGTERM; it checks that nothing carrying the test's tag is
    /// left). Returns the processes left in the nodes' namespaces after the run and after the
    /// stop: both empty when all is well.
    pub fn end(&mut self) -> (Vec<i32>, Vec<i32>) {
        let after_run = self.wait_for_run_end(Duration::from_secs(20));
        self.w.shutdown();
        (after_run, (0..NODES).flat_map(|k| self.bed.pids(k)).collect())
    }

    /// [`ServiceBed::end`], asserting that nothing is left.
    pub fn assert_nothing_left(&mut self) {
        let (after_run, after_stop) = self.end();
        assert!(after_run.is_empty(), "left in the namespaces after the run: {after_run:?}");
        assert!(after_stop.is_empty(), "left in the namespaces: {after_stop:?}");
    }

    /// `NODE:1` (healthy) or `NODE:0` per node of the run, from the service's database.
    pub fn health(&self, run_id: &str) -> Vec<String> {
        let mut h = self.w.sql(&format!(
            "SELECT node_name || ':' || CAST(healthy AS TEXT) FROM node_health WHERE run_id = '{run_id}'"
        ));
        h.sort();
        h
    }
}

/// The settings of the scenarios: the checks of the test bed's (with their defaults: a
/// job's SanityCheckArgs set no sizes), a 30 s per-test deadline.
pub fn args() -> String {
    "--micro-benchmarks=gemm,all-reduce --sanity-check-timeout-per-test=0.5".to_string()
}

/// The scenarios through the service.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ServiceKind {
    /// A clean run: CheckPassed.
    Clean,
    /// Node 2's worker SIGKILLed mid-run: CheckFailed naming node 2, NodeIsolated for it.
    Kill,
}

/// A finished scenario: the bed (still up), the run, its verdict, every NodeIsolated of the
/// job, and the time from the fault (or, for the clean run, the allocation) to the verdict.
pub struct ServiceScenario {
    pub s: ServiceBed,
    pub run_id: String,
    pub verdict: Value,
    pub isolated: Vec<Value>,
    pub took: Duration,
}

impl ServiceScenario {
    /// The verdict, asserted to be a `kind` event (with the processes' logs if not).
    pub fn verdict_is(&self, kind: &str) -> &Value {
        let v = &self.verdict;
        assert_eq!(v["type"], kind, "{v:#}\n{}", self.s.logs());
        assert_eq!(v["run_id"], self.run_id.as_str());
        v
    }
}

impl ServiceKind {
    pub const ALL: [ServiceKind; 2] = [ServiceKind::Clean, ServiceKind::Kill];

    pub fn job(self) -> &'static str {
        match self {
            ServiceKind::Clean => "bed-job-clean",
            ServiceKind::Kill => "bed-job-kill",
        }
    }

    pub fn run(self) -> Option<ServiceScenario> {
        let mut s = ServiceBed::new(&format!("testbed service {self:?}"))?;
        let job = self.job();
        let (run_id, from) = match self {
            ServiceKind::Clean => {
                let t = Instant::now();
                (s.allocate(job, &args()), t)
            }
            ServiceKind::Kill => {
                // A job's settings cannot lengthen a check, and the default CPU checks end
                // within a second or two: the bad rank holds at the start of its first check
                // (GPUSANITY_FAULT=hang, heartbeats continue), so that the kill lands mid-run
                // whatever the machine's speed. The hang itself is never reached by a deadline
                // (30 s per test): the kill ends it within seconds.
                let hang = format!(" --sanity-check-envs=GPUSANITY_FAULT=hang@{BAD}");
                let run_id = s.allocate(job, &(args() + &hang));
                let pid = find_worker(&s.w.tag, BAD, Duration::from_secs(30));
                std::thread::sleep(Duration::from_millis(1500));
                kill(Pid::from_raw(pid), Signal::SIGKILL).expect("SIGKILL the worker");
                (run_id, Instant::now())
            }
        };
        let verdict = s.verdict(job);
        let took = from.elapsed();
        // NodeIsolated events are written with the verdict: a short drain finds them all.
        s.out.drain(Duration::from_secs(1));
        let isolated = s.out.of(job, "NodeIsolated");
        Some(ServiceScenario { s, run_id, verdict, isolated, took })
    }

    /// Whether the events (and, for the clean run, the report) show this scenario's outcome,
    /// and how many findings or isolated nodes name anything else.
    pub fn score(self, sc: &ServiceScenario) -> (bool, usize) {
        let bad = node_name(BAD as usize);
        let isolated: Vec<&str> = sc.isolated.iter().filter_map(|v| v["node"].as_str()).collect();
        let others = isolated.iter().filter(|n| **n != bad).count();
        match self {
            ServiceKind::Clean => {
                let findings = sc.s.report(&sc.run_id)["findings"].as_array().map_or(0, Vec::len);
                (sc.verdict["type"] == "CheckPassed" && findings == 0 && isolated.is_empty(), findings + isolated.len())
            }
            ServiceKind::Kill => {
                let found = sc.verdict["type"] == "CheckFailed"
                    && sc.verdict["faulty_nodes"] == json!([bad])
                    && sc.isolated.iter().any(|v| {
                        v["node"] == bad.as_str()
                            && v["codes"].as_array().is_some_and(|c| c.contains(&json!("WORKER_CRASHED")))
                    });
                (found, others)
            }
        }
    }
}
