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
    or_skip(
        Prereq::Image,
        std::env::var(IMAGE_ENV)
            .ok()
            .filter(|i| !i.is_empty())
            .ok_or_else(|| format!("{IMAGE_ENV} is unset: no image was built (scripts/image.sh build)")),
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

/// Runs podman with `args` to its end; panics with its output when it cannot start.
pub fn podman_output(args: &[&str]) -> Output {
    podman().args(args).output().unwrap_or_else(|e| panic!("podman {args:?}: {e}"))
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
