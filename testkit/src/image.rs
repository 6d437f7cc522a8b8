//! The gpusanity image as CI builds it (`scripts/image.sh build`), run with podman the way this
//! machine runs containers: Debian's runc, the cgroupfs manager and the containers.conf the
//! script writes (no default ulimits). `.ci/run` names the image in GPUSANITY_TEST_IMAGE and
//! the configuration in GPUSANITY_TEST_CONTAINERS_CONF; without them the tests skip
//! ([`Prereq::Image`](crate::skip::Prereq::Image)).

use std::path::Path;
use std::process::{Command, Output};

use crate::skip::{or_skip, Prereq};

/// The variable naming the image under test.
pub const IMAGE_ENV: &str = "GPUSANITY_TEST_IMAGE";
/// The variable naming podman's containers.conf for this machine.
pub const CONF_ENV: &str = "GPUSANITY_TEST_CONTAINERS_CONF";
/// The user the image runs as (the manifests' runAsUser).
pub const USER: u32 = 65532;

/// The image under test, or the skip (a failure where `image` is required).
pub fn image_or_skip() -> Option<String> {
    built_or_skip(IMAGE_ENV, "image (scripts/image.sh build)")
}

/// What the variable `var` names, which `.ci/run` sets from scripts/image.sh (`what` says
/// which command makes it), or the skip (a failure where `image` is required).
pub fn built_or_skip(var: &str, what: &str) -> Option<String> {
    or_skip(
        Prereq::Image,
        std::env::var(var).ok().filter(|v| !v.is_empty()).ok_or_else(|| format!("{var} is unset: no {what} was built")),
    )
}

/// `podman` with this machine's settings.
pub fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]);
    if let Some(conf) = std::env::var_os(CONF_ENV) {
        c.env("CONTAINERS_CONF", conf);
    }
    c
}

/// `podman ARGS` with this machine's settings, not yet run.
pub fn podman_with<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Command {
    let mut c = podman();
    c.args(args);
    c
}

/// Runs podman with `args` to its end; panics with its output when it cannot start.
pub fn podman_output(args: &[&str]) -> Output {
    podman_with(args).output().unwrap_or_else(|e| panic!("podman {args:?}: {e}"))
}

/// The arguments of `podman run` for a container named `name` as the manifests run one: the
/// image's own user (65532), a read-only root file system, a memory-backed /tmp and /dev/shm,
/// the host's network (as the agent DaemonSet's hostNetwork), `mounts` bound read-write at
/// the same paths, and `env` set inside. The image's entrypoint is `gpusanity`: the caller
/// appends its arguments after the image.
pub fn run_args(image: &str, name: &str, mounts: &[&Path], env: &[(&str, &str)]) -> Vec<String> {
    let mut a: Vec<String> = ["run", "--rm", "--name", name, "--network", "host", "--read-only", "--shm-size", "512m"]
        .map(String::from)
        .to_vec();
    a.extend(["--tmpfs".to_string(), "/tmp:rw,size=512m,mode=1777".to_string()]);
    for m in mounts {
        a.extend(["--volume".to_string(), format!("{0}:{0}", m.display())]);
    }
    for (k, v) in env {
        a.extend(["--env".to_string(), format!("{k}={v}")]);
    }
    a.push(image.to_string());
    a
}

/// Removes the containers `names` (and their processes) whatever their state.
pub fn remove(names: &[String]) {
    if names.is_empty() {
        return;
    }
    let mut c = podman();
    c.args(["rm", "--force", "--ignore", "--time", "0"]).args(names);
    let _ = c.output();
}

/// Gives the tree under `dir` to the image's user, so that a container of it can write there.
pub fn give_to_image_user(dir: &Path) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        std::os::unix::fs::chown(&p, Some(USER), Some(USER)).unwrap_or_else(|e| panic!("chown {}: {e}", p.display()));
        if p.is_dir() {
            for entry in std::fs::read_dir(&p).expect("read_dir").flatten() {
                stack.push(entry.path());
            }
        }
    }
}

