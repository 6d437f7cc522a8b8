//! A multi-node test bed on one machine: every node is a network namespace with a veth pair
//! into a bridge, addresses in 10.231.X.0/24, names unique per bed (pid and a counter). Faults:
//! a rate limit on a node's link (tc tbf, both directions), the link set down, a CPU quota on
//! a node's processes (cgroup v1 cpu). Everything is torn down when the bed is dropped, also
//! when a test fails.
//!
//! Where cgroup v1 cpu exists, every node runs in a cgroup of its own with a high
//! `cpu.shares`: on a machine busy with other work the nodes still get the CPU between them,
//! so that other load does not mask (or fake) a node's slowness. A quota is set on that cgroup. Needs root, iproute2 and (for quotas) /sys/fs/cgroup/cpu; [`Bed::new`]
//! says why when something is missing, and the tests skip ([`skip`]: counted, or a failure where
//! GPUSANITY_REQUIRE lists `root`).

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

pub mod scenarios;
pub mod service;

use crate::common::Run;
pub use gpusanity_testkit::skip::Prereq;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

const CGROUP_CPU: &str = "/sys/fs/cgroup/cpu";

pub struct Node {
    pub ns: String,
    /// The host end of the node's veth (in the bridge's namespace).
    pub veth_host: String,
    /// The node's end, inside its namespace.
    pub veth_ns: String,
    pub addr: String,
    /// The node's cgroup under /sys/fs/cgroup/cpu, if cgroup v1 cpu exists.
    pub cgroup: Option<String>,
}

pub struct Bed {
    bridge: String,
    /// The bridge's own address on the host side ([`Bed::with_host`]), if it has one.
    pub host: Option<String>,
    pub nodes: Vec<Node>,
    cgroups: Vec<String>,
}

