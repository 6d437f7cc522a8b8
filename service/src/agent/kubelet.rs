//! A job's GPUs on this node from the kubelet (docs/kubernetes.md, "The job's GPUs from the
//! kubelet"): a task whose job event named no GPUs for this node waits while the agent asks the
//! Kubernetes API for the job's pods here (label `gpusanity.io/job-id`) and the kubelet's
//! PodResources socket for their GPUs; its launcher then runs on exactly those. The lookup runs
//! beside the agent's loop, which keeps beating and taking commands meanwhile. The watch of such
//! a job (docs/watch.md) samples the same GPUs: those its check learnt, or, when the agent did
//! not check the run (it restarted since), those a lookup of its own finds.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::Duration;

use gpusanity_common::wire::agent::{NodeResult, Task};
use gpusanity_common::wire::gpu_id::{BadGpuId, GpuId};
use gpusanity_common::wire::watch::WatchTask;
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

/// What a lookup was made for.
pub(super) enum Asked {
    Check {
        task: Box<Task>,
        secret: Option<[u8; rdzv::SECRET_LEN]>,
    },
    /// The watch of this run of this job, waiting in `watch_lookups`.
    Watch {
        job_id: String,
        run_id: String,
    },
}

/// A lookup's answer, for what it was made for.
pub(super) struct Looked {
    asked: Asked,
    gpus: Result<Vec<GpuId>, LookupError>,
}

/// The most runs whose GPUs [`Learnt`] remembers.
const LEARNT_RUNS: usize = 64;

/// The GPUs the kubelet gave recent runs' jobs here (empty: no pod of the job on this node, so
/// the whole node), by run id, the oldest forgotten first: the watch that follows a run's check
/// samples what the check ran on without asking the kubelet again.
#[derive(Debug, Default)]
pub(super) struct Learnt(VecDeque<(String, Vec<GpuId>)>);

impl Learnt {
    fn remember(&mut self, run_id: &str, ids: &[GpuId]) {
        self.0.retain(|(r, _)| r != run_id);
        if self.0.len() >= LEARNT_RUNS {
            self.0.pop_front();
        }
        self.0.push_back((run_id.to_string(), ids.to_vec()));
    }

    fn of(&self, run_id: &str) -> Option<&[GpuId]> {
        self.0.iter().find(|(r, _)| r == run_id).map(|(_, ids)| ids.as_slice())
    }
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
        if self.cfg.kubelet.is_none() {
            return self.launch(t, secret);
        }
        self.looking_up.insert(t.run_id.clone(), t.node_rank);
        let job_id = t.job_id.clone();
        self.ask(&job_id, Asked::Check { task: Box::new(t), secret });
    }

    fn ask(&self, job_id: &str, asked: Asked) {
        let Some(k) = self.cfg.kubelet.clone() else { return };
        let (tx, node, job_id) = (self.looked.clone(), self.cfg.node.clone(), job_id.to_string());
        tokio::spawn(async move {
            let gpus = job_gpus(&k, &node, &job_id).await;
            let _ = tx.send(Looked { asked, gpus });
        });
    }

    /// The kubelet answered.
    pub(super) fn looked_up(&mut self, l: Looked) {
        match l.asked {
            Asked::Check { task, secret } => self.check_looked_up(*task, secret, l.gpus),
            Asked::Watch { job_id, run_id } => self.watch_looked_up(&job_id, &run_id, l.gpus),
        }
    }

    /// A task's answer: it starts on the GPUs found, or on the whole node when none were or the
    /// lookup failed (said in the log); a task cancelled meanwhile ended then.
    fn check_looked_up(
        &mut self,
        mut task: Task,
        secret: Option<[u8; rdzv::SECRET_LEN]>,
        gpus: Result<Vec<GpuId>, LookupError>,
    ) {
        if self.looking_up.remove(&task.run_id).is_none() {
            return;
        }
        if let Ok(ids) = &gpus {
            self.learnt.remember(&task.run_id, ids);
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

    /// A watch: of the job's GPUs here when its event named none and the agent runs beside a
    /// kubelet (those the run's check learnt, or a lookup's), else as the service asked. A
    /// renewal of a running watch, or of one waiting for the kubelet, only extends its lease.
    pub(super) fn watch(&mut self, mut w: WatchTask) {
        if !self.needs_watch_lookup(&w) {
            return self.watches.watch(w);
        }
        if let Some(ids) = self.learnt.of(&w.run_id) {
            w.gpu_ids = ids.to_vec();
            return self.watches.watch(w);
        }
        if let Some(waiting) = self.watch_lookups.get_mut(&w.job_id) {
            if waiting.run_id == w.run_id {
                waiting.until = waiting.until.max(w.until);
                return;
            }
        }
        let asked = Asked::Watch { job_id: w.job_id.clone(), run_id: w.run_id.clone() };
        self.ask(&w.job_id, asked);
        self.watch_lookups.insert(w.job_id.clone(), w);
    }

    /// Whether the kubelet must be asked for `w`'s GPUs: not for a watch that names them, is
    /// refused, renews a running one or is of a run already unwatched.
    fn needs_watch_lookup(&self, w: &WatchTask) -> bool {
        w.gpu_ids.is_empty()
            && self.cfg.kubelet.is_some()
            && w.validate().is_ok()
            && !self.watches.renews(w)
            && !self.watches.was_unwatched(w)
    }

    /// Stops a watch of the run (any run of the job when `run_id` is empty), or forgets one
    /// still waiting for the kubelet.
    pub(super) fn unwatch(&mut self, job_id: &str, run_id: &str) {
        if self.watch_lookups.get(job_id).is_some_and(|w| run_id.is_empty() || w.run_id == run_id) {
            self.watch_lookups.remove(job_id);
        }
        self.watches.unwatch(job_id, run_id);
    }

    /// A watch's answer: it samples the GPUs found, or the whole node (said why); one stopped or
    /// replaced meanwhile is dropped.
    fn watch_looked_up(&mut self, job_id: &str, run_id: &str, gpus: Result<Vec<GpuId>, LookupError>) {
        if self.watch_lookups.get(job_id).is_none_or(|w| w.run_id != run_id) {
            return;
        }
        let Some(mut w) = self.watch_lookups.remove(job_id) else { return };
        match gpus {
            Ok(ids) => {
                if ids.is_empty() {
                    tracing::info!(
                        job_id = w.job_id,
                        "no pod of the job on this node carries {}: watching the whole node",
                        podres::JOB_LABEL
                    );
                }
                self.learnt.remember(&w.run_id, &ids);
                w.gpu_ids = ids;
            }
            Err(e) => tracing::warn!(
                job_id = w.job_id,
                "the job's GPUs could not be learnt from the kubelet ({e}): watching the whole node"
            ),
        }
        self.watches.watch(w);
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
