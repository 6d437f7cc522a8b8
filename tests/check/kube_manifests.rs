//! Every `gpusanity ...` command line of the Kubernetes manifests (deploy/kubernetes/) through
//! the real binary, with the environment its container would get: its literal values, the
//! downward API's fields and Secret values as stand-ins, `$(VAR)` expanded as the kubelet
//! does, its ConfigMaps written where they are mounted. `--help` would not do: clap stops at
//! it and never sees what follows. Instead each command runs until its first step that needs
//! the cluster (a Secret's file, the database): it must fail there with gpusanity's own error
//! (`gpusanity: error: ...`), not clap's (`error: unexpected argument ...`) and not on the
//! configuration file, which shows that every flag, value and configuration key was accepted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gpusanity_testkit::common::bin;
use gpusanity_testkit::manifests::{containers, documents, Doc};
use serde_json::Value;

/// What a Secret's key stands for here: long enough for every token rule, no URL, no file.
const SECRET_STAND_IN: &str = "0123456789abcdef0123456789abcdef";

/// One container whose command is `gpusanity`, ready to run.
struct Invocation {
    what: String,
    args: Vec<String>,
    env: BTreeMap<String, String>,
}

/// The downward API's fields, as a pod on a GPU node would see them.
fn field(path: &str) -> &'static str {
    match path {
        "spec.nodeName" => "gpu-node-017",
        "status.hostIP" | "status.podIP" => "10.20.0.17",
        "metadata.namespace" => "gpusanity",
        "metadata.annotations['batch.kubernetes.io/job-completion-index']" => "0",
        _ => "downward-value",
    }
}

/// `$(NAME)` replaced by the variable's value where it is defined, as the kubelet does.
fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = s.to_string();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

/// The ConfigMaps of the manifests by (namespace, name).
fn config_maps(docs: &[Doc]) -> BTreeMap<(String, String), Value> {
    docs.iter()
        .filter(|d| d.kind() == "ConfigMap")
        .map(|d| ((d.namespace().unwrap_or("default").to_string(), d.name().to_string()), d.value["data"].clone()))
        .collect()
}

/// Writes what `pod_spec`'s volumes put at the container's mount points under `dir`
/// (ConfigMaps: their files; emptyDirs: a folder; Secrets: nothing, they are the cluster's) and
/// returns the mount points to move there.
fn mounts(
    dir: &Path,
    doc: &Doc,
    pod_spec: &Value,
    container: &Value,
    maps: &BTreeMap<(String, String), Value>,
) -> Vec<(String, PathBuf)> {
    let ns = doc.namespace().unwrap_or("default").to_string();
    let volumes = pod_spec["volumes"].as_array().cloned().unwrap_or_default();
    let mut out = Vec::new();
    for m in container["volumeMounts"].as_array().into_iter().flatten() {
        let (Some(name), Some(path)) = (m["name"].as_str(), m["mountPath"].as_str()) else { continue };
        let local = dir.join(path.trim_start_matches('/'));
        let volume = volumes.iter().find(|v| v["name"] == name).unwrap_or_else(|| {
            panic!("{}: volume {name} of a mount is not in the pod", doc.describe());
        });
        if let Some(cm) = volume["configMap"]["name"].as_str() {
            std::fs::create_dir_all(&local).expect("mount folder");
            let data = maps.get(&(ns.clone(), cm.to_string())).unwrap_or_else(|| {
                panic!("{}: ConfigMap {cm} is not in deploy/kubernetes", doc.describe());
            });
            for (key, text) in data.as_object().into_iter().flatten() {
                std::fs::write(local.join(key), text.as_str().unwrap_or_default()).expect("ConfigMap file");
            }
        } else if volume.get("emptyDir").is_some() {
            std::fs::create_dir_all(&local).expect("mount folder");
        }
        out.push((path.to_string(), local));
    }
    // Longest mount point first, so that a nested one wins.
    out.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    out
}

/// `s` with a leading mount point moved under the test's folder.
fn relocate(s: &str, mounts: &[(String, PathBuf)]) -> String {
    for (path, local) in mounts {
        if let Some(rest) = s.strip_prefix(path.as_str()) {
            if rest.is_empty() || rest.starts_with('/') {
                return format!("{}{rest}", local.display());
            }
        }
    }
    s.to_string()
}

