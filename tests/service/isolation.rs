//! The Slurm isolation backend through the real service and broker: a NodeIsolated event (a
//! job node without an agent) drains that node through scontrol, here a stand-in that records
//! its arguments (the real Slurm cluster is the test bed's, tests/testbed/slurm/); past the
//! circuit breaker's cap it drains nothing.

use gpusanity_testkit::svc;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use svc::{allocated, World};

/// A stand-in scontrol in `dir`: `show node` says the node is idle; `update` appends its
/// arguments, one per line, to `dir/scontrol.log`.
fn fake_scontrol(dir: &Path) -> PathBuf {
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = show ]; then echo \"NodeName=$4 State=IDLE\"; exit 0; fi\n\
         printf '%s\\n' \"$@\" >> {}/scontrol.log\n",
        dir.display()
    );
    let fake = dir.join("scontrol");
    std::fs::write(&fake, script).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    fake
}

/// The lines of `dir/scontrol.log` once `want` of them name a node (`nodename=`), or at 30 s.
fn drains(dir: &Path, want: usize) -> Vec<String> {
    let start = Instant::now();
    loop {
        let text = std::fs::read_to_string(dir.join("scontrol.log")).unwrap_or_default();
        let lines: Vec<String> = text.lines().map(str::to_string).collect();
        if lines.iter().filter(|l| l.starts_with("nodename=")).count() >= want
            || start.elapsed() > Duration::from_secs(30)
        {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn node_isolated_drains_the_node_through_scontrol_when_the_slurm_backend_is_on() {
    let _g = svc::common::serial();
    let mut w = World::new(None, "agent_timeout_s = 2.0\nagent_wait_s = 3.0\ndeadline_grace_s = 10.0");
    let dir = w.dir.path().to_path_buf();
    let fake = fake_scontrol(&dir);
    let isolation = format!("[isolation]\nbackend = \"slurm\"\nscontrol = \"{}\"\n\n[jobs]\n", fake.display());
    w.edit_config("[jobs]\n", &isolation);
    let mut out = w.start(&["i-a"]);
    w.publish(allocated("iso-1", "job-iso", &["i-a", "i-ghost"], "--sanity-check-max-time=1").as_bytes());
    let isolated = out.wait_for(Duration::from_secs(30), "NodeIsolated", |v| v["type"] == "NodeIsolated");
    assert_eq!(isolated["node"], "i-ghost", "{isolated:#}");
    let args = drains(&dir, 1);
    assert_eq!(args[..3], ["update", "nodename=i-ghost", "state=drain"], "{args:?}\n{}", w.log("serve"));
    assert!(args[3].starts_with("reason=gpusanity: NO_AGENT critical finding(s) in run "), "{args:?}");
    assert!(w.log("serve").contains("isolation backend: drained i-ghost"), "{}", w.log("serve"));
    w.shutdown();
}

#[test]
fn past_the_circuit_breaker_s_cap_slurm_drains_nothing_more() {
    let _g = svc::common::serial();
    let mut w = World::new(None, "agent_timeout_s = 2.0\nagent_wait_s = 3.0\ndeadline_grace_s = 10.0");
    let dir = w.dir.path().to_path_buf();
    let fake = fake_scontrol(&dir);
    // One drain an hour, whatever the fleet's size.
    let isolation = format!(
        "[isolation]\nbackend = \"slurm\"\nscontrol = \"{}\"\n[isolation.breaker]\nmax_share = 0.0\nmin_nodes = 1\n\n[jobs]\n",
        fake.display()
    );
    w.edit_config("[jobs]\n", &isolation);
    let mut out = w.start(&["b-a"]);
    w.publish(allocated("brk-1", "job-brk", &["b-a", "b-ghost1", "b-ghost2"], "--sanity-check-max-time=1").as_bytes());
    let mut isolated = Vec::new();
    for _ in 0..2 {
        let e = out.wait_for(Duration::from_secs(30), "NodeIsolated", |v| {
            v["type"] == "NodeIsolated" && !isolated.contains(&v["node"].as_str().unwrap_or_default().to_string())
        });
        isolated.push(e["node"].as_str().unwrap_or_default().to_string());
    }
    isolated.sort();
    assert_eq!(isolated, ["b-ghost1", "b-ghost2"], "both nodes are named; the breaker caps the drains");
    let start = Instant::now();
    while !w.log("serve").contains("circuit breaker") && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = w.log("serve");
    assert!(
        log.contains("not isolated: circuit breaker: 1 node(s) isolated in the last 3600 s, the cap is 1"),
        "{log}"
    );
    // A later NodeIsolated, refused in its turn: the backend, which takes the output events in
    // order, is done with both earlier ones, a second drain included were it allowed.
    w.publish(allocated("brk-2", "job-brk-2", &["b-ghost3"], "--sanity-check-max-time=1").as_bytes());
    w.wait_log("serve", Duration::from_secs(30), "the later NodeIsolated refused", |log| {
        log.matches("isolation backend: not isolated: circuit breaker").count() >= 2
    });
    let args = drains(&dir, 1);
    let drained: Vec<&String> = args.iter().filter(|l| l.starts_with("nodename=")).collect();
    assert_eq!(drained.len(), 1, "{args:?}");
    assert!(["nodename=b-ghost1", "nodename=b-ghost2"].contains(&drained[0].as_str()), "{args:?}");
    w.shutdown();
}