/// A one-node Kubernetes cluster of a test's own (scripts/kubelet.sh): etcd, the API server, the
/// scheduler and controller manager, containerd and a kubelet, on loopback; stopped (every
/// container, process, mount and cgroup of it) when dropped. Images come from podman's store
/// (`podman save`, then the node's containerd imports them): no registry is reachable.
pub struct KubeNode {
    dir: tempfile::TempDir,
    /// The admin kubeconfig.
    pub kubeconfig: std::path::PathBuf,
    /// The Node's name.
    pub node: String,
}

impl KubeNode {
    /// Starts the cluster, or the skip (a failure where `kubernetes` is required) when this
    /// machine cannot run it.
    pub fn start_or_skip() -> Option<KubeNode> {
        or_skip(Prereq::Kubernetes, KubeNode::start())
    }

    fn start() -> Result<KubeNode, String> {
        // /proc/self belongs to the process's effective user.
        let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").map_err(|e| e.to_string())?);
        if uid != 0 {
            return Err("a kubelet and containerd need root".into());
        }
        for tool in ["containerd", "kubectl"] {
            if Command::new(tool).arg("--version").output().is_err() {
                return Err(format!("{tool} is missing"));
            }
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let out = KubeNode::script(dir.path(), &["start"]).output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(&format!("{k}="))).map(str::to_string);
        match (out.status.success(), field("KUBECONFIG"), field("NODE")) {
            (true, Some(kubeconfig), Some(node)) => Ok(KubeNode { dir, kubeconfig: kubeconfig.into(), node }),
            _ => Err(format!("scripts/kubelet.sh start failed: {text}{}", String::from_utf8_lossy(&out.stderr))),
        }
    }

    fn script(dir: &Path, args: &[&str]) -> Command {
        let mut c = Command::new("bash");
        c.arg(crate::repo().join("scripts/kubelet.sh"))
            .args(args)
            .env("TMPDIR", dir)
            .env("KUBELET_STATE", dir.join("kubelet.state"))
            .env("KUBE_STATE", dir.join("kube.state"));
        c
    }

    /// Imports `image` from podman's store into the node's containerd.
    pub fn load(&self, image: &str) {
        let archive = self.dir.path().join("image.tar");
        let archive_s = archive.display().to_string();
        let _ = std::fs::remove_file(&archive);
        let out = podman_output(&["save", "--quiet", "--format", "oci-archive", "-o", &archive_s, image]);
        assert!(out.status.success(), "podman save {image}: {out:?}");
        let out = KubeNode::script(self.dir.path(), &["load", &archive_s]).output().expect("kubelet.sh load");
        assert!(out.status.success(), "kubelet.sh load {image}: {out:?}");
        let _ = std::fs::remove_file(&archive);
    }

    /// `kubectl ARGS` against the node's cluster.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("kubectl {args:?}: {e}"))
    }

    /// `kubectl ARGS`, which must succeed; its standard output.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The kubelet's and containerd's logs, for a failure's message.
    pub fn logs(&self) -> String {
        let mut s = String::new();
        for f in walk(self.dir.path()).into_iter().filter(|p| p.extension().is_some_and(|e| e == "log")) {
            let text = std::fs::read_to_string(&f).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(15).collect();
            s += &format!("--- {}\n{}\n", f.display(), tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
        s
    }
}

impl Drop for KubeNode {
    fn drop(&mut self) {
        let _ = KubeNode::script(self.dir.path(), &["stop"]).output();
    }
}

/// The files under `dir` and one folder down (the script's folder in the temp dir).
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let entries = |d: &Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(d).map(|r| r.flatten().map(|e| e.path()).collect()).unwrap_or_default()
    };
    let mut files = Vec::new();
    for p in entries(dir) {
        if p.is_dir() {
            files.extend(entries(&p).into_iter().filter(|f| f.is_file()));
        } else {
            files.push(p);
        }
    }
    files
}
