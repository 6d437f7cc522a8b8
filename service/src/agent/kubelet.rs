//! A job's GPUs on this node from the kubelet (docs/kubernetes.md, "The job's GPUs from the
//! kubelet"): a task whose job event named no GPUs for this node waits while the agent asks the
//! Kubernetes API for the job's pods here (label `gpusanity.io/job-id`) and the kubelet's
//! PodResources socket for their GPUs; its launcher then runs on exactly those. The lookup runs
//! beside the agent's loop, which keeps beating and taking commands meanwhile.

use std::path::PathBuf;
use std::time::Duration;

use gpusanity_common::wire::agent::{NodeResult, Task};
use gpusanity_common::wire::gpu_id::{BadGpuId, GpuId};
use gpusanity_kube::podres::{self, PodResourcesError};
use gpusanity_kube::{ClientSettings, KubeError};
use thiserror::Error;

use super::Agent;
use crate::auth::rdzv;

/// Where and how the agent asks (`gpusanity agent --kubelet-pod-resources SOCKET`).
#[derive(Debug, Clone)]
pub struct KubeletGpus {
    /// The kubelet's PodResources socket.
    pub socket: PathBuf,
    /// The Kubernetes API (in-cluster by default).
    pub client: ClientSettings,
    /// The kubelet's answer's bound.
    pub timeout: Duration,
}

/// Why the job's GPUs could not be learnt: the agent then checks the whole node, as for a
/// job event without `gpu_ids`, and says why.
#[derive(Debug, Error)]
pub enum LookupError {
    #[error("the Kubernetes API: {0}")]
    Api(#[from] KubeError),
    #[error(transparent)]
    PodResources(#[from] PodResourcesError),
    #[error("the kubelet's device: {0}")]
    Device(#[from] BadGpuId),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// A lookup's answer, for the task it was made for.
pub(super) struct Looked {
    task: Task,
    secret: Option<[u8; rdzv::SECRET_LEN]>,
    gpus: Result<Vec<GpuId>, LookupError>,
}

/// The GPUs of job `job_id`'s pods on `node`, in the kubelet's order (empty: no pod of the job
/// is labelled here).
pub async fn job_gpus(k: &KubeletGpus, node: &str, job_id: &str) -> Result<Vec<GpuId>, LookupError> {
    // The API server's own calls are bounded by the client; the whole lookup by this too.
    let bound = k.timeout.saturating_add(Duration::from_secs(10));
    let ask = async {
        let client = k.client.client().await?;
        let ids = podres::job_gpus_on_node(&client, &k.socket, node, job_id, k.timeout).await?;
        Ok(ids.iter().map(|id| id.parse::<GpuId>()).collect::<Result<Vec<_>, _>>()?)
    };
    tokio::time::timeout(bound, ask).await.unwrap_or(Err(LookupError::Timeout(bound)))
}

impl Agent {
    /// Whether `t` waits for the kubelet: its event named no GPUs here and the agent runs beside
    /// a kubelet.
    pub(super) fn needs_lookup(&self, t: &Task) -> bool {
        t.gpu_ids.is_empty() && !t.job_id.is_empty() && self.cfg.kubelet.is_some()
    }

    /// Asks for `t`'s GPUs in the background; the answer comes back through `looked`.
    pub(super) fn look_up(&mut self, t: Task, secret: Option<[u8; rdzv::SECRET_LEN]>) {
        let Some(k) = self.cfg.kubelet.clone() else { return self.launch(t, secret) };
        self.looking_up.insert(t.run_id.clone(), t.node_rank);
        let (tx, node) = (self.looked.clone(), self.cfg.node.clone());
        tokio::spawn(async move {
            let gpus = job_gpus(&k, &node, &t.job_id).await;
            let _ = tx.send(Looked { task: t, secret, gpus });
        });
    }

    /// The kubelet answered for a task: it starts on the GPUs found, or on the whole node when
    /// none were or the lookup failed (said in the log); a task cancelled meanwhile ended then.
    pub(super) fn looked_up(&mut self, l: Looked) {
        let Looked { mut task, secret, gpus } = l;
        if self.looking_up.remove(&task.run_id).is_none() {
            return;
        }
        match gpus {
            Ok(ids) if !ids.is_empty() => {
                let shown: Vec<String> = ids.iter().map(ToString::to_string).collect();
                tracing::info!(
                    run_id = task.run_id,
                    job_id = task.job_id,
                    gpus = shown.join(","),
                    "the job's GPUs on this node, from the kubelet"
                );
                task.gpu_ids = ids;
            }
            Ok(_) => tracing::info!(
                run_id = task.run_id,
                job_id = task.job_id,
                "no pod of the job on this node carries {}: checking the whole node",
                podres::JOB_LABEL
            ),
            Err(e) => tracing::warn!(
                run_id = task.run_id,
                job_id = task.job_id,
                "the job's GPUs could not be learnt from the kubelet ({e}): checking the whole node"
            ),
        }
        self.launch(task, secret);
    }

    /// A cancel for a task still waiting for the kubelet: it ends now, before any launcher.
    pub(super) fn cancel_lookup(&mut self, run_id: &str) -> bool {
        let Some(node_rank) = self.looking_up.remove(run_id) else { return false };
        self.exited(NodeResult {
            run_id: run_id.to_string(),
            node_rank,
            exit_code: None,
            report: None,
            report_chunks: None,
            error: Some("cancelled while asking the kubelet for the job's GPUs".into()),
        });
        true
    }
}
