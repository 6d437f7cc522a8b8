//! `pair-bandwidth`: the pairwise link test, slow node or slow link. Nobody selects it: the
//! launcher adds it to CPU runs of three nodes or more with a communication check.

use super::{CheckGroup, CheckId, Code, ConfigAccess, Descriptor, Needs, WrongResult, no_settling};
use crate::kinds::DeviceKind;

/// The configuration of a check that has none (the launcher sizes the link test).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NoConfig;

/// This check's configuration, the field `pair_bandwidth` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = NoConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    let _ = device;
    NoConfig
}

pub const DESCRIPTOR: Descriptor = Descriptor {
    id: CheckId::PairBandwidth,
    group: CheckGroup::Micro,
    description: "the bandwidth of node pairs: a slow node or a slow link",
    listed: false,
    needs: Needs::TwoNodes,
    reference_estimate_s: 0,
    estimate_s: 1,
    params: &[],
    config: ConfigAccess { apply: |_, _| Ok(false), settle: no_settling, to_value: |_| serde_json::Value::Null },
    memory: None,
    // Judged by the link diagnosis from the pairs' figures, not per rank.
    metric: None,
    wrong_result: WrongResult::Code(Code::LinkWrongResult),
    columns: &[("rounds", "rounds"), ("pairs", "pairs"), ("busbw_gbps_min", "slowest GB/s")],
    charted: &[],
};

check_codes! {
    NodeCommSlow = "NODE_COMM_SLOW", Critical, "critical", [Check(CheckId::PairBandwidth)], "node",
        "every measured pair with this node is below 30% of the best pair",
        "exclude the node; inspect its NIC, cable, switch port";
    LinkSlow = "LINK_SLOW", Critical, "critical (warning when unresolved)", [Check(CheckId::PairBandwidth)], "pair",
        "one node pair is slow while both nodes are fast with others (critical), or the figures cannot tell which end is slow (warning)",
        "inspect the path between the two nodes";
    LinkWrongResult = "LINK_WRONG_RESULT", Critical, "critical", [Check(CheckId::PairBandwidth)], "rank",
        "the link test's reduced values are wrong",
        "exclude the node";
}
