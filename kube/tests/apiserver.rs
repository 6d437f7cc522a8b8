//! The Kubernetes isolation backend against a real kube-apiserver (scripts/kube-apiserver.sh):
//! isolate and return a Node, an operator's maintenance left alone, 409 Conflicts retried,
//! the shipped ClusterRole, hostile input, a dry run.

use gpusanity_kube::*;
use gpusanity_testkit::svc::kube::{kube_server, KubeServer};
use k8s_openapi::api::core::v1::{Event, Node, Pod, Secret};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};

static SEQ: AtomicU64 = AtomicU64::new(0);

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

async fn admin(server: &KubeServer) -> kube::Client {
    ClientSettings { kubeconfig: Some(server.kubeconfig.clone()), ..Default::default() }
        .client()
        .await
        .expect("admin client")
}

/// A Node of that name (no taints, schedulable unless `cordoned`).
async fn create_node(client: &kube::Client, name: &str, extra: serde_json::Value) -> Node {
    let mut node = json!({ "metadata": { "name": name, "labels": { "team": "ml" } }, "spec": {} });
    if let (Some(spec), Some(extra)) = (node["spec"].as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    let node: Node = serde_json::from_value(node).expect("node json");
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.expect("create node")
}

async fn get(client: &kube::Client, name: &str) -> Node {
    Api::<Node>::all(client.clone()).get(name).await.expect("get node")
}

fn condition(node: &Node) -> Option<(String, String, String)> {
    let conds = node.status.as_ref()?.conditions.as_ref()?;
    let c = conds.iter().find(|c| c.type_ == CONDITION_TYPE)?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default(), c.message.clone().unwrap_or_default()))
}

fn taints(node: &Node) -> Vec<(String, Option<String>, String)> {
    let spec = node.spec.clone().unwrap_or_default();
    spec.taints.unwrap_or_default().into_iter().map(|t| (t.key, t.value, t.effect)).collect()
}

async fn events_for(client: &kube::Client, name: &str) -> Vec<Event> {
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    Api::<Event>::namespaced(client.clone(), "default").list(&lp).await.expect("events").items
}

