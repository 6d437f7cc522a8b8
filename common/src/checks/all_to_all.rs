//! `all-to-all`: a sweep of message sizes, verified, with the bus bandwidth of each.

use super::{sweep_descriptor, CheckId, ConfigAccess, Descriptor, SweepCodes};
use crate::findings::Code;

pub const DESCRIPTOR: Descriptor = sweep_descriptor(
    CheckId::AllToAll,
    "communication errors/hangs; low bus bandwidth (all-to-all)",
    ConfigAccess {
        apply: |c, p| c.micro.all_to_all.apply(p),
        settle: |c| c.micro.all_to_all.validate(CheckId::AllToAll.as_str()),
        to_value: |c| c.micro.all_to_all.to_value(),
    },
    SweepCodes { slow: Code::AlltoallSlow, below: Code::AlltoallBelowExpected, wrong: Code::AlltoallWrongResult },
);
