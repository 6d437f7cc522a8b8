//! A client of `v1.PodResourcesLister/List` written by hand (what tonic-build would generate for
//! one unary method), on a Unix socket, and the selection of a job's pods and their devices.

use std::collections::HashSet;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use thiserror::Error;
use tokio::net::UnixStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Endpoint, Uri};
use tracing::debug;

use super::proto::{ListPodResourcesRequest, ListPodResourcesResponse};
use crate::names::{is_node_name, MAX_LABEL_VALUE};

/// Where the kubelet serves the PodResources API.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The extended resource of NVIDIA's device plugin.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The pod label naming the job a pod belongs to; its value is the job id of the job events.
pub const JOB_LABEL: &str = "gpusanity.io/job-id";
/// The most device ids [`list_devices`] returns; more is an error.
pub const MAX_DEVICES: usize = 1024;
/// The longest device id taken, in bytes.
pub const MAX_DEVICE_ID: usize = 256;
/// The largest answer decoded from the socket (a node's every pod and container).
pub const MAX_RESPONSE_BYTES: usize = 16 << 20;

const SERVICE: &str = "v1.PodResourcesLister";
const LIST_PATH: &str = "/v1.PodResourcesLister/List";
/// How much of a hostile value an error quotes, in characters.
const QUOTED: usize = 80;

/// A pod, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Error)]
pub enum PodResourcesError {
    #[error(
        "the kubelet's PodResources socket {} does not exist (is the host's /var/lib/kubelet/pod-resources mounted?)",
        .0.display()
    )]
    SocketMissing(PathBuf),
    #[error("the kubelet's PodResources socket {} cannot be reached: {reason}", path.display())]
    Unreachable { path: PathBuf, reason: String },
    #[error("the kubelet's PodResources socket {} did not answer within {after:?}", path.display())]
    Timeout { path: PathBuf, after: Duration },
    #[error("the kubelet answered PodResources List with {code:?}: {message}")]
    Status { code: tonic::Code, message: String },
    #[error(
        "job id {0:?} is not a Kubernetes label value (at most 63 of [A-Za-z0-9._-], starting and ending alphanumeric), so no pod can carry it as {JOB_LABEL}"
    )]
    BadJobId(String),
    #[error("{0:?} is not a Kubernetes Node name (lower-case letters, digits, `-`, `.`; at most 253)")]
    BadNodeName(String),
    #[error("listing the job's pods through the API server: {0}")]
    Kube(#[source] kube::Error),
    #[error("the kubelet lists more than {limit} devices of {resource} for the job's pods")]
    TooManyDevices { resource: String, limit: usize },
    #[error(
        "the kubelet lists a device id for pod {namespace}/{pod} that is not at most {MAX_DEVICE_ID} bytes of printable ASCII: {id:?}"
    )]
    BadDeviceId { namespace: String, pod: String, id: String },
}

/// The device ids of `resource` allocated to the containers of `pods`, in the kubelet's order (pod order as listed by the kubelet, containers in order, ids in order), without duplicates.
///
/// One `List` call on the kubelet's socket; connecting and the call together take at most
/// `timeout`. A pod the kubelet does not list contributes nothing.
pub async fn list_devices(
    socket: &Path,
    pods: &[PodRef],
    resource: &str,
    timeout: Duration,
) -> Result<Vec<String>, PodResourcesError> {
    let answer = tokio::time::timeout(timeout, list(socket))
        .await
        .map_err(|_| PodResourcesError::Timeout { path: socket.to_path_buf(), after: timeout })??;
    let devices = select_devices(&answer, pods, resource)?;
    debug!(socket = %socket.display(), pods = pods.len(), resource, devices = devices.len(), "kubelet PodResources");
    Ok(devices)
}

/// The pods of job `job_id` on node `node` (label JOB_LABEL=job_id, field spec.nodeName=node), any namespace, excluding pods that are Succeeded or Failed.
///
/// Needs `list` on `pods` cluster-wide. The order is the API server's (namespace, then name).
pub async fn job_pods_on_node(
    client: &kube::Client,
    node: &str,
    job_id: &str,
) -> Result<Vec<PodRef>, PodResourcesError> {
    if !is_node_name(node) {
        return Err(PodResourcesError::BadNodeName(quoted(node)));
    }
    if !is_label_value(job_id) {
        return Err(PodResourcesError::BadJobId(quoted(job_id)));
    }
    let params =
        ListParams::default().labels(&format!("{JOB_LABEL}={job_id}")).fields(&format!("spec.nodeName={node}"));
    let pods = Api::<Pod>::all(client.clone()).list(&params).await.map_err(PodResourcesError::Kube)?;
    let refs: Vec<PodRef> = pods
        .items
        .into_iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            !matches!(phase, Some("Succeeded" | "Failed"))
        })
        .filter_map(|p| Some(PodRef { namespace: p.metadata.namespace?, name: p.metadata.name? }))
        .collect();
    debug!(node, job_id, pods = refs.len(), "the job's pods on this node");
    Ok(refs)
}

