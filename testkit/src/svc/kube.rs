//! This test binary's Kubernetes API server: the one GPUSANITY_TEST_KUBECONFIG names (with
//! GPUSANITY_TEST_KUBE_LIMITED_TOKEN, the token of user `gpusanity-isolation`), else one
//! started by scripts/kube-apiserver.sh (built once from the Go module proxy and cached) and
//! stopped when the binary exits. Without Go and without a cached build, the tests skip
//! (counted; a failure where GPUSANITY_REQUIRE lists `kubernetes`). [`PrivateKube`]: a server of
//! one test's own, to halt and resume; [`Cluster`]: what the tests read and create on it.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gpusanity_kube::{ANNOTATION_KEY, CONDITION_TYPE};
use k8s_openapi::api::core::v1::{Event, Node};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use super::backends::{script_value, start_script_state};
use crate::skip::{or_skip, Prereq};

/// A reachable API server.
#[derive(Debug, Clone)]
pub struct KubeServer {
    /// Admin (system:masters) kubeconfig.
    pub kubeconfig: PathBuf,
    /// Bearer token file of user `gpusanity-isolation`, who has no rights until bound.
    pub limited_token: PathBuf,
}

/// This binary's API server, or the skip (or failure) and `None`.
pub fn kube_server() -> Option<&'static KubeServer> {
    static SERVER: OnceLock<Result<KubeServer, String>> = OnceLock::new();
    let r = SERVER.get_or_init(|| {
        if let Ok(path) = std::env::var("GPUSANITY_TEST_KUBECONFIG") {
            let token = std::env::var("GPUSANITY_TEST_KUBE_LIMITED_TOKEN").map_err(|_| {
                "GPUSANITY_TEST_KUBECONFIG is set without GPUSANITY_TEST_KUBE_LIMITED_TOKEN".to_string()
            })?;
            return Ok(KubeServer { kubeconfig: path.into(), limited_token: token.into() });
        }
        buildable()?;
        start().map(|(server, _)| server)
    });
    or_skip(Prereq::Kubernetes, r.as_ref().map_err(Clone::clone))
}

/// Whether scripts/kube-apiserver.sh can start a server here: a cached build, or Go to build one.
fn buildable() -> Result<(), String> {
    let cached = std::env::var_os("HOME")
        .map(|h| PathBuf::from(h).join(".cache/gpusanity/kube-1.35.4/kube-apiserver"))
        .is_some_and(|p| p.exists());
    let go = std::process::Command::new("go").arg("version").output().is_ok_and(|o| o.status.success());
    if !cached && !go {
        return Err("no cached kube-apiserver build and no `go` to build one (scripts/kube-apiserver.sh)".into());
    }
    Ok(())
}

/// Starts a server with scripts/kube-apiserver.sh (stopped when this test binary exits); its
/// state file.
fn start() -> Result<(KubeServer, PathBuf), String> {
    let (text, state) = start_script_state("kube-apiserver.sh", "KUBE_STATE", &[])?;
    let field = |k: &str| script_value(&text, k).ok_or_else(|| format!("no {k} line in: {text}"));
    let server = KubeServer {
        kubeconfig: field("KUBECONFIG=")?.into(),
        limited_token: field("KUBE_LIMITED_TOKEN_FILE=")?.into(),
    };
    Ok((server, state))
}

/// An API server of one test's own, which it may halt and resume (an outage of the control
/// plane); stopped when dropped. Skips (counted) where no server can be built.
pub struct PrivateKube {
    pub server: KubeServer,
    state: PathBuf,
}

impl PrivateKube {
    pub fn start() -> Option<PrivateKube> {
        let r = buildable().and_then(|()| start());
        let (server, state) = or_skip(Prereq::Kubernetes, r)?;
        Some(PrivateKube { server, state })
    }

    /// Stops the API server, keeping etcd (and so every object).
    pub fn halt(&self) {
        self.script("halt");
    }

    /// Starts the halted API server again on its port; returns once it is ready.
    pub fn resume(&self) {
        self.script("resume");
    }

    fn command(&self, cmd: &str) -> std::process::Command {
        let mut c = std::process::Command::new("bash");
        c.arg(crate::repo().join("scripts/kube-apiserver.sh")).arg(cmd).env("KUBE_STATE", &self.state);
        c
    }

