//! The Kubernetes isolation backend through the real service, agents and broker against a real
//! kube-apiserver (scripts/kube-apiserver.sh): a job event whose check fails isolates the Node,
//! a later passing check returns it, an operator's maintenance stays as it was, an API server
//! away when NodeIsolated arrives is waited out (applied once), and the circuit breaker caps a
//! burst and says so on the Nodes. Failing nodes on CPU are job nodes without an agent
//! (NO_AGENT), as in isolation.rs.

use gpusanity_kube::{EVENT_ISOLATED, EVENT_REFUSED, EVENT_RETURNED, LABEL_KEY, REASON_PASSED, TAINT_KEY};
use gpusanity_testkit::svc;
use gpusanity_testkit::svc::kube::{
    condition, condition_message, cordoned, isolated, kube_server, taints, unique, Cluster, PrivateKube,
};
use serde_json::json;

use std::time::{Duration, Instant};

use svc::{allocated, Reader, World};

const COORDINATOR: &str = "agent_timeout_s = 2.0\nagent_wait_s = 3.0\ndeadline_grace_s = 10.0";

/// `[isolation]` for the service: `k`'s cluster, the breaker's `breaker` lines.
fn isolation(k: &Cluster, breaker: &str) -> String {
    format!(
        "[isolation]\nbackend = \"kubernetes\"\n\n[isolation.kubernetes]\nkubeconfig = \"{}\"\n\n\
         [isolation.kubernetes.breaker]\n{breaker}\n\n[jobs]\n",
        k.kubeconfig.display()
    )
}

/// A service with the Kubernetes backend on `cluster`, an agent on each of `agents`.
fn world(cluster: &Cluster, breaker: &str, agents: &[&str]) -> (World, Reader) {
    let mut w = World::new(None, COORDINATOR);
    w.edit_config("[jobs]\n", &isolation(cluster, breaker));
    let out = w.start(agents);
    (w, out)
}

#[test]
fn a_failing_check_isolates_the_node_a_passing_one_returns_it_and_maintenance_stays() {
    let _g = svc::common::serial();
    let Some(server) = kube_server() else { return };
    let k = Cluster::new(server);
    let (ok, faulty, maint) = (unique("kok"), unique("kbad"), unique("kmaint"));
    let plain = k.create(&faulty, json!({}));
    let maintenance =
        json!({ "unschedulable": true, "taints": [{ "key": "maintenance", "value": "psu", "effect": "NoExecute" }] });
    let before = k.create(&maint, maintenance);
    let (mut w, mut out) = world(&k, "max_share = 1.0", &[&ok]);

    // (a) No agent on `faulty` and `maint`: the run fails naming them, NodeIsolated for each.
    w.publish(allocated("k8s-1", "job-k8s-1", &[&ok, &faulty, &maint], "--sanity-check-max-time=1").as_bytes());
    let failed = out
        .wait_for(Duration::from_secs(30), "the verdict", |v| v["type"] == "CheckFailed" || v["type"] == "CheckPassed");
    assert_eq!(failed["type"], "CheckFailed", "{failed:#}");
    k.wait_events(&faulty, 1, Duration::from_secs(30));
    let node = k.get(&faulty);
    assert!(isolated(&node) && cordoned(&node), "{node:#?}");
    assert_eq!(taints(&node), [(TAINT_KEY.into(), Some("NO_AGENT".into()), "NoSchedule".into())]);
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(LABEL_KEY).map(String::as_str), Some("NO_AGENT"));
    assert_eq!(labels.get("team").map(String::as_str), Some("ml"));
    assert_eq!(condition(&node), Some(("True".into(), "NO_AGENT".into())));
    let events = k.events(&faulty);
    assert_eq!(events.len(), 1, "{events:#?}");
    assert_eq!(events[0].reason.as_deref(), Some(EVENT_ISOLATED));
    // The codes once, then the reason: in the Event and the condition alike.
    let message = events[0].message.clone().unwrap_or_default();
    assert!(message.starts_with("NO_AGENT: ") && !message.starts_with("NO_AGENT: NO_AGENT"), "{events:#?}");
    assert_eq!(condition_message(&node).as_deref(), Some(message.as_str()));
    // (c) The operator's cordon and taint are kept; gpusanity's taint joins them.
    k.wait_events(&maint, 1, Duration::from_secs(30));
    let during = k.get(&maint);
    assert!(isolated(&during) && cordoned(&during));
    let t = taints(&during);
    assert!(t.contains(&("maintenance".into(), Some("psu".into()), "NoExecute".into())) && t.len() == 2, "{t:?}");

    // (b) The nodes come back with agents, and a check of them passes: returned to service.
    w.agent(&faulty);
    w.agent(&maint);
    let args = "--sanity-check-max-time=2 --sanity-check-timeout-per-test=1";
    w.publish(allocated("k8s-2", "job-k8s-2", &[&faulty, &maint], args).as_bytes());
    let passed = out.wait_for(Duration::from_secs(90), "the second verdict", |v| {
        v["job_id"] == "job-k8s-2" && (v["type"] == "CheckFailed" || v["type"] == "CheckPassed")
    });
    assert_eq!(passed["type"], "CheckPassed", "{passed:#}\n{}", w.log("serve"));
    let mut back: Vec<&str> =
        passed["passed_nodes"].as_array().into_iter().flatten().filter_map(|v| v.as_str()).collect();
    back.sort();
    let mut expected = [faulty.as_str(), maint.as_str()];
    expected.sort();
    assert_eq!(back, expected, "{passed:#}");
    assert_eq!(k.wait_events(&faulty, 2, Duration::from_secs(30)), [EVENT_ISOLATED, EVENT_RETURNED]);
    let node = k.get(&faulty);
    assert_eq!(node.spec, plain.spec, "gpusanity's cordon and taint removed, nothing else");
    assert_eq!(node.metadata.labels, plain.metadata.labels);
    assert_eq!(condition(&node), Some(("False".into(), REASON_PASSED.into())));
    // (c) Exactly as the operator left it.
    k.wait_events(&maint, 2, Duration::from_secs(30));
    let after = k.get(&maint);
    assert_eq!(after.spec, before.spec, "the operator's cordon and taint are untouched");
    assert_eq!(after.metadata.labels, before.metadata.labels);
    w.shutdown();
}

