//! `rdma-ports`: every RDMA port of every node, its state, rate and error counters.

use crate::findings::Code;
use super::{no_settling, CheckGroup, CheckId, ConfigAccess, Descriptor, Needs, WrongResult};
use crate::config::bandwidth::RdmaPortsConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::RdmaPorts,
    group: CheckGroup::Micro,
    description: "RDMA ports down, slow, flapping or counting errors",
    available: true,
    listed: true,
    needs: Needs::Nothing,
    reference_estimate_s: 10,
    estimate_s: 1,
    params: RdmaPortsConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.micro.rdma_ports.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.micro.rdma_ports).unwrap_or_default(),
    },
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
