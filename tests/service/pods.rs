//! The Kubernetes manifests run real pods: a one-node cluster of the test's own (a real kubelet
//! with containerd, scripts/kubelet.sh) takes `kubectl apply -k` of deploy/kubernetes through a
//! test overlay, with the image CI built from the binary these tests ran. The serve Deployment
//! becomes ready, the agent DaemonSet's pod checks its node for a job event, and a pod of the
//! PyTorchJob example's template runs `gpusanity check -- python3 ...` to its hand-over.
//!
//! The overlay changes only what a CPU test node needs: no NVIDIA runtime class or GPU node
//! selector, `--device cpu`, images imported locally (`imagePullPolicy: Never`), one serve
//! replica on the host's network (the test's broker and database listen on loopback), its
//! configuration (the test's topics), and the Secrets a cluster makes itself.

use std::path::Path;
use std::time::{Duration, Instant};

use gpusanity_testkit::image::{built_or_skip, image_or_skip, KubeNode};
use gpusanity_testkit::manifests::documents;
use gpusanity_testkit::svc::{self, allocated, broker, postgres_database, World, TOKEN};
use serde_json::{json, Value};

/// The serve pod's port (the manifests' containerPort) on the host's network.
const SERVE_PORT: u16 = 8088;

/// The world's configuration as the ConfigMap of the overlay: serve listens where its probes
/// look, the agent keys come from the Secret's mount.
fn pod_config(w: &World) -> String {
    let text = std::fs::read_to_string(&w.config).expect("the world's configuration");
    let keys = w.agent_keys().display().to_string();
    text.replace(&format!("listen = \"127.0.0.1:{}\"", w.http), &format!("listen = \"0.0.0.0:{SERVE_PORT}\""))
        .replace(&format!("127.0.0.1:{}/v1", w.http), &format!("127.0.0.1:{SERVE_PORT}/v1"))
        .replace(&keys, "/run/keys/agent-keys.toml")
}

/// The overlay: deploy/kubernetes as the base, the changes of a CPU test node on top.
fn write_overlay(dir: &Path, w: &World, image: &str) {
    // kustomize takes a base by a relative path only.
    let base = relative(dir, Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes")));
    std::fs::write(dir.join("service.toml"), pod_config(w)).expect("service.toml");
    std::fs::copy(w.agent_keys(), dir.join("agent-keys.toml")).expect("agent-keys.toml");
    let (name, tag) = image.rsplit_once(':').expect("IMAGE:TAG");
    // The base's `images:` already maps `gpusanity` to the user's registry: map that name.
    let base_kustomization =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/kubernetes/kustomization.yaml"))
            .expect("deploy/kubernetes/kustomization.yaml");
    let registry_name = base_kustomization
        .lines()
        .find_map(|l| l.trim().strip_prefix("newName:"))
        .and_then(|v| v.split('#').next())
        .map(str::trim)
        .expect("the base's images: newName");
    let agent_patch = json!([
        { "op": "remove", "path": "/spec/template/spec/runtimeClassName" },
        { "op": "remove", "path": "/spec/template/spec/nodeSelector" },
        { "op": "test", "path": "/spec/template/spec/containers/0/command/6", "value": "--device" },
        { "op": "replace", "path": "/spec/template/spec/containers/0/command/7", "value": "cpu" },
        { "op": "add", "path": "/spec/template/spec/containers/0/imagePullPolicy", "value": "Never" },
    ]);
    let serve_patch = json!([
        { "op": "replace", "path": "/spec/replicas", "value": 1 },
        { "op": "add", "path": "/spec/template/spec/hostNetwork", "value": true },
        { "op": "add", "path": "/spec/template/spec/containers/0/imagePullPolicy", "value": "Never" },
    ]);
    let kustomization = json!({
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base],
        "images": [{ "name": registry_name, "newName": name, "newTag": tag }],
        "configMapGenerator": [{ "name": "gpusanity-config", "namespace": "gpusanity", "behavior": "replace", "files": ["service.toml"] }],
        "secretGenerator": [
            { "name": "gpusanity-serve", "namespace": "gpusanity",
              "literals": [format!("database-url={}", w.db_url), format!("api-token={TOKEN}")] },
            { "name": "gpusanity-agent-keys", "namespace": "gpusanity", "files": ["agent-keys.toml"] },
        ],
        "generatorOptions": { "disableNameSuffixHash": true },
        "patches": [
            { "target": { "kind": "DaemonSet", "name": "gpusanity-agent" }, "patch": agent_patch.to_string() },
            { "target": { "kind": "Deployment", "name": "gpusanity-serve" }, "patch": serve_patch.to_string() },
        ],
    });
    // JSON is YAML: kustomize reads it as it is.
    std::fs::write(dir.join("kustomization.yaml"), kustomization.to_string()).expect("kustomization.yaml");
}