/// Both: the GPUs (GPU_RESOURCE) of the job's pods on this node. Empty when the job has no pod here.
///
/// `timeout` bounds the kubelet's part; the API server's is the client's own (its connect and
/// read timeouts). The kubelet is not asked when the job has no pod on the node.
pub async fn job_gpus_on_node(
    client: &kube::Client,
    socket: &Path,
    node: &str,
    job_id: &str,
    timeout: Duration,
) -> Result<Vec<String>, PodResourcesError> {
    let pods = job_pods_on_node(client, node, job_id).await?;
    if pods.is_empty() {
        return Ok(Vec::new());
    }
    list_devices(socket, &pods, GPU_RESOURCE, timeout).await
}

/// Whether `v` is a Kubernetes label value that is not empty (at most 63 of `[A-Za-z0-9._-]`,
/// starting and ending alphanumeric).
pub fn is_label_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_LABEL_VALUE
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The start of a value from outside, for an error message (which prints it escaped).
fn quoted(s: &str) -> String {
    s.chars().take(QUOTED).collect()
}

/// One `List` call: the kubelet's answer, or why there is none.
async fn list(socket: &Path) -> Result<ListPodResourcesResponse, PodResourcesError> {
    let unreachable = |e: &dyn std::fmt::Display| PodResourcesError::Unreachable {
        path: socket.to_path_buf(),
        reason: e.to_string(),
    };
    // Connected here rather than in the connector, so that a missing socket is told apart
    // from one nobody listens on (or the agent may not open).
    let stream = UnixStream::connect(socket).await.map_err(|e| match e.kind() {
        io::ErrorKind::NotFound => PodResourcesError::SocketMissing(socket.to_path_buf()),
        _ => unreachable(&e),
    })?;
    let mut stream = Some(stream);
    // The URI names no host that is resolved: the connector hands over the connected socket
    // (once; a reconnection fails).
    let channel = Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let s = stream.take();
            async move {
                s.map(TokioIo::new).ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "connected once already"))
            }
        }))
        .await
        .map_err(|e| unreachable(&e))?;
    let mut grpc = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_RESPONSE_BYTES);
    grpc.ready().await.map_err(|e| unreachable(&e))?;
    let mut request = tonic::Request::new(ListPodResourcesRequest {});
    request.extensions_mut().insert(tonic::GrpcMethod::new(SERVICE, "List"));
    let codec = tonic_prost::ProstCodec::<ListPodResourcesRequest, ListPodResourcesResponse>::default();
    let response = grpc
        .unary(request, PathAndQuery::from_static(LIST_PATH), codec)
        .await
        .map_err(|s| PodResourcesError::Status { code: s.code(), message: quoted(s.message()) })?;
    Ok(response.into_inner())
}

/// The ids of `resource` of the containers of `pods` in `answer`, in its order, each once;
/// each id checked, at most [`MAX_DEVICES`].
pub(crate) fn select_devices(
    answer: &ListPodResourcesResponse,
    pods: &[PodRef],
    resource: &str,
) -> Result<Vec<String>, PodResourcesError> {
    let wanted: HashSet<(&str, &str)> = pods.iter().map(|p| (p.namespace.as_str(), p.name.as_str())).collect();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for pod in &answer.pod_resources {
        if !wanted.contains(&(pod.namespace.as_str(), pod.name.as_str())) {
            continue;
        }
        let devices = pod.containers.iter().flat_map(|c| &c.devices).filter(|d| d.resource_name == resource);
        for id in devices.flat_map(|d| &d.device_ids) {
            if !is_device_id(id) {
                return Err(PodResourcesError::BadDeviceId {
                    namespace: quoted(&pod.namespace),
                    pod: quoted(&pod.name),
                    id: quoted(id),
                });
            }
            if !seen.insert(id.as_str()) {
                continue;
            }
            if out.len() >= MAX_DEVICES {
                return Err(PodResourcesError::TooManyDevices { resource: quoted(resource), limit: MAX_DEVICES });
            }
            out.push(id.clone());
        }
    }
    Ok(out)
}

