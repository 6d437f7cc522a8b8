//! `all-gather`: a sweep of message sizes, verified, with the bus bandwidth of each.

use super::{sweep_descriptor, CheckId, ConfigAccess, Descriptor, SweepCodes};
use crate::findings::Code;

pub const DESCRIPTOR: Descriptor = sweep_descriptor(
    CheckId::AllGather,
    "communication errors/hangs; low bus bandwidth (all-gather)",
    ConfigAccess {
        apply: |c, p| c.micro.all_gather.apply(p),
        settle: |c| c.micro.all_gather.validate(CheckId::AllGather.as_str()),
        to_value: |c| c.micro.all_gather.to_value(),
    },
    SweepCodes { slow: Code::AllgatherSlow, below: Code::AllgatherBelowExpected, wrong: Code::AllgatherWrongResult },
);
