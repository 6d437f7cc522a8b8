//! On Kubernetes, a job event that names no GPUs for a node: the agent beside the kubelet asks
//! the Kubernetes API for the job's pods on its node (label `gpusanity.io/job-id`) and the
//! kubelet's PodResources socket (a server of the test's own speaking the kubelet's v1 gRPC
//! protocol) for their GPUs, and checks exactly those; without a pod of the job there, or with
//! a kubelet that fails, it checks the whole node and says why. The watch that follows the
//! check samples the same GPUs. Through the real service with a CPU agent and a real API server.

use std::time::Duration;

use gpusanity_kube::podres::GPU_RESOURCE;
use gpusanity_testkit::podres::PodResourcesServer;
use gpusanity_testkit::svc;
use gpusanity_testkit::svc::kube::{kube_server, unique, Cluster};
use svc::{allocated, Reader, World};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";
/// The GPUs the kubelet gave the job's pod `w0`, and another job's pod `x0`, on one node.
const MINE: [&str; 2] = ["GPU-5cd893c3-e5fe-0df3-682b-a88f611dad99", "GPU-0b6f2a51-9a1e-4c49-8e62-2f3c0b8d7e10"];
const THEIRS: [&str; 1] = ["GPU-11111111-2222-3333-4444-555555555555"];
const WATCH: &str =
    "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0\n\n[watch]\nrenew_s = 2\nlease_s = 6";

/// Pods `w0` of `job` and `x0` of `other`, running on `node`, and a kubelet that gave them
/// [`MINE`] and [`THEIRS`].
fn two_jobs_on(cluster: &Cluster, ns: &str, node: &str, job: &str, other: &str) -> PodResourcesServer {
    cluster.bound_pod(ns, "w0", node, Some(job), Some("Running"));
    cluster.bound_pod(ns, "x0", node, Some(other), Some("Running"));
    PodResourcesServer::start(&[
        (ns, "x0", "trainer", GPU_RESOURCE, &THEIRS),
        (ns, "w0", "trainer", GPU_RESOURCE, &MINE),
    ])
}

/// The agent's arguments to ask `kubelet` and the cluster's API server.
fn kubelet_args(kubelet: &PodResourcesServer, cluster: &Cluster) -> Vec<String> {
    let socket = kubelet.socket().to_string_lossy().into_owned();
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    vec!["--kubelet-pod-resources".into(), socket, "--kubeconfig".into(), kubeconfig]
}

/// Publishes an allocation of `job` on `node` with no `gpu_ids` and waits for its verdict.
fn check(w: &World, out: &mut Reader, event: &str, job: &str, node: &str) -> serde_json::Value {
    w.publish(allocated(event, job, &[node], "--micro-benchmarks=all-reduce").as_bytes());
    out.wait_for(Duration::from_secs(90), "the verdict", |v| {
        v["job_id"] == job && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed")
    })
}

