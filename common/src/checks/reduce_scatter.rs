//! `reduce-scatter`: a sweep of message sizes, verified, with the bus bandwidth of each
//! (nccl-tests' fifth collective).

use super::{CheckId, Code, ConfigAccess, Descriptor, SweepCodes, sweep_descriptor};
use crate::config::buffers;
use crate::config::sweep::SweepConfig;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `reduce_scatter` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = SweepConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    SweepConfig::defaults(device)
}

pub const DESCRIPTOR: Descriptor = sweep_descriptor(
    CheckId::ReduceScatter,
    "communication errors/hangs; low bus bandwidth (reduce-scatter)",
    ConfigAccess {
        apply: |c, p| c.reduce_scatter.apply(p),
        settle: |c| c.reduce_scatter.validate(CheckId::ReduceScatter.as_str()),
        to_value: |c| c.reduce_scatter.to_value(),
    },
    |c, device| buffers::collective(c.reduce_scatter.max_bytes, device),
    SweepCodes { slow: Code::ReducescatterSlow, below: Code::ReducescatterBelowExpected, wrong: Code::ReducescatterWrongResult },
);

check_codes! {
    ReducescatterWrongResult = "REDUCESCATTER_WRONG_RESULT", Critical, "critical", [Check(CheckId::ReduceScatter)], "rank",
        "this rank's block of the sum differs from the exact one",
        "exclude the node";
    ReducescatterSlow = "REDUCESCATTER_SLOW", Critical, "critical / warning", [Check(CheckId::ReduceScatter)], "rank",
        "busbw below the peers' band",
        "inspect the interconnect";
    ReducescatterBelowExpected = "REDUCESCATTER_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::ReduceScatter)], "job",
        "busbw below the expected band of its device model (where the data file has one)",
        "inspect NVLink/NIC state, NCCL settings";
}
