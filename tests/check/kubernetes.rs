//! `gpusanity check --k8s-isolate` against a real kube-apiserver (scripts/kube-apiserver.sh): a
//! failing check isolates this node's Node (named by `NODE_NAME`, as the downward API sets it
//! in a pod), a passing one returns it; an API server that cannot be reached and a name that is
//! no Node are warnings, and the exit code is the check's.

use gpusanity_kube::{EVENT_ISOLATED, EVENT_RETURNED, TAINT_KEY};
use gpusanity_testkit::common;
use gpusanity_testkit::svc::kube::{
    condition, condition_message, cordoned, isolated, kube_server, taints, unique, Cluster,
};

use std::path::Path;
use std::time::Duration;

use common::*;

const LIMIT: Duration = Duration::from_secs(60);

/// `gpusanity check --quick --k8s-isolate` on this node, the Node `node` (NODE_NAME), the
/// cluster of `kubeconfig`, a wrong GEMM when `fault`: its exit code and stderr.
fn quick_isolate(run: &Run, node: &str, kubeconfig: &Path, fault: bool) -> (i32, String) {
    let kubeconfig = kubeconfig.display().to_string();
    let mut cmd = run.command(&["--quick", "--nproc-per-node", "1", "--k8s-isolate", "--k8s-kubeconfig", &kubeconfig]);
    cmd.env("NODE_NAME", node).env_remove("KUBECONFIG");
    if fault {
        cmd.arg("--test-faults").env("GPUSANITY_FAULT", "gemm-wrong@0");
    }
    let out = run_with_timeout(cmd, LIMIT);
    (code(&out), stderr(&out))
}

#[test]
fn k8s_isolate_isolates_this_node_on_a_failure_and_returns_it_on_a_pass() {
    let Some(server) = kube_server() else { return };
    let (_g, run) = (serial(), Run::new());
    let k = Cluster::new(server);
    let name = unique("pod-node");
    let before = k.create(&name, serde_json::json!({}));

    let (code, err) = quick_isolate(&run, &name, &k.kubeconfig, true);
    assert_eq!(code, 1, "the check's own exit code: {err}");
    assert!(err.contains(&format!("gpusanity: kubernetes: isolated {name} (GEMM_WRONG_RESULT)")), "{err}");
    let node = k.get(&name);
    assert!(isolated(&node) && cordoned(&node), "{node:#?}");
    assert_eq!(taints(&node), [(TAINT_KEY.into(), Some("GEMM_WRONG_RESULT".into()), "NoSchedule".into())]);
    assert_eq!(condition(&node).map(|c| c.1), Some("GEMM_WRONG_RESULT".into()));
    let events = k.events(&name);
    let message = events.first().and_then(|e| e.message.clone()).unwrap_or_default();
    // The code once, in the Event and the condition alike.
    assert!(message.starts_with("GEMM_WRONG_RESULT in gemm: "), "{events:#?}");
    assert_eq!(message.matches("GEMM_WRONG_RESULT").count(), 1, "{message}");
    assert_eq!(condition_message(&node).as_deref(), Some(message.as_str()));

    // A failing check again: already isolated, nothing written twice.
    let (code, err) = quick_isolate(&run, &name, &k.kubeconfig, true);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains(&format!("{name} was isolated already")), "{err}");

    let (code, err) = quick_isolate(&run, &name, &k.kubeconfig, false);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains(&format!("gpusanity: kubernetes: returned {name} to service")), "{err}");
    let node = k.get(&name);
    assert_eq!(node.spec, before.spec);
    assert_eq!(node.metadata.labels, before.metadata.labels);
    assert_eq!(k.reasons(&name), [EVENT_ISOLATED, EVENT_RETURNED]);
    run.assert_nothing_left();
}

#[test]
fn k8s_isolate_warns_without_changing_the_verdict_when_it_cannot_act() {
    let Some(server) = kube_server() else { return };
    let (_g, run) = (serial(), Run::new());
    // An API server that is not there: a port nothing listens on.
    let away = run.dir.path().join("away.kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: away\n  cluster:\n    server: https://127.0.0.1:{}\n    \
         insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: x\ncontexts:\n- name: away\n  \
         context:\n    cluster: away\n    user: u\ncurrent-context: away\n",
        free_port()
    );
    std::fs::write(&away, text).expect("kubeconfig");
    let (code, err) = quick_isolate(&run, "gpu-away", &away, true);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("gpusanity: kubernetes: warning: the API server cannot be reached"), "{err}");

    // A node name that is no Node, and one that is no Node name at all (from the environment).
    let (code, err) = quick_isolate(&run, "no-such-node", &server.kubeconfig, true);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("warning: no Node named `no-such-node`"), "{err}");
    let (code, err) = quick_isolate(&run, "Bad Name\n\"x\"", &server.kubeconfig, false);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("is not a Kubernetes Node name"), "{err}");
    run.assert_nothing_left();
}
