//! The Kubernetes manifests under deploy/kubernetes/: every YAML document of every file there
//! (so that a new file is covered without naming it), read for the tests that submit them to an
//! API server (kube/tests/manifests.rs) and that run their `gpusanity` command lines through the
//! real binary (tests/check/kube_manifests.rs).

use std::path::{Path, PathBuf};

use serde_json::Value;

/// Files the deployment consists of: gone or renamed, the tests name them.
pub const EXPECTED: [&str; 7] = [
    "namespace.yaml",
    "rbac.yaml",
    "config.yaml",
    "serve.yaml",
    "service.yaml",
    "agent.yaml",
    "examples/pytorchjob.yaml",
];

/// One YAML document of one file.
#[derive(Debug, Clone)]
pub struct Doc {
    /// The file, relative to deploy/kubernetes/.
    pub file: PathBuf,
    pub value: Value,
}

impl Doc {
    pub fn kind(&self) -> &str {
        self.value["kind"].as_str().unwrap_or_default()
    }

    pub fn name(&self) -> &str {
        self.value["metadata"]["name"].as_str().unwrap_or_default()
    }

    pub fn api_version(&self) -> &str {
        self.value["apiVersion"].as_str().unwrap_or_default()
    }

    /// The API group ("" for the core group).
    pub fn group(&self) -> &str {
        self.api_version().rsplit_once('/').map_or("", |(g, _)| g)
    }

    pub fn version(&self) -> &str {
        self.api_version().rsplit_once('/').map_or(self.api_version(), |(_, v)| v)
    }

    pub fn namespace(&self) -> Option<&str> {
        self.value["metadata"]["namespace"].as_str()
    }

    /// `KIND NAME (FILE)`, for messages.
    pub fn describe(&self) -> String {
        format!("{} {} ({})", self.kind(), self.name(), self.file.display())
    }
}

/// deploy/kubernetes/ of this repository.
pub fn root() -> PathBuf {
    super::repo().join("deploy/kubernetes")
}

/// kustomize's own file: what `kubectl apply -k` reads, not an object of the cluster.
pub const KUSTOMIZATION: &str = "kustomization.yaml";

/// Every `.yaml`/`.yml` file under `dir` but the kustomization, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = std::fs::read_dir(&d).unwrap_or_else(|e| panic!("cannot read {}: {e}", d.display()));
        for entry in entries {
            let path = entry.expect("directory entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "yaml" || x == "yml")
                && path.file_name().is_none_or(|n| n != KUSTOMIZATION)
            {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Every document of every manifest, after checking that the [`EXPECTED`] files are there;
/// a file that is no YAML, or a document without apiVersion, kind or name, fails the test.
pub fn documents() -> Vec<Doc> {
    let dir = root();
    assert!(dir.is_dir(), "the manifests folder {} is missing", dir.display());
    for f in EXPECTED {
        assert!(dir.join(f).is_file(), "manifest {f} is missing from {}", dir.display());
    }
    let mut docs = Vec::new();
    for file in yaml_files(&dir) {
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let values: Vec<Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{} is not YAML: {e}", file.display()));
        let rel = file.strip_prefix(&dir).unwrap_or(&file).to_path_buf();
        for value in values.into_iter().filter(|v| !v.is_null()) {
            let doc = Doc { file: rel.clone(), value };
            assert!(
                !doc.api_version().is_empty() && !doc.kind().is_empty() && !doc.name().is_empty(),
                "a document of {} lacks apiVersion, kind or metadata.name",
                rel.display()
            );
            docs.push(doc);
        }
    }
    docs
}

/// Every container spec (`containers` and `initContainers` items) anywhere inside `value`.
pub fn containers(value: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    walk(value, &mut |key, v| {
        if key == "containers" || key == "initContainers" {
            if let Some(items) = v.as_array() {
                out.extend(items.iter());
            }
            return true;
        }
        false
    });
    out
}

/// The pod templates anywhere inside `value`: objects under a `template` key with
/// `spec.containers`.
pub fn pod_templates(value: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    walk(value, &mut |key, v| {
        if key == "template" && v["spec"]["containers"].is_array() {
            out.push(v);
            return true;
        }
        false
    });
    out
}

/// Calls `visit` on every (key, value) pair below `value`; it returns true where it took the
/// value, which is then not descended into.
fn walk<'a>(value: &'a Value, visit: &mut dyn FnMut(&str, &'a Value) -> bool) {
    match value {
        Value::Object(map) => {
            for (key, v) in map {
                if !visit(key, v) {
                    walk(v, visit);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| walk(v, visit)),
        _ => {}
    }
}