#[test]
fn the_api_server_away_when_node_isolated_arrives_is_waited_out_and_applied_once() {
    let _g = svc::common::serial();
    let Some(private) = PrivateKube::start() else { return };
    let k = Cluster::new(&private.server);
    let (ok, faulty, later) = (unique("kok"), unique("kaway"), unique("klater"));
    k.create(&faulty, json!({}));
    k.create(&later, json!({}));
    let (mut w, mut out) = world(&k, "max_share = 1.0", &[&ok]);
    private.halt();
    w.publish(allocated("k8s-away", "job-k8s-away", &[&ok, &faulty], "--sanity-check-max-time=1").as_bytes());
    let iso = out.wait_for(Duration::from_secs(30), "NodeIsolated", |v| v["type"] == "NodeIsolated");
    assert_eq!(iso["node"], faulty.as_str());
    // The backend meets the outage and retries with backoff.
    let start = Instant::now();
    while !w.log("serve").contains("the API server cannot be reached") {
        assert!(start.elapsed() < Duration::from_secs(30), "no retry logged:\n{}", w.log("serve"));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    private.resume();
    k.wait(&faulty, Duration::from_secs(30), "isolated after the outage", isolated);
    k.wait_events(&faulty, 1, Duration::from_secs(30));
    let node = k.get(&faulty);
    assert!(cordoned(&node) && taints(&node).len() == 1, "{node:#?}");
    // A later NodeIsolated, applied: the backend, which takes the output events in order, is
    // done with the first one, a second application included were there one.
    w.publish(allocated("k8s-later", "job-k8s-later", &[&later], "--sanity-check-max-time=1").as_bytes());
    k.wait_events(&later, 1, Duration::from_secs(30));
    assert_eq!(k.reasons(&faulty), [EVENT_ISOLATED], "applied once");
    assert_eq!(k.get(&faulty).metadata.resource_version, node.metadata.resource_version);
    w.shutdown();
}

#[test]
fn the_breaker_isolates_at_most_its_cap_of_a_burst_and_says_so_on_the_other_nodes() {
    let _g = svc::common::serial();
    let Some(server) = kube_server() else { return };
    let k = Cluster::new(server);
    let healthy: Vec<String> = (0..5).map(|_| unique("kfine")).collect();
    let failing: Vec<String> = (0..5).map(|_| unique("kburst")).collect();
    for n in healthy.iter().chain(&failing) {
        k.create(n, json!({}));
    }
    // 10 nodes known from the run, at most 20% within the hour: 2 of the 5 failing.
    let agents: Vec<&str> = healthy.iter().map(String::as_str).collect();
    let (mut w, mut out) = world(&k, "max_share = 0.2\nmin_nodes = 1\nwindow_s = 3600", &agents);
    let all: Vec<&str> = healthy.iter().chain(&failing).map(String::as_str).collect();
    w.publish(allocated("k8s-burst", "job-k8s-burst", &all, "--sanity-check-max-time=1").as_bytes());
    for n in &failing {
        out.wait_for(Duration::from_secs(30), "NodeIsolated", |v| {
            v["type"] == "NodeIsolated" && v["node"] == n.as_str()
        });
    }
    // Every failing node ends isolated or with the refusal recorded on it.
    let start = Instant::now();
    let outcome = |n: &String| (isolated(&k.get(n)), k.reasons(n));
    loop {
        let done = failing.iter().all(|n| {
            let (iso, reasons) = outcome(n);
            iso || reasons.iter().any(|r| r == EVENT_REFUSED)
        });
        if done {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "not all handled:\n{}", w.log("serve"));
        std::thread::sleep(Duration::from_millis(100));
    }
    let isolated_now: Vec<&String> = failing.iter().filter(|n| isolated(&k.get(n))).collect();
    assert_eq!(isolated_now.len(), 2, "{isolated_now:?}\n{}", w.log("serve"));
    for n in failing.iter().filter(|n| !isolated_now.contains(n)) {
        let node = k.get(n);
        assert!(!cordoned(&node) && taints(&node).is_empty(), "{node:#?}");
        let events = k.events(n);
        assert_eq!(events.len(), 1, "{events:#?}");
        let message = events[0].message.clone().unwrap_or_default();
        assert_eq!(events[0].type_.as_deref(), Some("Warning"));
        assert!(message.contains("the cap is 2") && message.contains("last 3600 s"), "{message}");
    }
    for n in &healthy {
        assert!(k.events(n).is_empty() && !isolated(&k.get(n)), "a healthy node was touched: {n}");
    }
    assert_eq!(w.log("serve").matches("isolation backend: not isolated: circuit breaker").count(), 3);
    // Counted once each outcome is in; the last may lag the Event it wrote by a moment.
    let want = ["{outcome=\"refused_by_breaker\"} 3", "{outcome=\"isolated\"} 2"];
    let start = Instant::now();
    loop {
        let (status, metrics) = w.http_text("/metrics", Some(svc::TOKEN)).expect("metrics");
        assert_eq!(status, 200);
        if want.iter().all(|c| metrics.contains(&format!("gpusanity_isolation_actions_total{c}"))) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{metrics}");
        std::thread::sleep(Duration::from_millis(100));
    }
    w.shutdown();
}

#[test]
fn two_replicas_on_postgresql_share_the_breaker_and_isolate_at_most_its_cap() {
    let _g = svc::common::serial();
    let Some(server) = kube_server() else { return };
    let k = Cluster::new(server);
    let healthy: Vec<String> = (0..5).map(|_| unique("k2fine")).collect();
    let failing: Vec<String> = (0..5).map(|_| unique("k2burst")).collect();
    for n in healthy.iter().chain(&failing) {
        k.create(n, json!({}));
    }
    let mut w = World::new(Some(svc::postgres_database("gpusanity_kube_breaker")), COORDINATOR);
    // min_nodes = 2: the cap is 2 whichever replica has seen which runs when it asks.
    w.edit_config("[jobs]\n", &isolation(&k, "max_share = 0.2\nmin_nodes = 2\nwindow_s = 3600"));
    w.partitioned(6);
    let replica = "lease_s = 3.0";
    w.serve_replica(0, replica);
    w.serve_replica(1, replica);
    w.wait_replicas_ready(&[0, 1], replica);
    for n in &healthy {
        w.agent(n);
    }
    let mut out = w.reader("check-events");
    // Five jobs of a healthy and a failing node each: their events spread over the partitions,
    // so both replicas' isolation consumers see some of the five NodeIsolated.
    let producer = w.job_producer();
    for (i, (ok, bad)) in healthy.iter().zip(&failing).enumerate() {
        let job = format!("job-k2-{i}");
        producer.send(
            &job,
            &allocated(&format!("k2-{i}"), &job, &[ok.as_str(), bad.as_str()], "--sanity-check-max-time=1"),
        );
    }
    for n in &failing {
        out.wait_for(Duration::from_secs(60), "NodeIsolated", |v| {
            v["type"] == "NodeIsolated" && v["node"] == n.as_str()
        });
    }
    let start = Instant::now();
    let logs = |w: &World| format!("{}\n{}", w.log("serve-0"), w.log("serve-1"));
    loop {
        let done = failing.iter().all(|n| isolated(&k.get(n)) || k.reasons(n).iter().any(|r| r == EVENT_REFUSED));
        if done {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "not all handled:\n{}", logs(&w));
        std::thread::sleep(Duration::from_millis(200));
    }
    let tainted: Vec<&String> = failing.iter().filter(|n| !taints(&k.get(n)).is_empty()).collect();
    assert_eq!(tainted.len(), 2, "{tainted:?}\n{}", logs(&w));
    let refusals = logs(&w).matches("isolation backend: not isolated: circuit breaker").count();
    assert_eq!(refusals, 3, "{}", logs(&w));
    let outcomes = w.sql("SELECT outcome FROM breaker_actions ORDER BY id");
    assert_eq!(outcomes.iter().filter(|o| *o == "isolated").count(), 2, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|o| *o == "refused").count(), 3, "{outcomes:?}");
    let replicas = w.sql("SELECT DISTINCT replica FROM breaker_actions");
    eprintln!("replicas that asked the breaker: {replicas:?}");
    for n in &healthy {
        assert!(!isolated(&k.get(n)), "a healthy node was isolated: {n}");
    }
    w.shutdown();
}
