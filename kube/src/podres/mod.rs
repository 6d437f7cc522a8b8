//! The GPUs a job's pods got on this node, from the kubelet's PodResources API.
//!
//! A job event may name no GPUs for a node. The agent beside the kubelet then finds the job's
//! pods on its node through the API server (label [`JOB_LABEL`] = the job id, field
//! `spec.nodeName` = the node) and asks the kubelet which devices of [`GPU_RESOURCE`] the
//! device plugin allocated to their containers: gRPC `v1.PodResourcesLister/List` on the Unix
//! socket [`DEFAULT_SOCKET`] (the one dcgm-exporter reads). What the socket answers is input
//! too: at most [`MAX_DEVICES`] ids, each at most [`MAX_DEVICE_ID`] bytes of printable ASCII.

mod client;
pub mod proto;

pub use client::*;
/// The gRPC status code of a [`PodResourcesError::Status`].
pub use tonic::Code;