/// Every container of the manifests whose command is `gpusanity`.
fn invocations(dir: &Path) -> Vec<Invocation> {
    let docs = documents();
    let maps = config_maps(&docs);
    let mut out = Vec::new();
    for doc in &docs {
        for pod_spec in pod_specs(&doc.value) {
            for c in containers(pod_spec) {
                let words: Vec<String> = c["command"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .chain(c["args"].as_array().into_iter().flatten())
                    .map(|w| w.as_str().map(str::to_string).unwrap_or_else(|| w.to_string()))
                    .collect();
                if !words.first().is_some_and(|w| w == "gpusanity" || w.ends_with("/gpusanity")) {
                    continue;
                }
                let what = format!("{} container {}", doc.describe(), c["name"].as_str().unwrap_or("?"));
                let root = dir.join(out.len().to_string());
                let mounts = mounts(&root, doc, pod_spec, c, &maps);
                let mut env = BTreeMap::new();
                for e in c["env"].as_array().into_iter().flatten() {
                    let name = e["name"].as_str().expect("env name").to_string();
                    let value = if let Some(v) = e["value"].as_str() {
                        Some(expand(v, &env))
                    } else if let Some(p) = e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                        Some(field(p).to_string())
                    } else if e["valueFrom"]["secretKeyRef"]["optional"] == true {
                        None
                    } else if e["valueFrom"]["secretKeyRef"].is_object() {
                        Some(SECRET_STAND_IN.to_string())
                    } else {
                        panic!("{what}: env {name}: a source this test does not know");
                    };
                    if let Some(v) = value {
                        env.insert(name, relocate(&v, &mounts));
                    }
                }
                let args = words[1..].iter().map(|w| relocate(&expand(w, &env), &mounts)).collect();
                out.push(Invocation { what, args, env });
            }
        }
    }
    out
}

/// The pod specs inside `value`: a template's `spec`.
fn pod_specs(value: &Value) -> Vec<&Value> {
    gpusanity_testkit::manifests::pod_templates(value).into_iter().map(|t| &t["spec"]).collect()
}

/// Runs the binary with exactly `env` (and PATH) in `dir`; (exit code, stderr).
fn run(args: &[String], env: &BTreeMap<String, String>, dir: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(bin())
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", dir)
        .envs(env)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpusanity");
    let start = Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!("gpusanity {args:?} still ran after 60 s: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn every_gpusanity_command_line_in_the_manifests_is_accepted_by_the_real_cli() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The test tells clap's refusal from gpusanity's own: an unknown flag must read as clap's.
    let (code, stderr) = run(&["serve".into(), "--no-such-flag".into()], &BTreeMap::new(), dir.path());
    assert_eq!(code, Some(2));
    assert!(stderr.starts_with("error: unexpected argument '--no-such-flag'"), "{stderr}");

    let invocations = invocations(dir.path());
    let subcommands: BTreeSet<&str> = invocations.iter().filter_map(|i| i.args.first().map(String::as_str)).collect();
    for sub in ["serve", "agent", "check"] {
        assert!(subcommands.contains(sub), "no `gpusanity {sub}` in deploy/kubernetes: {subcommands:?}");
    }
    for inv in &invocations {
        let (code, stderr) = run(&inv.args, &inv.env, dir.path());
        let first = stderr.lines().find(|l| l.starts_with("gpusanity: error:") || l.starts_with("error:"));
        let first =
            first.unwrap_or_else(|| panic!("{}: gpusanity {:?} printed no error: {stderr}", inv.what, inv.args));
        assert!(first.starts_with("gpusanity: error:"), "{}: the command line was refused: {stderr}", inv.what);
        // It stopped at the cluster's part, not on the configuration file that was mounted.
        assert!(!first.contains("config "), "{}: the configuration was refused: {first}", inv.what);
        assert_eq!(code, Some(2), "{}: {stderr}", inv.what);
        eprintln!("{}: `gpusanity {}` stops at: {first}", inv.what, inv.args.join(" "));
    }
}