    fn script(&self, cmd: &str) {
        let out = self.command(cmd).output().expect("running scripts/kube-apiserver.sh");
        assert!(out.status.success(), "kube-apiserver.sh {cmd}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

impl Drop for PrivateKube {
    fn drop(&mut self) {
        let _ = self.command("stop").output();
    }
}

/// A test's view of a cluster through its admin kubeconfig (blocking calls).
pub struct Cluster {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    nodes: Api<Node>,
    events: Api<Event>,
    pub kubeconfig: PathBuf,
}

impl Cluster {
    pub fn new(server: &KubeServer) -> Cluster {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let settings =
            gpusanity_kube::ClientSettings { kubeconfig: Some(server.kubeconfig.clone()), ..Default::default() };
        let client = rt.block_on(settings.client()).expect("admin client");
        Cluster {
            nodes: Api::all(client.clone()),
            events: Api::namespaced(client.clone(), "default"),
            client,
            rt,
            kubeconfig: server.kubeconfig.clone(),
        }
    }

    /// A namespace of the test's own (see [`namespace`]).
    pub fn namespace(&self) -> String {
        self.rt.block_on(namespace(&self.client))
    }

    /// A pod bound to `node` (see [`bound_pod`]).
    pub fn bound_pod(&self, ns: &str, name: &str, node: &str, job: Option<&str>, phase: Option<&str>) {
        self.rt.block_on(bound_pod(&self.client, ns, name, node, job, phase))
    }

    /// A Node labelled `team=ml` with `spec` (e.g. a cordon and a taint).
    pub fn create(&self, name: &str, spec: serde_json::Value) -> Node {
        let node = json!({ "metadata": { "name": name, "labels": { "team": "ml" } }, "spec": spec });
        let node: Node = serde_json::from_value(node).expect("node json");
        self.rt.block_on(self.nodes.create(&PostParams::default(), &node)).expect("create node")
    }

    pub fn get(&self, name: &str) -> Node {
        self.rt.block_on(self.nodes.get(name)).expect("get node")
    }

    /// The Events on Node `name`.
    pub fn events(&self, name: &str) -> Vec<Event> {
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        self.rt.block_on(self.events.list(&lp)).expect("events").items
    }

    /// The reasons of the Events on Node `name`, sorted (the list's order is not the order
    /// of writing, and their times are whole seconds).
    pub fn reasons(&self, name: &str) -> Vec<String> {
        let mut r: Vec<String> = self.events(name).into_iter().filter_map(|e| e.reason).collect();
        r.sort();
        r
    }

    /// Waits until Node `name` has at least `n` Events (gpusanity writes its Event last, after
    /// the Node and its condition); their reasons.
    pub fn wait_events(&self, name: &str, n: usize, limit: Duration) -> Vec<String> {
        let start = Instant::now();
        loop {
            let reasons = self.reasons(name);
            if reasons.len() >= n {
                return reasons;
            }
            assert!(start.elapsed() < limit, "Node {name} has {reasons:?}, not {n} Events");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until `pred` holds of Node `name`; the Node.
    pub fn wait(&self, name: &str, limit: Duration, what: &str, pred: impl Fn(&Node) -> bool) -> Node {
        let start = Instant::now();
        loop {
            // An error (a connection of before an outage) is read again.
            let node = self.rt.block_on(self.nodes.get(name));
            if let Ok(node) = &node {
                if pred(node) {
                    return node.clone();
                }
            }
            assert!(start.elapsed() < limit, "Node {name} never {what}: {node:#?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Whether the Node carries gpusanity's record (it isolated the node).
pub fn isolated(node: &Node) -> bool {
    node.metadata.annotations.as_ref().is_some_and(|a| a.contains_key(ANNOTATION_KEY))
}

pub fn taints(node: &Node) -> Vec<(String, Option<String>, String)> {
    let spec = node.spec.clone().unwrap_or_default();
    spec.taints.unwrap_or_default().into_iter().map(|t| (t.key, t.value, t.effect)).collect()
}

pub fn cordoned(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

pub fn condition(node: &Node) -> Option<(String, String)> {
    let conds = node.status.as_ref()?.conditions.as_ref()?;
    let c = conds.iter().find(|c| c.type_ == CONDITION_TYPE)?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

/// The message of gpusanity's condition on `node`.
pub fn condition_message(node: &Node) -> Option<String> {
    let conds = node.status.as_ref()?.conditions.as_ref()?;
    conds.iter().find(|c| c.type_ == CONDITION_TYPE)?.message.clone()
}

/// Node names of this test binary: DNS labels, unique per call.
pub fn unique(prefix: &str) -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!("{prefix}-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// A namespace of the test's own, with the `default` ServiceAccount its pods are admitted with
/// (no controller-manager creates it on this API server).
pub async fn namespace(client: &kube::Client) -> String {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    let name = unique("ns");
    let ns: Namespace = serde_json::from_value(json!({ "metadata": { "name": name } })).expect("namespace json");
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.expect("create namespace");
    let sa: ServiceAccount = serde_json::from_value(json!({ "metadata": { "name": "default" } })).expect("sa json");
    let _ = Api::<ServiceAccount>::namespaced(client.clone(), &name).create(&PostParams::default(), &sa).await;
    name
}

/// A pod bound to `node` (as the scheduler leaves it) asking for 4 GPUs, labelled with job
/// `job` (`gpusanity.io/job-id`) unless None, in `phase` unless None.
pub async fn bound_pod(
    client: &kube::Client,
    ns: &str,
    name: &str,
    node: &str,
    job: Option<&str>,
    phase: Option<&str>,
) {
    use gpusanity_kube::podres::{GPU_RESOURCE, JOB_LABEL};
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{Patch, PatchParams};
    let labels = match job {
        Some(job) => json!({ (JOB_LABEL): job, "app": "train" }),
        None => json!({ "app": "train" }),
    };
    let pod = json!({
        "metadata": { "name": name, "labels": labels },
        "spec": {
            "nodeName": node,
            "containers": [{ "name": "trainer", "image": "registry.example.com/train:latest",
                             "resources": { "limits": { (GPU_RESOURCE): "4" } } }],
        },
    });
    let pod: Pod = serde_json::from_value(pod).expect("pod json");
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pod).await.expect("create pod");
    if let Some(phase) = phase {
        let status = json!({ "status": { "phase": phase } });
        pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("pod status");
    }
}