/// A device id as gpusanity takes it: 1 to [`MAX_DEVICE_ID`] bytes of printable ASCII, no
/// spaces (`GPU-<uuid>`, `MIG-<uuid>`, an index).
fn is_device_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_DEVICE_ID && id.bytes().all(|b| b.is_ascii_graphic())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podres::proto::{ContainerDevices, ContainerResources, PodResources};

    fn pod(ns: &str, name: &str, containers: &[&[(&str, &[&str])]]) -> PodResources {
        PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: containers
                .iter()
                .enumerate()
                .map(|(i, devices)| ContainerResources {
                    name: format!("c{i}"),
                    devices: devices
                        .iter()
                        .map(|(r, ids)| ContainerDevices {
                            resource_name: r.to_string(),
                            device_ids: ids.iter().map(|s| s.to_string()).collect(),
                            topology: None,
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn r(ns: &str, name: &str) -> PodRef {
        PodRef { namespace: ns.into(), name: name.into() }
    }

    #[test]
    fn the_pods_devices_in_the_kubelets_order_each_once() {
        let answer = ListPodResourcesResponse {
            pod_resources: vec![
                pod("a", "w1", &[&[(GPU_RESOURCE, &["GPU-3", "GPU-1"])], &[("rdma/ib", &["mlx5_0"])]]),
                pod("a", "other", &[&[(GPU_RESOURCE, &["GPU-0"])]]),
                pod("b", "w1", &[&[(GPU_RESOURCE, &["GPU-2", "GPU-3"])]]),
            ],
        };
        let got = select_devices(&answer, &[r("b", "w1"), r("a", "w1"), r("a", "absent")], GPU_RESOURCE);
        assert_eq!(got.expect("devices"), ["GPU-3", "GPU-1", "GPU-2"]);
        assert!(select_devices(&answer, &[], GPU_RESOURCE).expect("none").is_empty());
    }

    #[test]
    fn hostile_ids_and_too_many_are_errors() {
        for bad in ["", "GPU 1", "GPU-\n1", "GPU-é", &"x".repeat(MAX_DEVICE_ID + 1)] {
            let answer = ListPodResourcesResponse { pod_resources: vec![pod("a", "p", &[&[(GPU_RESOURCE, &[bad])]])] };
            let e = select_devices(&answer, &[r("a", "p")], GPU_RESOURCE).expect_err(bad);
            assert!(matches!(&e, PodResourcesError::BadDeviceId { pod, .. } if pod == "p"), "{e:?}");
        }
        let ok = "x".repeat(MAX_DEVICE_ID);
        let answer = ListPodResourcesResponse { pod_resources: vec![pod("a", "p", &[&[(GPU_RESOURCE, &[&ok])]])] };
        assert_eq!(select_devices(&answer, &[r("a", "p")], GPU_RESOURCE).expect("ok"), [ok]);

        let ids: Vec<String> = (0..=MAX_DEVICES).map(|i| format!("GPU-{i}")).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let answer = ListPodResourcesResponse { pod_resources: vec![pod("a", "p", &[&[(GPU_RESOURCE, &ids)]])] };
        let e = select_devices(&answer, &[r("a", "p")], GPU_RESOURCE).expect_err("too many");
        assert!(matches!(e, PodResourcesError::TooManyDevices { limit: MAX_DEVICES, .. }), "{e:?}");
        // Exactly the limit, and repetitions of it, pass.
        let mut ids = ids[..MAX_DEVICES].to_vec();
        ids.extend_from_slice(&ids.clone());
        let answer = ListPodResourcesResponse { pod_resources: vec![pod("a", "p", &[&[(GPU_RESOURCE, &ids)]])] };
        assert_eq!(select_devices(&answer, &[r("a", "p")], GPU_RESOURCE).expect("limit").len(), MAX_DEVICES);
    }

    #[test]
    fn job_ids_are_label_values() {
        for ok in ["job-1", "a", "J.o_b-9", &"x".repeat(63)] {
            assert!(is_label_value(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "a b", "a,b", "a=b", "a\nb", "é", &"x".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }
}
