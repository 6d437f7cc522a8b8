//! `all-to-all`: a sweep of message sizes, verified, with the bus bandwidth of each.

use super::{CheckId, Code, ConfigAccess, Descriptor, SweepCodes, sweep_descriptor};
use crate::config::buffers;
use crate::config::sweep::SweepConfig;
use crate::kinds::DeviceKind;

/// This check's configuration, the field `all_to_all` of [`CheckConfigs`](super::CheckConfigs).
pub type Config = SweepConfig;

/// Its defaults per backend.
pub fn defaults(device: DeviceKind) -> Config {
    SweepConfig::defaults(device)
}

pub const DESCRIPTOR: Descriptor = sweep_descriptor(
    CheckId::AllToAll,
    "communication errors/hangs; low bus bandwidth (all-to-all)",
    ConfigAccess {
        apply: |c, p| c.all_to_all.apply(p),
        settle: |c| c.all_to_all.validate(CheckId::AllToAll.as_str()),
        to_value: |c| c.all_to_all.to_value(),
    },
    |c, device| buffers::collective(c.all_to_all.max_bytes, device),
    SweepCodes { slow: Code::AlltoallSlow, below: Code::AlltoallBelowExpected, wrong: Code::AlltoallWrongResult },
);

check_codes! {
    AlltoallWrongResult = "ALLTOALL_WRONG_RESULT", Critical, "critical", [Check(CheckId::AllToAll)], "rank",
        "a received block differs from what its sender sent to this rank",
        "exclude the node";
    AlltoallSlow = "ALLTOALL_SLOW", Critical, "critical / warning", [Check(CheckId::AllToAll)], "rank",
        "busbw below the peers' band",
        "inspect the interconnect";
    AlltoallBelowExpected = "ALLTOALL_BELOW_EXPECTED", Critical, "critical / warning", [Check(CheckId::AllToAll)], "job",
        "busbw below the expected band of its device model (where the data file has one)",
        "inspect NVLink/NIC state, NCCL settings";
}
