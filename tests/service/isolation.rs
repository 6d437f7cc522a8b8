//! The Slurm isolation backend through the real service and broker: a NodeIsolated event (a
//! job node without an agent) drains that node through scontrol, here a stand-in that records
//! its arguments (the real Slurm cluster is the test bed's, tests/testbed/slurm/).

use gpusanity_testkit::svc;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use svc::{allocated, World};

#[test]
fn node_isolated_drains_the_node_through_scontrol_when_the_slurm_backend_is_on() {
    let _g = svc::common::serial();
    let mut w = World::new(None, "agent_timeout_s = 2.0\nagent_wait_s = 3.0\ndeadline_grace_s = 10.0");
    let dir = w.dir.path().to_path_buf();
    // `show node` says the node is idle; `update` appends its arguments, one per line.
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = show ]; then echo \"NodeName=$4 State=IDLE\"; exit 0; fi\n\
         printf '%s\\n' \"$@\" >> {}/scontrol.log\n",
        dir.display()
    );
    let fake = dir.join("scontrol");
    std::fs::write(&fake, script).unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let isolation = format!("[isolation]\nbackend = \"slurm\"\nscontrol = \"{}\"\n\n[jobs]\n", fake.display());
    w.edit_config("[jobs]\n", &isolation);
    let mut out = w.start(&["i-a"]);
    w.publish(allocated("iso-1", "job-iso", &["i-a", "i-ghost"], "--sanity-check-max-time=1").as_bytes());
    let isolated = out.wait_for(Duration::from_secs(30), "NodeIsolated", |v| v["type"] == "NodeIsolated");
    assert_eq!(isolated["node"], "i-ghost", "{isolated:#}");
    let log = dir.join("scontrol.log");
    let start = Instant::now();
    while !log.exists() && start.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let args = std::fs::read_to_string(&log).unwrap_or_default();
    let args: Vec<&str> = args.lines().collect();
    assert_eq!(args[..3], ["update", "nodename=i-ghost", "state=drain"], "{args:?}\n{}", w.log("serve"));
    assert!(args[3].starts_with("reason=gpusanity: NO_AGENT critical finding(s) in run "), "{args:?}");
    assert!(w.log("serve").contains("isolation backend: drained i-ghost"), "{}", w.log("serve"));
    w.shutdown();
}
