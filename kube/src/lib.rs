//! Kubernetes as gpusanity's isolation backend. A failed verdict isolates a Node through the
//! API server: cordon (`spec.unschedulable`), a `gpusanity.io/faulty` taint whose value is the
//! finding code, a `gpusanity.io/isolated` label, a `GpusanityFaulty` condition (reason = the
//! code, message = the finding, sanitised and bounded) and a core/v1 Event on the Node. The
//! annotation `gpusanity.io/isolation` records exactly what gpusanity added (was the node
//! already cordoned? did it add the taint, the label?), so that a later passing check returns
//! the node by removing only that: a node someone else cordoned stays cordoned, and other taints
//! are never touched.
//!
//! Writes to the Node are JSON merge patches carrying the `resourceVersion` read: a concurrent
//! writer makes the API server answer 409 Conflict, and the change is recomputed on a fresh
//! read (bounded retries). Re-isolating an isolated node changes nothing. Used by the service's
//! isolation backend (`service/src/isolation/kubernetes.rs`) and by `gpusanity check --k8s-isolate`.
//!
//! [`podres`]: the GPUs a job's pods got on a node, from the kubelet's PodResources API.

mod names;
mod node;
pub mod podres;
mod record;

pub use names::*;
pub use node::{Effect, Isolator, Outcome};
pub use record::Record;

use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum KubeError {
    #[error("`{0}` is not a Kubernetes Node name (lower-case letters, digits, `-`, `.`; at most 253)")]
    BadNodeName(String),
    #[error("no Node named `{0}` in the cluster")]
    NoSuchNode(String),
    #[error("the API server refused {what} on Node `{node}` ({code}): {message}")]
    Refused { what: &'static str, node: String, code: u16, message: String },
    #[error("Node `{node}` kept changing under {tries} attempts to {what} it (409 Conflict)")]
    Conflicts { what: &'static str, node: String, tries: u32 },
    #[error("the API server cannot be reached: {0}")]
    Unreachable(String),
    #[error("the Kubernetes client configuration: {0}")]
    Config(String),
    #[error("the annotation {ANNOTATION_KEY} on Node `{node}` is not gpusanity's record: {why}")]
    BadRecord { node: String, why: String },
}

impl KubeError {
    /// Whether waiting may help (the API server down or overloaded) as opposed to a refusal.
    pub fn is_transient(&self) -> bool {
        match self {
            KubeError::Unreachable(_) | KubeError::Conflicts { .. } => true,
            KubeError::Refused { code, .. } => *code == 429 || *code >= 500,
            _ => false,
        }
    }
}

/// How to reach the API server: a kubeconfig file, or an explicit URL (with a CA file), or,
/// with neither, the usual inference (`$KUBECONFIG`, `~/.kube/config`, then the in-cluster
/// service account). `token_file` replaces the user's credentials with a bearer token file.
#[derive(Debug, Clone, Default, serde::Deserialize, serde::Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ClientSettings {
    #[serde(default)]
    pub kubeconfig: Option<PathBuf>,
    #[serde(default)]
    pub api_server: Option<String>,
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    #[serde(default)]
    pub token_file: Option<PathBuf>,
}

impl ClientSettings {
    /// A client for these settings. Installs rustls' `ring` provider first (the client panics
    /// without a process-wide provider).
    pub async fn client(&self) -> Result<kube::Client, KubeError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let cfg = |e: &dyn std::fmt::Display| KubeError::Config(e.to_string());
        let mut config = if let Some(url) = &self.api_server {
            let mut c = kube::Config::new(url.parse().map_err(|e| cfg(&e))?);
            c.root_cert_file = self.ca_file.clone();
            c
        } else if let Some(path) = &self.kubeconfig {
            let file = kube::config::Kubeconfig::read_from(path).map_err(|e| cfg(&e))?;
            kube::Config::from_custom_kubeconfig(file, &Default::default()).await.map_err(|e| cfg(&e))?
        } else {
            kube::Config::infer().await.map_err(|e| cfg(&e))?
        };
        if let Some(token) = &self.token_file {
            config.auth_info.token = None;
            config.auth_info.token_file = Some(token.display().to_string());
        }
        config.connect_timeout = Some(std::time::Duration::from_secs(5));
        config.read_timeout = Some(std::time::Duration::from_secs(20));
        kube::Client::try_from(config).map_err(|e| cfg(&e))
    }
}
