//! This test binary's Kubernetes API server: the one GPUSANITY_TEST_KUBECONFIG names (with
//! GPUSANITY_TEST_KUBE_LIMITED_TOKEN, the token of user `gpusanity-isolation`), else one
//! started by scripts/kube-apiserver.sh (built once from the Go module proxy and cached) and
//! stopped when the binary exits. Without Go and without a cached build, the tests skip
//! (counted; a failure where GPUSANITY_REQUIRE lists `kubernetes`).

use std::path::PathBuf;
use std::sync::OnceLock;

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
        let cached = std::env::var_os("HOME")
            .map(|h| PathBuf::from(h).join(".cache/gpusanity/kube-1.35.4/kube-apiserver"))
            .is_some_and(|p| p.exists());
        let go = std::process::Command::new("go").arg("version").output().is_ok_and(|o| o.status.success());
        if !cached && !go {
            return Err("no cached kube-apiserver build and no `go` to build one (scripts/kube-apiserver.sh)".into());
        }
        let (text, _state) = start_script_state("kube-apiserver.sh", "KUBE_STATE", &[])?;
        let field = |k: &str| script_value(&text, k).ok_or_else(|| format!("no {k} line in: {text}"));
        Ok(KubeServer {
            kubeconfig: field("KUBECONFIG=")?.into(),
            limited_token: field("KUBE_LIMITED_TOKEN_FILE=")?.into(),
        })
    });
    or_skip(Prereq::Kubernetes, r.as_ref().map_err(Clone::clone))
}
