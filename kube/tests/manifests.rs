//! The manifests under deploy/kubernetes/ against a real kube-apiserver
//! (scripts/kube-apiserver.sh): every YAML document of every file there is read, the CRDs are
//! installed for real (and waited for until established), the Namespaces created for real, and
//! every other object submitted with server-side dry run (`dryRun=All`) and strict field
//! validation, so a misspelt or misplaced field fails as an unknown one. The pod templates inside
//! custom resources (a PyTorchJob's, a JobSet's), which their CRDs keep as given, are submitted
//! as Pods too.

use std::collections::BTreeSet;
use std::time::Duration;

use gpusanity_kube::ClientSettings;
use gpusanity_testkit::manifests::{documents, pod_templates, Doc};
use gpusanity_testkit::svc::kube::kube_server;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{pinned_kind, ApiCapabilities, ApiResource, Scope};
use serde_json::{json, Value};

/// Writes of this test are recorded under this field manager.
const MANAGER: &str = "gpusanity-manifests-test";

fn gvk(doc: &Doc) -> GroupVersionKind {
    GroupVersionKind::gvk(doc.group(), doc.version(), doc.kind())
}

#[test]
fn every_manifest_is_yaml_with_a_kind_and_a_name_and_none_is_missing() {
    let docs = documents();
    let kinds: BTreeSet<&str> = docs.iter().map(Doc::kind).collect();
    for kind in ["Namespace", "ConfigMap", "Deployment", "Service", "DaemonSet", "ClusterRole", "PyTorchJob"] {
        assert!(kinds.contains(kind), "no {kind} in deploy/kubernetes: {kinds:?}");
    }
    let crd_kinds: BTreeSet<&str> = docs
        .iter()
        .filter(|d| d.kind() == "CustomResourceDefinition")
        .filter_map(|d| d.value["spec"]["names"]["kind"].as_str())
        .collect();
    for d in docs.iter().filter(|d| d.group().contains('.') && !d.group().ends_with(".k8s.io")) {
        assert!(crd_kinds.contains(d.kind()), "{}: its CRD is not under deploy/kubernetes/crds", d.describe());
    }
}

/// Server-side apply of `value`, for real or as a dry run, with strict field validation.
async fn apply(client: &kube::Client, doc: &Doc, value: &Value, namespace: Option<&str>, dry_run: bool) {
    let (ar, caps) = resource(client, &gvk(doc)).await.unwrap_or_else(|e| panic!("{}: {e}", doc.describe()));
    let api: Api<DynamicObject> = match (caps.scope, namespace) {
        (Scope::Cluster, _) => Api::all_with(client.clone(), &ar),
        (Scope::Namespaced, ns) => Api::namespaced_with(client.clone(), ns.unwrap_or("default"), &ar),
    };
    let mut pp = PatchParams::apply(MANAGER).force().validation_strict();
    pp.dry_run = dry_run;
    let name = value["metadata"]["name"].as_str().unwrap_or_default();
    if let Err(e) = api.patch(name, &pp, &Patch::Apply(value)).await {
        panic!("{} refused by the API server (dry run: {dry_run}): {e}", doc.describe());
    }
}

/// The resource of `gvk`; a CRD just established may take a moment to reach discovery.
async fn resource(client: &kube::Client, gvk: &GroupVersionKind) -> Result<(ApiResource, ApiCapabilities), String> {
    let mut last = String::new();
    for _ in 0..50 {
        match pinned_kind(client, gvk).await {
            Ok(found) => return Ok(found),
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Err(format!("the API server does not serve {gvk:?}: {last}"))
}

async fn wait_established(client: &kube::Client, name: &str) {
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    for _ in 0..150 {
        let crd = crds.get(name).await.unwrap_or_else(|e| panic!("CRD {name}: {e}"));
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        if established {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("CRD {name} not established within 30 s");
}

/// Pod template `i` of `doc` as a Pod of its own.
fn template_pod(doc: &Doc, i: usize, template: &Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": format!("{}-template-{i}", doc.name()) },
        "spec": template["spec"].clone(),
    });
    if let Some(labels) = template["metadata"].get("labels") {
        pod["metadata"]["labels"] = labels.clone();
    }
    pod
}

#[tokio::test(flavor = "multi_thread")]
async fn every_manifest_is_accepted_by_the_api_server() {
    let docs = documents();
    let Some(server) = kube_server() else { return };
    let client = ClientSettings { kubeconfig: Some(server.kubeconfig.clone()), ..Default::default() }
        .client()
        .await
        .expect("admin client");

    // The CRDs and the Namespaces for real, as `kubectl apply` in the README's order makes them.
    let (crds, rest): (Vec<&Doc>, Vec<&Doc>) = docs.iter().partition(|d| d.kind() == "CustomResourceDefinition");
    for crd in &crds {
        apply(&client, crd, &crd.value, None, false).await;
    }
    for crd in &crds {
        wait_established(&client, crd.name()).await;
    }
    let custom_groups: BTreeSet<&str> = crds.iter().filter_map(|d| d.value["spec"]["group"].as_str()).collect();
    let (namespaces, rest): (Vec<&Doc>, Vec<&Doc>) = rest.into_iter().partition(|d| d.kind() == "Namespace");
    for ns in &namespaces {
        apply(&client, ns, &ns.value, None, false).await;
    }
    // This server has no controller manager, which gives each namespace its `default`
    // ServiceAccount; Pods (the templates below) are refused without it.
    let sa = Doc {
        file: "(test)".into(),
        value: json!({ "apiVersion": "v1", "kind": "ServiceAccount", "metadata": { "name": "default" } }),
    };
    let mut template_namespaces: BTreeSet<String> = BTreeSet::new();

    let mut submitted = 0;
    for doc in &rest {
        apply(&client, doc, &doc.value, doc.namespace(), true).await;
        submitted += 1;
        if custom_groups.contains(doc.group()) {
            let pods: Vec<Value> =
                pod_templates(&doc.value).into_iter().enumerate().map(|(i, t)| template_pod(doc, i, t)).collect();
            assert!(!pods.is_empty(), "{}: no pod template found", doc.describe());
            let ns = doc.namespace().unwrap_or("default");
            if template_namespaces.insert(ns.to_string()) {
                apply(&client, &sa, &sa.value, Some(ns), false).await;
            }
            for pod in pods {
                let what = Doc { file: doc.file.clone(), value: pod.clone() };
                apply(&client, &what, &pod, Some(ns), true).await;
                submitted += 1;
            }
        }
    }
    assert!(submitted >= 10, "only {submitted} objects submitted");
}
