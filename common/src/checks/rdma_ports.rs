//! `rdma-ports`: every RDMA port of every node, its state, rate and error counters.

use super::{CheckGroup, CheckId, Code, ConfigAccess, Descriptor, Needs, WrongResult, no_settling};
use crate::config::bandwidth::RdmaPortsConfig;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `rdma_ports` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = RdmaPortsConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    RdmaPortsConfig::defaults(device)
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::RdmaPorts,
    group: CheckGroup::Micro,
    description: "RDMA ports down, slow, flapping or counting errors",
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 10,
    estimate_s: 1,
    params: RdmaPortsConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.rdma_ports.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.rdma_ports).unwrap_or_default(),
    },
    memory: None,
    metric: None,
    // Its findings are named in the diagnosis of the micro-benchmarks, one per port.
    wrong_result: WrongResult::Own,
    columns: &[("ports", "ports"), ("ports_down", "down"), ("ports_slow", "slow"), ("ports_flapped", "flapped")],
    charted: &[],
};

/// The finding codes of the check, placed on the node.
pub const PORT_DOWN: Code = Code::RdmaPortDown;
pub const RATE_LOW: Code = Code::RdmaPortRateLow;
pub const FLAPPED: Code = Code::RdmaPortFlapped;
pub const ERRORS: Code = Code::RdmaPortErrors;

check_codes! {
    RdmaPortDown = "RDMA_PORT_DOWN", Critical, "critical", [Check(CheckId::RdmaPorts)], "node",
        "an RDMA port is not ACTIVE / LinkUp (or disappeared during the span); the message names device, port and both states",
        "check the cable, transceiver, switch port and subnet manager; exclude the node";
    RdmaPortRateLow = "RDMA_PORT_RATE_LOW", Critical, "critical", [Check(CheckId::RdmaPorts)], "node",
        "an active port's rate is below `rdma-ports.expected-rate-gbps`, or else below the fastest port of the same link layer on the node",
        "reseat or replace the cable or transceiver; check the switch port's speed";
    RdmaPortFlapped = "RDMA_PORT_FLAPPED", Critical, "critical", [Check(CheckId::RdmaPorts)], "node",
        "`link_downed` or `link_error_recovery` grew during the span (since the worker started; `evidence` has the deltas): the link went down or retrained",
        "replace the cable or transceiver; exclude the node";
    RdmaPortErrors = "RDMA_PORT_ERRORS", Warning, "warning", [Check(CheckId::RdmaPorts)], "node",
        "`symbol_error`, `port_rcv_errors` or `excessive_buffer_overrun_errors` grew during the span on a link that stayed up",
        "watch the port (a marginal cable or transceiver)";
}
