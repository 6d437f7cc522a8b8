//! `all-gather`: a sweep of message sizes, verified, with the bus bandwidth of each.

use super::{CheckId, Code, ConfigAccess, Descriptor, SweepCodes, sweep_descriptor};
use crate::config::buffers;
use crate::config::sweep::SweepConfig;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `all_gather` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = SweepConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    SweepConfig::defaults(device)
}

pub const DESCRIPTOR: Descriptor = sweep_descriptor(
    CheckId::AllGather,
    "communication errors/hangs; low bus bandwidth (all-gather)",
    ConfigAccess {
        apply: |c, p| c.all_gather.apply(p),
        settle: |c| c.all_gather.validate(CheckId::AllGather.as_str()),
        to_value: |c| c.all_gather.to_value(),
    },
    |c, device| buffers::collective(c.all_gather.max_bytes, device),
    SweepCodes { slow: Code::AllgatherSlow, below: Code::AllgatherBelowExpected, wrong: Code::AllgatherWrongResult },
);

check_codes! {
    AllgatherWrongResult = "ALLGATHER_WRONG_RESULT", Critical, "critical", [Check(CheckId::AllGather)], "rank",
        "a gathered block differs from what its sender holds (value, sender or offset)",
        "exclude the node";
    AllgatherSlow = "ALLGATHER_SLOW", Critical, "critical / warning", [Check(CheckId::AllGather)], "rank",
        "busbw below the peers' band",
        "inspect the interconnect";
    AllgatherBelowExpected = "ALLGATHER_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::AllGather)], "job",
        "busbw below the expected band of its device model (where the data file has one)",
        "inspect NVLink/NIC state, NCCL settings";
}