fn sh(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{}: {e}", args[0]))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

impl Bed {
    /// A bed of `n` nodes, or why it cannot be built here.
    pub fn new(n: usize) -> Result<Bed, String> {
        Bed::build(n, false)
    }

    /// A bed of `n` nodes whose bridge also has an address on the host side, `.254` of the
    /// nodes' subnet, where processes on the host listen for the nodes (a Kafka broker). Every
    /// such bed of this process has the same subnet, so a listener bound to that address serves
    /// the next bed as well (one at a time: the tests run them serially).
    pub fn with_host(n: usize) -> Result<Bed, String> {
        Bed::build(n, true)
    }

    fn build(n: usize, host: bool) -> Result<Bed, String> {
        let uid = Command::new("id").arg("-u").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
        if uid.as_deref().unwrap_or("") != "0" {
            return Err("needs root (network namespaces)".into());
        }
        if Command::new("ip").arg("-V").output().is_err() {
            return Err("needs iproute2 (`ip`)".into());
        }
        let k = COUNTER.fetch_add(1, Ordering::SeqCst);
        let pid = std::process::id();
        // Short: interface names hold 15 bytes.
        let id = format!("gs{}{}", pid % 100_000, (b'a' + (k % 26) as u8) as char);
        // Beds with a host address take the one subnet no other bed of this process gets
        // before its 250th.
        let subnet = (pid as usize * 7 + if host { 249 } else { k % 249 }) % 250 + 1;
        let mut bed = Bed { bridge: format!("{id}br"), host: None, nodes: Vec::new(), cgroups: Vec::new() };
        sh(&["ip", "link", "add", &bed.bridge, "type", "bridge"])?;
        sh(&["ip", "link", "set", &bed.bridge, "up"])?;
        if host {
            let addr = format!("10.231.{subnet}.254");
            sh(&["ip", "addr", "add", &format!("{addr}/24"), "dev", &bed.bridge])?;
            bed.host = Some(addr);
        }
        for i in 0..n {
            let node = Node {
                ns: format!("{id}n{i}"),
                veth_host: format!("{id}h{i}"),
                veth_ns: format!("{id}v{i}"),
                addr: format!("10.231.{subnet}.{}", i + 1),
                cgroup: None,
            };
            // Pushed first, so that Drop removes what was made even if a step fails.
            bed.nodes.push(node);
            let node = &bed.nodes[i];
            sh(&["ip", "netns", "add", &node.ns])?;
            sh(&["ip", "link", "add", &node.veth_host, "type", "veth", "peer", "name", &node.veth_ns])?;
            sh(&["ip", "link", "set", &node.veth_ns, "netns", &node.ns])?;
            sh(&["ip", "link", "set", &node.veth_host, "master", &bed.bridge])?;
            sh(&["ip", "link", "set", &node.veth_host, "up"])?;
            let exec = |args: &[&str]| {
                let mut v = vec!["ip", "netns", "exec", &node.ns];
                v.extend_from_slice(args);
                sh(&v)
            };
            exec(&["ip", "addr", "add", &format!("{}/24", node.addr), "dev", &node.veth_ns])?;
            exec(&["ip", "link", "set", &node.veth_ns, "up"])?;
            exec(&["ip", "link", "set", "lo", "up"])?;
        }
        let root = std::path::Path::new(CGROUP_CPU);
        if root.join("cpu.shares").exists() {
            for i in 0..n {
                let name = format!("{id}c{i}");
                let dir = root.join(&name);
                // Without a writable cgroup v1 cpu the nodes run without one (and the quota
                // scenario skips).
                if let Err(e) = std::fs::create_dir(&dir) {
                    eprintln!("test bed: no cgroup for node {i}: creating {}: {e}", dir.display());
                    break;
                }
                bed.cgroups.push(name.clone());
                if std::fs::write(dir.join("cpu.shares"), "8192").is_ok() {
                    bed.nodes[i].cgroup = Some(name);
                }
            }
        }
        Ok(bed)
    }

    /// `gpusanity check` on CPU for node `k` of this bed, one worker, inside its namespace
    /// and its cgroup (the launcher joins it before it starts any worker): the command of
    /// [`Run::command`], run through `ip netns exec`.
    pub fn spawn(&self, run: &Run, k: usize, port: u16, extra: &[&str]) -> Child {
        let (n, kk, p) = (self.nodes.len().to_string(), k.to_string(), port.to_string());
        let mut args: Vec<&str> = vec!["--nnodes", &n, "--node-rank", &kk, "--nproc-per-node", "1"];
        args.extend(["--master-addr", &self.nodes[0].addr, "--master-port", &p, "--rdzv-timeout", "30"]);
        args.extend_from_slice(extra);
        let inner = run.command(&args);
        let wrap = self.wrap(k);
        let mut c = Command::new(&wrap[0]);
        c.args(&wrap[1..]).arg(inner.get_program()).args(inner.get_args());
        for (key, value) in inner.get_envs() {
            match value {
                Some(v) => c.env(key, v),
                None => c.env_remove(key),
            };
        }
        // The launchers carry the tag too, so that a leftover launcher is found as well.
        c.env("GPUSANITY_TEST_TAG", &run.tag);
        c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
        c.spawn().expect("spawn a node")
    }

    /// The command that runs a program (appended to it) in node `k`'s namespace and cgroup:
    /// a shell joins the cgroup, then becomes `ip netns exec ...`, which becomes the program,
    /// so that the program keeps the first process's pid.
    pub fn wrap(&self, k: usize) -> Vec<String> {
        let netns = ["ip", "netns", "exec", &self.nodes[k].ns].map(String::from);
        match self.nodes[k].cgroup.as_deref() {
            Some(cg) => {
                let join = format!("echo $$ > {CGROUP_CPU}/{cg}/cgroup.procs && exec \"$@\"");
                ["sh", "-c", &join, "sh"].map(String::from).into_iter().chain(netns).collect()
            }
            None => netns.to_vec(),
        }
    }

    /// The pids of the processes in node `k`'s namespace.
    pub fn pids(&self, k: usize) -> Vec<i32> {
        Command::new("ip")
            .args(["netns", "pids", &self.nodes[k].ns])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Node 0's report.
    pub fn report(&self, run: &Run) -> serde_json::Value {
        run.report()
    }

    /// Limits node `k`'s link to `rate` (tc syntax, e.g. `100mbit`) in both directions.
    pub fn rate_limit(&self, k: usize, rate: &str) -> Result<(), String> {
        let node = &self.nodes[k];
        let tbf = ["root", "tbf", "rate", rate, "burst", "64kb", "latency", "100ms"];
        let mut host = vec!["tc", "qdisc", "add", "dev", &node.veth_host];
        host.extend_from_slice(&tbf);
        sh(&host)?;
        let mut inside = vec!["ip", "netns", "exec", &node.ns, "tc", "qdisc", "add", "dev", &node.veth_ns];
        inside.extend_from_slice(&tbf);
        sh(&inside)
    }

    /// Takes node `k`'s link down (its host end: the node is cut off from the bridge).
    pub fn link_down(&self, k: usize) -> Result<(), String> {
        sh(&["ip", "link", "set", &self.nodes[k].veth_host, "down"])
    }

    /// Brings node `k`'s link up again after [`Bed::link_down`].
    pub fn link_up(&self, k: usize) -> Result<(), String> {
        sh(&["ip", "link", "set", &self.nodes[k].veth_host, "up"])
    }

    /// Limits node `k`'s processes to `percent` of one CPU (cgroup v1 cpu quota).
    pub fn cpu_quota(&self, k: usize, percent: u32) -> Result<(), String> {
        let cg = self.nodes[k].cgroup.as_ref().ok_or_else(|| format!("needs cgroup v1 cpu at {CGROUP_CPU}"))?;
        let dir = std::path::Path::new(CGROUP_CPU).join(cg);
        std::fs::write(dir.join("cpu.cfs_period_us"), "100000").map_err(|e| e.to_string())?;
        std::fs::write(dir.join("cpu.cfs_quota_us"), (percent * 1000).to_string()).map_err(|e| e.to_string())
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        for n in &self.nodes {
            let _ = sh(&["ip", "netns", "del", &n.ns]);
            let _ = sh(&["ip", "link", "del", &n.veth_host]);
        }
        let _ = sh(&["ip", "link", "del", &self.bridge]);
        for cg in &self.cgroups {
            let dir = std::path::Path::new(CGROUP_CPU).join(cg);
            // Its processes are gone by now (the tests wait for them); retry briefly if not.
            for _ in 0..50 {
                if std::fs::remove_dir(&dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
        }
    }
}

/// `test` cannot run here for lack of `p` (`why`): a counted skip (the test then returns), or
/// a failure where GPUSANITY_REQUIRE lists `p`.
pub fn skip(p: Prereq, test: &str, why: &str) {
    gpusanity_testkit::skip::missing_in(test, p, why);
}
