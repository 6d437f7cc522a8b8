//! Node 0's rendezvous port through the agent: its launcher binds the port itself (the 2-node
//! pass of flow.rs shows the run going through); an agent whose port range is all in use fails
//! the run at once, naming the range: node 0's result is all the evidence there will be (no
//! other node gets a task), so the run ends without waiting `agent_timeout_s` for the others.

use gpusanity_testkit::svc;

use std::time::Duration;

use svc::World;

/// A long agent timeout: the run must end long before it.
const TIMING: &str = "agent_timeout_s = 30.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";

#[test]
fn an_agent_whose_rendezvous_ports_are_taken_fails_the_run_naming_them() {
    let _g = svc::common::serial();
    // The one port of node 0's range, held here on the address its launcher listens on.
    let held = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().expect("address").port();
    let mut w = World::new(None, TIMING);
    w.serve();
    w.agent_via("node-a", &[], &["--rdzv-ports", &format!("{port}-{port}")]);
    w.agent("node-b");
    let mut out = w.reader("check-events");
    let allocated = std::time::Instant::now();
    w.allocate("ev-1", "job-ports", "--sanity-check-max-time=2 --sanity-check-timeout-per-test=1");
    let end = out
        .wait_for(Duration::from_secs(60), "the verdict", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    let took = allocated.elapsed();
    assert_eq!(end["type"], "CheckFailed", "{end:#}");
    // Ended on node 0's result (its launcher exits at once), not an agent timeout (30 s) later.
    assert!(took < Duration::from_secs(15), "the verdict came {took:?} after the allocation");
    let summary = end["summary"].as_str().unwrap_or_default();
    assert!(summary.contains(&format!("every port of {port} is in use")), "{end:#}\n{}", w.log("serve"));
    // Node 1 never got a task: node 0 never started.
    assert!(!w.log("node-b").contains("this node's part of the run ended"), "{}", w.log("node-b"));
    drop(held);
    w.shutdown();
}
