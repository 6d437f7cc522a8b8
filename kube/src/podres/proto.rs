//! The messages of the kubelet's PodResources API, v1, as the kubelet publishes them in
//! `staging/src/k8s.io/kubelet/pkg/apis/podresources/v1/api.proto` of kubernetes/kubernetes
//! (module `k8s.io/kubelet`, `package v1`, service `PodResourcesLister`); the field numbers
//! below are that file's.
//!
//! Written by hand rather than generated: generating them needs `protoc` at build time, for
//! five small messages that the kubelet keeps compatible (proto3: fields are only ever added).
//! `DynamicResource` (field 5 of `ContainerResources`, devices given by DRA) is left out: prost
//! skips the fields a message does not declare, and gpusanity reads device-plugin devices only.

/// `message ListPodResourcesRequest {}`
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct ListPodResourcesRequest {}

/// `message ListPodResourcesResponse`: the pods of the node and what each was given.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ListPodResourcesResponse {
    #[prost(message, repeated, tag = "1")]
    pub pod_resources: Vec<PodResources>,
}

/// `message PodResources`: one pod.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PodResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub namespace: String,
    #[prost(message, repeated, tag = "3")]
    pub containers: Vec<ContainerResources>,
}

/// `message ContainerResources`: one container of a pod.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerResources {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub devices: Vec<ContainerDevices>,
    #[prost(int64, repeated, tag = "3")]
    pub cpu_ids: Vec<i64>,
    #[prost(message, repeated, tag = "4")]
    pub memory: Vec<ContainerMemory>,
}

/// `message ContainerDevices`: the devices of one extended resource (`nvidia.com/gpu`) that a
/// device plugin allocated to a container.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerDevices {
    #[prost(string, tag = "1")]
    pub resource_name: String,
    #[prost(string, repeated, tag = "2")]
    pub device_ids: Vec<String>,
    #[prost(message, optional, tag = "3")]
    pub topology: Option<TopologyInfo>,
}

/// `message TopologyInfo`
#[derive(Clone, PartialEq, prost::Message)]
pub struct TopologyInfo {
    #[prost(message, repeated, tag = "1")]
    pub nodes: Vec<NumaNode>,
}

/// `message NUMANode { int64 ID = 1; }`
#[derive(Clone, Copy, PartialEq, prost::Message)]
pub struct NumaNode {
    #[prost(int64, tag = "1")]
    pub id: i64,
}

/// `message ContainerMemory`: memory and hugepages of a container (memory manager).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ContainerMemory {
    #[prost(string, tag = "1")]
    pub memory_type: String,
    #[prost(uint64, tag = "2")]
    pub size: u64,
    #[prost(message, optional, tag = "3")]
    pub topology: Option<TopologyInfo>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Bytes a kubelet would send, written field by field from api.proto's numbers (tag =
    /// number << 3 | wire type), including a field 5 (`dynamic_resources`) this crate does not
    /// declare.
    #[test]
    fn the_wire_format_is_the_kubelets() {
        let mut device = vec![0x0a, 14];
        device.extend(b"nvidia.com/gpu");
        device.extend([0x12, 5]);
        device.extend(b"GPU-a");
        device.extend([0x1a, 4, 0x0a, 2, 0x08, 1]); // topology { nodes { ID: 1 } }
        let mut container = vec![0x0a, 1, b'c'];
        container.push(0x12);
        container.push(device.len() as u8);
        container.extend(&device);
        container.extend([0x1a, 2, 3, 4]); // cpu_ids [3, 4], packed
        container.extend([0x2a, 3, 0x12, 1, b'x']); // dynamic_resources { claim_name: "x" }
        let mut pod = vec![0x0a, 1, b'p', 0x12, 2, b'n', b's', 0x1a];
        pod.push(container.len() as u8);
        pod.extend(&container);
        let mut bytes = vec![0x0a, pod.len() as u8];
        bytes.extend(&pod);

        let resp = ListPodResourcesResponse::decode(bytes.as_slice()).expect("decodes");
        let p = &resp.pod_resources[0];
        assert_eq!((p.name.as_str(), p.namespace.as_str()), ("p", "ns"));
        let c = &p.containers[0];
        assert_eq!(c.name, "c");
        assert_eq!(c.cpu_ids, [3, 4]);
        assert_eq!(c.devices[0].resource_name, "nvidia.com/gpu");
        assert_eq!(c.devices[0].device_ids, ["GPU-a"]);
        assert_eq!(c.devices[0].topology, Some(TopologyInfo { nodes: vec![NumaNode { id: 1 }] }));
        let again = ListPodResourcesResponse::decode(resp.encode_to_vec().as_slice()).expect("round trip");
        assert_eq!(again, resp);
    }
}
