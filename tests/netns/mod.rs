//! A multi-node test bed on one machine: every node is a network namespace with a veth pair
//! into a bridge, addresses in 10.231.X.0/24, names unique per bed (pid and a counter). Faults:
//! a rate limit on a node's link (tc tbf, both directions), the link set down, a CPU quota on
//! a node's processes (cgroup v1 cpu). Everything is torn down when the bed is dropped, also
//! when a test fails.
//!
//! Where cgroup v1 cpu exists, every node runs in a cgroup of its own with a high
//! `cpu.shares`: on a machine busy with other work the nodes still get the CPU between them,
//! so that other load does not mask (or fake) a node's slowness. A quota is set on that cgroup. Needs root, iproute2 and (for quotas) /sys/fs/cgroup/cpu; [`Bed::new`]
//! says why when something is missing, and the tests skip.

#![allow(dead_code)]

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

pub mod scenarios;

use crate::common::Run;

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
    pub id: String,
    bridge: String,
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
        Err(format!(
            "`{}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Bed {
    /// A bed of `n` nodes, or why it cannot be built here.
    pub fn new(n: usize) -> Result<Bed, String> {
        let uid = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
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
        let subnet = (pid as usize * 7 + k) % 250 + 1;
        let mut bed = Bed {
            bridge: format!("{id}br"),
            id: id.clone(),
            nodes: Vec::new(),
            cgroups: Vec::new(),
        };
        sh(&["ip", "link", "add", &bed.bridge, "type", "bridge"])?;
        sh(&["ip", "link", "set", &bed.bridge, "up"])?;
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
            sh(&[
                "ip",
                "link",
                "add",
                &node.veth_host,
                "type",
                "veth",
                "peer",
                "name",
                &node.veth_ns,
            ])?;
            sh(&["ip", "link", "set", &node.veth_ns, "netns", &node.ns])?;
            sh(&["ip", "link", "set", &node.veth_host, "master", &bed.bridge])?;
            sh(&["ip", "link", "set", &node.veth_host, "up"])?;
            let exec = |args: &[&str]| {
                let mut v = vec!["ip", "netns", "exec", &node.ns];
                v.extend_from_slice(args);
                sh(&v)
            };
            exec(&[
                "ip",
                "addr",
                "add",
                &format!("{}/24", node.addr),
                "dev",
                &node.veth_ns,
            ])?;
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
                    eprintln!(
                        "test bed: no cgroup for node {i}: creating {}: {e}",
                        dir.display()
                    );
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
        let (n, kk, p) = (
            self.nodes.len().to_string(),
            k.to_string(),
            port.to_string(),
        );
        let mut args: Vec<&str> = vec!["--nnodes", &n, "--node-rank", &kk, "--nproc-per-node", "1"];
        args.extend([
            "--master-addr",
            &self.nodes[0].addr,
            "--master-port",
            &p,
            "--rdzv-timeout",
            "30",
        ]);
        args.extend_from_slice(extra);
        let inner = run.command(&args);
        let mut ip_args: Vec<std::ffi::OsString> = vec![
            "netns".into(),
            "exec".into(),
            self.nodes[k].ns.clone().into(),
        ];
        ip_args.push(inner.get_program().into());
        ip_args.extend(inner.get_args().map(|a| a.to_os_string()));
        let mut c = match self.nodes[k].cgroup.as_deref() {
            // The shell joins the cgroup, then becomes `ip netns exec ...`, then gpusanity.
            Some(cg) => {
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(format!(
                        "echo $$ > {CGROUP_CPU}/{cg}/cgroup.procs && exec ip \"$@\""
                    ))
                    .arg("sh")
                    .args(&ip_args);
                c
            }
            None => {
                let mut c = Command::new("ip");
                c.args(&ip_args);
                c
            }
        };
        for (key, value) in inner.get_envs() {
            match value {
                Some(v) => c.env(key, v),
                None => c.env_remove(key),
            };
        }
        // The launchers carry the tag too, so that a leftover launcher is found as well.
        c.env("GPUSANITY_TEST_TAG", &run.tag);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().expect("spawn a node")
    }

    /// Node 0's report.
    pub fn report(&self, run: &Run) -> serde_json::Value {
        run.report()
    }

    /// Limits node `k`'s link to `rate` (tc syntax, e.g. `100mbit`) in both directions.
    pub fn rate_limit(&self, k: usize, rate: &str) -> Result<(), String> {
        let node = &self.nodes[k];
        let tbf = [
            "root", "tbf", "rate", rate, "burst", "64kb", "latency", "100ms",
        ];
        let mut host = vec!["tc", "qdisc", "add", "dev", &node.veth_host];
        host.extend_from_slice(&tbf);
        sh(&host)?;
        let mut inside = vec![
            "ip",
            "netns",
            "exec",
            &node.ns,
            "tc",
            "qdisc",
            "add",
            "dev",
            &node.veth_ns,
        ];
        inside.extend_from_slice(&tbf);
        sh(&inside)
    }

    /// Takes node `k`'s link down (its host end: the node is cut off from the bridge).
    pub fn link_down(&self, k: usize) -> Result<(), String> {
        sh(&["ip", "link", "set", &self.nodes[k].veth_host, "down"])
    }

    /// Limits node `k`'s processes to `percent` of one CPU (cgroup v1 cpu quota).
    pub fn cpu_quota(&self, k: usize, percent: u32) -> Result<(), String> {
        let cg = self.nodes[k]
            .cgroup
            .as_ref()
            .ok_or_else(|| format!("needs cgroup v1 cpu at {CGROUP_CPU}"))?;
        let dir = std::path::Path::new(CGROUP_CPU).join(cg);
        std::fs::write(dir.join("cpu.cfs_period_us"), "100000").map_err(|e| e.to_string())?;
        std::fs::write(dir.join("cpu.cfs_quota_us"), (percent * 1000).to_string())
            .map_err(|e| e.to_string())
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

/// Prints why a test is skipped (the test then returns).
pub fn skip(test: &str, why: &str) {
    eprintln!("skipped {test}: {why}");
}