#[tokio::test(flavor = "multi_thread")]
async fn a_faulty_node_is_isolated_once_and_returned_with_only_ours_removed() {
    let Some(server) = kube_server() else { return };
    let client = admin(server).await;
    let name = unique("gpu");
    create_node(&client, &name, json!({})).await;
    let iso = Isolator::new(client.clone(), Effect::NoSchedule, false);

    let out = iso.isolate(&name, "GEMM_WRONG_RESULT", "rank 3: 12 of 4096 elements wrong").await.expect("isolate");
    assert!(matches!(&out, Outcome::Isolated(r) if r.taint_added && r.label_added && !r.was_unschedulable), "{out:?}");
    let node = get(&client, &name).await;
    assert_eq!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    assert_eq!(taints(&node), [(TAINT_KEY.into(), Some("GEMM_WRONG_RESULT".into()), "NoSchedule".into())]);
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(LABEL_KEY).map(String::as_str), Some("GEMM_WRONG_RESULT"));
    assert_eq!(labels.get("team").map(String::as_str), Some("ml"));
    let (status, reason, message) = condition(&node).expect("condition");
    assert_eq!((status.as_str(), reason.as_str()), ("True", "GEMM_WRONG_RESULT"));
    assert_eq!(message, "rank 3: 12 of 4096 elements wrong");
    assert!(node.metadata.annotations.unwrap_or_default().contains_key(ANNOTATION_KEY));
    let events = events_for(&client, &name).await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].reason.as_deref(), Some(EVENT_ISOLATED));
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));

    // Applied again (a redelivered event, a second replica): nothing changes.
    let rv = get(&client, &name).await.metadata.resource_version;
    assert_eq!(iso.isolate(&name, "OTHER_CODE", "again").await.expect("again"), Outcome::AlreadyIsolated);
    assert_eq!(get(&client, &name).await.metadata.resource_version, rv);
    assert_eq!(events_for(&client, &name).await.len(), 1);

    let out = iso.restore(&name).await.expect("restore");
    assert!(matches!(out, Outcome::Returned(_)), "{out:?}");
    let node = get(&client, &name).await;
    assert_ne!(node.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    assert!(taints(&node).is_empty(), "{:?}", taints(&node));
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert!(!labels.contains_key(LABEL_KEY));
    assert_eq!(labels.get("team").map(String::as_str), Some("ml"));
    assert!(!node.metadata.annotations.clone().unwrap_or_default().contains_key(ANNOTATION_KEY));
    assert_eq!(condition(&node).map(|c| (c.0, c.1)), Some(("False".into(), REASON_PASSED.into())));
    assert_eq!(iso.restore(&name).await.expect("again"), Outcome::NotOurs);
    let reasons: Vec<_> = events_for(&client, &name).await.into_iter().filter_map(|e| e.reason).collect();
    assert!(reasons.contains(&EVENT_RETURNED.to_string()), "{reasons:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_operators_maintenance_stays_exactly_as_it_was() {
    let Some(server) = kube_server() else { return };
    let client = admin(server).await;
    let name = unique("maint");
    let spec =
        json!({ "unschedulable": true, "taints": [{ "key": "maintenance", "value": "psu", "effect": "NoExecute" }] });
    let before = create_node(&client, &name, spec).await;
    let iso = Isolator::new(client.clone(), Effect::NoExecute, false);
    let out = iso.isolate(&name, "NCCL_ALLREDUCE_WRONG", "bad").await.expect("isolate");
    assert!(matches!(&out, Outcome::Isolated(r) if r.was_unschedulable), "{out:?}");
    let during = get(&client, &name).await;
    assert_eq!(taints(&during).len(), 2);
    assert!(taints(&during).contains(&(TAINT_KEY.into(), Some("NCCL_ALLREDUCE_WRONG".into()), "NoExecute".into())));
    iso.restore(&name).await.expect("restore");
    let after = get(&client, &name).await;
    assert_eq!(after.spec, before.spec, "the operator's cordon and taint are untouched");
    assert_eq!(after.metadata.labels, before.metadata.labels);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_concurrent_writer_makes_conflicts_that_are_retried_and_nothing_is_lost() {
    let Some(server) = kube_server() else { return };
    let client = admin(server).await;
    let name = unique("busy");
    create_node(&client, &name, json!({})).await;
    let iso = Isolator::new(client.clone(), Effect::NoSchedule, false);
    // Another controller relabels the node as fast as it can, without a resourceVersion.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (nodes, stop, name) = (Api::<Node>::all(client.clone()), stop.clone(), name.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let p = json!({ "metadata": { "labels": { "writer": i.to_string() } } });
                nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&p)).await.expect("writer");
                i += 1;
                tokio::time::sleep(std::time::Duration::from_millis(3)).await;
            }
            i
        })
    };
    for _ in 0..20 {
        assert!(matches!(iso.isolate(&name, "X", "m").await.expect("isolate"), Outcome::Isolated(_)));
        assert!(matches!(iso.restore(&name).await.expect("restore"), Outcome::Returned(_)));
    }
    stop.store(true, Ordering::Relaxed);
    let writes = writer.await.expect("writer");
    let node = get(&client, &name).await;
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("writer"), Some(&(writes - 1).to_string()), "the writer's last label survived");
    assert!(taints(&node).is_empty() && node.spec.as_ref().and_then(|s| s.unschedulable) != Some(true));
    assert!(iso.conflicts() > 0, "no 409 Conflict in 40 writes racing {writes} others");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_shipped_cluster_role_isolates_and_refuses_pods_and_secrets() {
    let Some(server) = kube_server() else { return };
    let kubectl =
        |args: &[&str]| std::process::Command::new("kubectl").args(args).env("KUBECONFIG", &server.kubeconfig).output();
    let Ok(_) = kubectl(&["version", "--client"]) else {
        gpusanity_testkit::skip::missing(gpusanity_testkit::skip::Prereq::Kubernetes, "kubectl is missing");
        return;
    };
    let _ = kubectl(&["create", "namespace", "gpusanity"]);
    let rbac = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/rbac.yaml");
    let out = kubectl(&["apply", "-f", &rbac.display().to_string()]).expect("kubectl apply");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let _ = kubectl(&[
        "create",
        "clusterrolebinding",
        "gpusanity-isolation-user",
        "--clusterrole=gpusanity-isolation",
        "--user=gpusanity-isolation",
    ]);
    let admin = admin(server).await;
    let name = unique("rbac");
    create_node(&admin, &name, json!({})).await;
    let limited = ClientSettings {
        kubeconfig: Some(server.kubeconfig.clone()),
        token_file: Some(server.limited_token.clone()),
        ..Default::default()
    }
    .client()
    .await
    .expect("limited client");
    // The binding may take a moment to reach the authorizer's cache.
    let iso = Isolator::new(limited.clone(), Effect::NoSchedule, false);
    let mut out = iso.isolate(&name, "X", "m").await;
    for _ in 0..50 {
        if !matches!(out, Err(KubeError::Refused { code: 403, .. })) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        out = iso.isolate(&name, "X", "m").await;
    }
    assert!(matches!(out, Ok(Outcome::Isolated(_))), "{out:?}");
    assert!(matches!(iso.restore(&name).await, Ok(Outcome::Returned(_))));
    let secret = Api::<Secret>::namespaced(limited.clone(), "default").get("anything").await;
    assert!(matches!(&secret, Err(kube::Error::Api(s)) if s.code == 403), "{secret:?}");
    let p = json!({ "metadata": { "labels": { "x": "y" } } });
    let pod =
        Api::<Pod>::namespaced(limited, "default").patch("anything", &PatchParams::default(), &Patch::Merge(&p)).await;
    assert!(matches!(&pod, Err(kube::Error::Api(s)) if s.code == 403), "{pod:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_codes_and_messages_are_sanitised_and_a_missing_node_is_an_error() {
    let Some(server) = kube_server() else { return };
    let client = admin(server).await;
    let name = unique("hostile");
    create_node(&client, &name, json!({})).await;
    let iso = Isolator::new(client.clone(), Effect::NoSchedule, false);
    let message = format!("line1\nline2\r\n\"quoted\" 'x' héllo 日本 {}", "A".repeat(10_000));
    let code = "BAD\ncode\"=\u{e9}{}$(rm -rf /)";
    assert!(matches!(iso.isolate(&name, code, &message).await, Ok(Outcome::Isolated(_))));
    let node = get(&client, &name).await;
    let value = node.metadata.labels.clone().unwrap_or_default().get(LABEL_KEY).cloned().expect("label");
    assert_eq!(value, label_value(code));
    assert!(value.len() <= 63 && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)));
    assert_eq!(taints(&node)[0].1.as_deref(), Some(value.as_str()));
    let (_, reason, msg) = condition(&node).expect("condition");
    assert_eq!(reason, value);
    assert!(msg.starts_with("line1 line2 \"quoted\" 'x' héllo 日本 AAA") && !msg.contains('\n'), "{msg}");
    assert_eq!(msg.chars().count(), MAX_MESSAGE);

    for bad in ["node\nX", "Node-Upper", "a b", "../etc", ""] {
        assert!(matches!(iso.isolate(bad, "X", "m").await, Err(KubeError::BadNodeName(_))), "{bad:?}");
    }
    let missing = unique("nosuch");
    let e = iso.isolate(&missing, "X", "m").await.expect_err("no such node");
    assert!(matches!(&e, KubeError::NoSuchNode(n) if *n == missing), "{e:?}");
    assert!(e.to_string().contains(&missing) && !e.is_transient());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_dry_run_is_checked_by_the_server_and_stores_nothing() {
    let Some(server) = kube_server() else { return };
    let client = admin(server).await;
    let name = unique("dry");
    let before = create_node(&client, &name, json!({})).await;
    let iso = Isolator::new(client.clone(), Effect::NoSchedule, true);
    assert!(matches!(iso.isolate(&name, "X", "m").await, Ok(Outcome::Isolated(_))));
    let after = get(&client, &name).await;
    assert_eq!(after.metadata.resource_version, before.metadata.resource_version);
    assert!(events_for(&client, &name).await.is_empty());
}
