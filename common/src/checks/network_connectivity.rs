//! `network-connectivity`: front-end and back-end probes between every pair of nodes.

use super::{no_settling, CheckGroup, CheckId, ConfigAccess, Descriptor, Needs, WrongResult};
use crate::config::micro::ConnectivityConfig;

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::NetworkConnectivity,
    group: CheckGroup::Micro,
    description: "front-end and back-end reachability between every pair of nodes",
    available: true,
    listed: true,
    needs: Needs::TwoNodes,
    reference_estimate_s: 120,
    estimate_s: 1,
    params: ConnectivityConfig::KEYS,
    config: ConfigAccess {
        apply: |c, p| c.micro.network_connectivity.apply(p),
        settle: no_settling,
        to_value: |c| serde_json::to_value(&c.micro.network_connectivity).unwrap_or_default(),
    },
    metric: None,
    wrong_result: WrongResult::Own,
    columns: &[("front_failed", "front failed"), ("back_failed", "back failed")],
    charted: &[],
};