/// The path of `to` from the folder `from` (both absolute).
fn relative(from: &Path, to: &Path) -> String {
    let (from, to) = (from.canonicalize().expect("from"), to.canonicalize().expect("to"));
    let common = from.components().zip(to.components()).take_while(|(a, b)| a == b).count();
    let up = from.components().count() - common;
    let mut parts: Vec<String> = vec!["..".to_string(); up];
    parts.extend(to.components().skip(common).map(|c| c.as_os_str().to_string_lossy().into_owned()));
    parts.join("/")
}

/// A plain Pod of the PyTorchJob example's Master template: its command up to `--`, then a
/// python3 program in place of torchrun; the training image; no GPU request (a CPU node).
fn training_pod(image: &str) -> Value {
    let job = documents().into_iter().find(|d| d.kind() == "PyTorchJob").expect("the PyTorchJob example");
    let mut template = job.value["spec"]["pytorchReplicaSpecs"]["Master"]["template"].clone();
    let container = &mut template["spec"]["containers"][0];
    let command: Vec<Value> = container["command"].as_array().expect("a command").clone();
    let cut = command.iter().position(|a| a == "--").expect("the example hands over after --");
    let mut command: Vec<Value> = command[..=cut].to_vec();
    command.extend(["python3", "-c", "print('training starts')"].map(Value::from));
    container["command"] = Value::from(command);
    container["image"] = Value::from(image);
    container["imagePullPolicy"] = Value::from("Never");
    container.as_object_mut().expect("a container").remove("resources");
    template["spec"]["restartPolicy"] = Value::from("Never");
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "pretrain-master-0", "namespace": "default" },
        "spec": template["spec"],
    })
}

