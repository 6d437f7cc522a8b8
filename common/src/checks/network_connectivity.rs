//! `network-connectivity`: front-end and back-end probes between every pair of nodes.

use super::{no_settling, CheckGroup, CheckId, ConfigAccess, Descriptor, Needs, WrongResult};
use crate::config::micro::ConnectivityConfig;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `network_connectivity` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = ConnectivityConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    match device {
        DeviceKind::Cuda => ConnectivityConfig { timeout_ms: 5000, bytes: 1 << 20, full_matrix_nodes: 16 },
        DeviceKind::Cpu => ConnectivityConfig { timeout_ms: 2000, bytes: 64 << 10, full_matrix_nodes: 16 },
    }
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::NetworkConnectivity,
    group: CheckGroup::Micro,
    description: "front-end and back-end reachability between every pair of nodes",
    listed: true,
    needs: Needs::TwoNodes,
    reference_estimate_s: 120,
    estimate_s: 1,
    params: ConnectivityConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.network_connectivity.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.network_connectivity).unwrap_or_default(),
    },
    memory: None,
    metric: None,
    wrong_result: WrongResult::Own,
    columns: &[("front_failed", "front failed"), ("back_failed", "back failed")],
    charted: &[],
};

check_codes! {
    NetFrontendUnreachable = "NET_FRONTEND_UNREACHABLE", Critical, "critical", [Check(CheckId::NetworkConnectivity)], "node",
        "no other node reaches this node's host network (TCP)",
        "check the node's front-end link, firewall, address";
    NetFrontendPairFailed = "NET_FRONTEND_PAIR_FAILED", Critical, "critical", [Check(CheckId::NetworkConnectivity)], "pair",
        "one node pair fails on the host network while both ends reach others",
        "inspect the path between the two nodes";
    NetBackendRankUnreachable = "NET_BACKEND_RANK_UNREACHABLE", Critical, "critical", [Check(CheckId::NetworkConnectivity)], "rank",
        "every back-end probe (NCCL send/recv, or the CPU transport) with this rank failed or timed out",
        "exclude the node; inspect its GPU network";
    NetBackendPairFailed = "NET_BACKEND_PAIR_FAILED", Critical, "critical", [Check(CheckId::NetworkConnectivity)], "pair",
        "one rank pair fails on the back end while both ends reach others (or the pair cannot be split, two ranks)",
        "inspect the path between the two";
    NetIbPortNotActive = "NET_IB_PORT_NOT_ACTIVE", Warning, "warning", [Check(CheckId::NetworkConnectivity)], "node",
        "an RDMA port under /sys/class/infiniband is not ACTIVE",
        "check the port, cable and subnet manager";
}
