//! `reduce-scatter`: a sweep of message sizes, verified, with the bus bandwidth of each
//! (nccl-tests' fifth collective).

use super::{sweep_descriptor, CheckId, ConfigAccess, Descriptor, SweepCodes};
use crate::findings::Code;

pub const DESCRIPTOR: Descriptor = sweep_descriptor(
    CheckId::ReduceScatter,
    "communication errors/hangs; low bus bandwidth (reduce-scatter)",
    ConfigAccess {
        apply: |c, p| c.micro.reduce_scatter.apply(p),
        settle: |c| c.micro.reduce_scatter.validate(CheckId::ReduceScatter.as_str()),
        to_value: |c| c.micro.reduce_scatter.to_value(),
    },
    SweepCodes { slow: Code::ReducescatterSlow, below: Code::ReducescatterBelowExpected, wrong: Code::ReducescatterWrongResult },
);