/// Polls the pod's phase until it ends (Succeeded or Failed) or `limit` passes.
fn wait_pod_end(node: &KubeNode, ns: &str, pod: &str, limit: Duration) -> String {
    let start = Instant::now();
    loop {
        let out = node.kubectl(&["-n", ns, "get", "pod", pod, "-o", "jsonpath={.status.phase}"]);
        let phase = String::from_utf8_lossy(&out.stdout).into_owned();
        if phase == "Succeeded" || phase == "Failed" {
            return phase;
        }
        if start.elapsed() > limit {
            let describe = node.kubectl(&["-n", ns, "describe", "pod", pod]);
            panic!("pod {pod} still {phase} after {limit:?}:\n{}", String::from_utf8_lossy(&describe.stdout));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn the_manifests_run_real_pods_on_a_kubelet_serve_ready_agent_checks_training_hands_over() {
    let Some(image) = image_or_skip() else { return };
    let Some(training) = built_or_skip("GPUSANITY_TEST_TRAINING_IMAGE", "training image (scripts/image.sh training)")
    else {
        return;
    };
    let _g = svc::common::serial();
    let Some(node) = KubeNode::start_or_skip() else { return };
    node.load(&image);
    node.load(&training);
    let _ = broker();
    let mut w = World::new(Some(postgres_database("gpusanity_pods")), "agent_timeout_s = 3.0\nagent_wait_s = 60.0");
    let overlay = tempfile::tempdir().expect("tempdir");
    write_overlay(overlay.path(), &w, &image);
    let mut out = w.reader("check-events");

    // The service and its agents, as the README applies them (its Secrets from the overlay).
    node.kubectl_ok(&["apply", "-k", &overlay.path().display().to_string()]);
    for what in ["deployment/gpusanity-serve", "daemonset/gpusanity-agent"] {
        let rollout = node.kubectl(&["-n", "gpusanity", "rollout", "status", what, "--timeout=240s"]);
        if !rollout.status.success() {
            let pods = node.kubectl(&["-n", "gpusanity", "describe", "pods"]);
            let logs = node.kubectl(&[
                "-n",
                "gpusanity",
                "logs",
                "--all-containers",
                "--tail=30",
                "-l",
                "app.kubernetes.io/part-of=gpusanity",
            ]);
            panic!(
                "{what} did not roll out: {}\n{}\n{}\n{}",
                String::from_utf8_lossy(&rollout.stderr),
                String::from_utf8_lossy(&pods.stdout),
                String::from_utf8_lossy(&logs.stdout),
                node.logs()
            );
        }
    }
    let ready = node.kubectl_ok(&[
        "-n",
        "gpusanity",
        "get",
        "pods",
        "-l",
        "app.kubernetes.io/name=gpusanity-serve",
        "-o",
        "jsonpath={.items[*].status.conditions[?(@.type==\"Ready\")].status}",
    ]);
    assert_eq!(ready.trim(), "True", "the serve pod is not Ready");
    w.http = SERVE_PORT;
    assert_eq!(w.http_call("GET", "/ready", None, None).map(|r| r.0).ok(), Some(200), "serve's /ready");

    // The agent pod takes its node's task: a job on the node passes.
    w.publish(allocated("pod-1", "job-pod", &[&node.node], "--sanity-check-max-time=3").as_bytes());
    let end = out.wait_for(Duration::from_secs(180), "the job's verdict", |v| {
        v["job_id"] == "job-pod" && (v["type"] == "CheckPassed" || v["type"] == "CheckFailed")
    });
    let serve_log = || {
        String::from_utf8_lossy(
            &node.kubectl(&["-n", "gpusanity", "logs", "deployment/gpusanity-serve", "--tail=40"]).stdout,
        )
        .into_owned()
    };
    assert_eq!(end["type"], "CheckPassed", "{end:#}\n{}", serve_log());

    // Each pod ran as the manifests say: user 65532, read-only root file system.
    let users = node.kubectl_ok(&[
        "-n", "gpusanity", "get", "pods", "-o",
        "jsonpath={range .items[*]}{.spec.securityContext.runAsUser} {.spec.containers[0].securityContext.readOnlyRootFilesystem}{\"\\n\"}{end}",
    ]);
    assert_eq!(users.lines().collect::<Vec<_>>(), ["65532 true", "65532 true"], "{users}");

    // A training pod of the PyTorchJob example checks its node, then becomes the training.
    let secret: String = (0..32).map(|_| format!("{:02x}", rand::random::<u8>())).collect();
    node.kubectl_ok(&[
        "-n",
        "default",
        "create",
        "secret",
        "generic",
        "gpusanity-rdzv",
        &format!("--from-literal=rdzv={secret}"),
    ]);
    let pod = training_pod(&training);
    let manifest = overlay.path().join("training-pod.json");
    std::fs::write(&manifest, pod.to_string()).expect("training-pod.json");
    node.kubectl_ok(&["apply", "-f", &manifest.display().to_string()]);
    let phase = wait_pod_end(&node, "default", "pretrain-master-0", Duration::from_secs(240));
    let logs = node.kubectl_ok(&["-n", "default", "logs", "pretrain-master-0"]);
    assert_eq!(phase, "Succeeded", "{logs}");
    assert!(logs.contains("verdict: CheckPassed"), "{logs}");
    assert!(logs.trim_end().ends_with("training starts"), "the training ran after the check:\n{logs}");

    node.kubectl_ok(&["delete", "-k", &overlay.path().display().to_string(), "--wait=false"]);
    drop(node);
}
