//! On Kubernetes, a job event that names no GPUs for a node: the agent beside the kubelet asks
//! the Kubernetes API for the job's pods on its node (label `gpusanity.io/job-id`) and the
//! kubelet's PodResources socket (a server of the test's own speaking the kubelet's v1 gRPC
//! protocol) for their GPUs, and checks exactly those; without a pod of the job there, or with
//! a kubelet that fails, it checks the whole node and says why. Through the real service with a
//! CPU agent and a real API server.

use std::time::Duration;

use gpusanity_kube::podres::GPU_RESOURCE;
use gpusanity_testkit::podres::PodResourcesServer;
use gpusanity_testkit::svc;
use gpusanity_testkit::svc::kube::{kube_server, unique, Cluster};
use svc::{allocated, Reader, World};

const FAST: &str = "agent_timeout_s = 2.0\nagent_wait_s = 20.0\ndeadline_grace_s = 10.0";

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
    cluster.bound_pod(&ns, "w0", &node, Some(&job), Some("Running"));
    cluster.bound_pod(&ns, "w3", &node, Some(&failing), Some("Running"));
    cluster.bound_pod(&ns, "w4", &node, Some(&forged), Some("Running"));
    cluster.bound_pod(&ns, "x0", &node, Some(&other), Some("Running"));
    let mine = ["GPU-5cd893c3-e5fe-0df3-682b-a88f611dad99", "GPU-0b6f2a51-9a1e-4c49-8e62-2f3c0b8d7e10"];
    let theirs = ["GPU-11111111-2222-3333-4444-555555555555"];
    let kubelet = PodResourcesServer::start(&[
        (&ns, "x0", "trainer", GPU_RESOURCE, &theirs),
        (&ns, "w0", "trainer", GPU_RESOURCE, &mine),
    ]);

    let mut w = World::new(None, FAST);
    w.serve();
    let socket = kubelet.socket().to_string_lossy().into_owned();
    let kubeconfig = cluster.kubeconfig.to_string_lossy().into_owned();
    w.agent_via(&node, &[], &["--kubelet-pod-resources", &socket, "--kubeconfig", &kubeconfig]);
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