#[test]
fn the_agent_checks_the_gpus_the_kubelet_gave_the_jobs_pods_on_its_node() {
    let Some(server) = kube_server() else { return };
    let _g = svc::common::serial();
    let cluster = Cluster::new(server);
    let ns = cluster.namespace();
    let node = unique("kl");
    let (job, other, podless) = (unique("job"), unique("job"), unique("job"));
    let (failing, forged) = (unique("job"), unique("job"));
    cluster.bound_pod(&ns, "w3", &node, Some(&failing), Some("Running"));
    cluster.bound_pod(&ns, "w4", &node, Some(&forged), Some("Running"));
    let kubelet = two_jobs_on(&cluster, &ns, &node, &job, &other);
    let (mine, theirs) = (MINE, THEIRS);

    let mut w = World::new(None, FAST);
    w.serve();
    let args = kubelet_args(&kubelet, &cluster);
    w.agent_via(&node, &[], &args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut out = w.reader("check-events");

    // The job's own pod: its two GPUs, in the kubelet's order; the other job's GPU is not named.
    let end = check(&w, &mut out, "kl-1", &job, &node);
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    let log = w.log(&node);
    let line = log
        .lines()
        .find(|l| l.contains("the job's GPUs on this node, from the kubelet") && l.contains(job.as_str()))
        .unwrap_or_else(|| panic!("no line naming the kubelet's GPUs:\n{log}"));
    assert!(line.contains(&format!("{},{}", mine[0], mine[1])), "{line}");
    assert!(!line.contains(theirs[0]), "{line}");
    assert_eq!(kubelet.calls(), 1);

    // A job with no pod here: the whole node, said, and the kubelet is not asked.
    let end = check(&w, &mut out, "kl-2", &podless, &node);
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    let log = w.log(&node);
    assert!(log.lines().any(|l| l.contains(podless.as_str()) && l.contains("checking the whole node")), "{log}");
    assert_eq!(kubelet.calls(), 1);

    // A kubelet that fails: the whole node, with the kubelet's error; the check still passes.
    kubelet.fail_with(gpusanity_kube::podres::Code::Unavailable, "kubelet restarting");
    let end = check(&w, &mut out, "kl-3", &failing, &node);
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    let log = w.log(&node);
    let warned =
        log.lines().find(|l| l.contains("could not be learnt from the kubelet") && l.contains(failing.as_str()));
    assert!(warned.is_some_and(|l| l.contains("kubelet restarting")), "{log}");

    // A forged device id from the socket: refused, named, the whole node checked.
    kubelet.recover();
    kubelet.set(&[(&ns, "w4", "trainer", GPU_RESOURCE, &["GPU-\u{1b}[2Jforged"])]);
    let end = check(&w, &mut out, "kl-4", &forged, &node);
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    let log = w.log(&node);
    let warned =
        log.lines().find(|l| l.contains("could not be learnt from the kubelet") && l.contains(forged.as_str()));
    assert!(warned.is_some_and(|l| l.contains("w4")), "{log}");
    assert!(!log.contains('\u{1b}'), "a control character from the socket reached the log");
    w.shutdown();
}

/// A recording of busy GPUs `gpus` over 120 s, for the watch to replay.
fn recording(gpus: &[&str]) -> String {
    let mut lines = Vec::new();
    for s in 0..120u64 {
        for g in gpus {
            lines
                .push(serde_json::json!({"s": s, "gpu": g, "sm_mhz": 1980, "power_w": 640.0, "util": 100}).to_string());
        }
    }
    lines.join("\n")
}

/// The agent and the GPUs of the next summary of `job` on the telemetry topic from an agent
/// other than `not_from`.
fn watched(telemetry: &mut Reader, job: &str, not_from: &str) -> (String, Vec<String>) {
    let v = telemetry.wait_for(Duration::from_secs(30), "a summary of the job", |v| {
        v["payload"].as_str().is_some_and(|p| {
            p.contains(&format!("\"job_id\":\"{job}\"")) && !p.contains(&format!("\"agent_id\":\"{not_from}\""))
        })
    });
    let t: gpusanity_common::wire::watch::Telemetry =
        serde_json::from_str(v["payload"].as_str().unwrap_or("")).expect("a summary");
    (t.agent_id, t.gpus.into_iter().map(|g| g.gpu).collect())
}

#[test]
fn the_watch_samples_the_gpus_the_kubelet_gave_the_job_even_after_the_agent_restarts() {
    let Some(server) = kube_server() else { return };
    let _g = svc::common::serial();
    let cluster = Cluster::new(server);
    let ns = cluster.namespace();
    let node = unique("kw");
    let (job, other) = (unique("job"), unique("job"));
    let kubelet = two_jobs_on(&cluster, &ns, &node, &job, &other);
    let (mine, theirs) = (MINE, THEIRS);

    let mut w = World::new(None, WATCH);
    w.serve();
    // The node's three GPUs, the other job's first.
    let replay = w.dir.path().join("node.replay");
    std::fs::write(&replay, recording(&[theirs[0], mine[0], mine[1]])).expect("recording");
    let replay = replay.to_string_lossy().into_owned();
    let args = kubelet_args(&kubelet, &cluster);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    w.env_for_next(&[("GPUSANITY_WATCH_REPLAY", &replay)]);
    w.agent_via(&node, &[], &args);
    let mut out = w.reader("check-events");
    let mut telemetry = w.reader("telemetry");

    // The check learnt the job's two GPUs; the watch samples those, without asking again.
    let end = check(&w, &mut out, "kw-1", &job, &node);
    assert_eq!(end["type"], "CheckPassed", "{end:#}");
    let (first, gpus) = watched(&mut telemetry, &job, "");
    assert_eq!(gpus, mine, "the job's GPUs, in the kubelet's order");
    assert_eq!(kubelet.calls(), 1, "the watch asked the kubelet again");

    // A new agent never checked the run: at the service's next renewal it asks the kubelet.
    w.kill(&node);
    w.env_for_next(&[("GPUSANITY_WATCH_REPLAY", &replay)]);
    w.agent_via(&node, &[], &args);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while kubelet.calls() < 2 {
        assert!(std::time::Instant::now() < deadline, "the new agent never asked the kubelet:\n{}", w.log(&node));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (second, gpus) = watched(&mut telemetry, &job, &first);
    assert_ne!(first, second);
    assert_eq!(gpus, mine, "the new agent's watch");
    let log = w.log(&node);
    let starts = log
        .lines()
        .filter(|l| l.contains("watching the job's GPUs") && l.contains(&format!("{},{}", mine[0], mine[1])))
        .count();
    assert_eq!(starts, 2, "one watch of the job's GPUs by each agent:\n{log}");
    w.shutdown();
}
