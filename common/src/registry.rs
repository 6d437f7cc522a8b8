//! The registry of check items: every item of the specification, whether this build runs it,
//! its group, what it finds and the brief's own duration estimate for two machines.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckGroup {
    /// Selected with `--micro-benchmarks`.
    Micro,
    /// Selected with `--model-benchmarks`.
    Model,
}

impl fmt::Display for CheckGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckGroup::Micro => "micro",
            CheckGroup::Model => "model",
        })
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct CheckInfo {
    pub name: &'static str,
    pub group: CheckGroup,
    /// What a failure of this check finds.
    pub description: &'static str,
    /// Whether this build of gpusanity runs it.
    pub available: bool,
    /// The brief's estimate for 2 machines, in seconds.
    pub brief_estimate_s: u32,
    /// Our own estimate on 2 H200 GPUs with the default configuration, in seconds.
    pub estimate_s: u32,
}

const fn check(
    name: &'static str,
    group: CheckGroup,
    description: &'static str,
    available: bool,
    brief_estimate_s: u32,
    estimate_s: u32,
) -> CheckInfo {
    CheckInfo { name, group, description, available, brief_estimate_s, estimate_s }
}

use CheckGroup::{Micro, Model};

/// Every check item of the specification, in run order.
pub const CHECKS: &[CheckInfo] = &[
    check("gemm", Micro, "faulty GPU (error, hang, wrong result); slow GPU (low TFLOPS)", true, 60, 1),
    check("kernel-launch", Micro, "launch errors/hangs; slow launch latency", true, 60, 1),
    check("all-reduce", Micro, "communication errors/hangs; low bus bandwidth", true, 300, 5),
    check("all-to-all", Micro, "communication errors/hangs; low bus bandwidth (all-to-all)", true, 300, 5),
    check("all-gather", Micro, "communication errors/hangs; low bus bandwidth (all-gather)", true, 300, 5),
    check("multi-all-reduce", Micro, "concurrent all-reduces per rail and per node: a bad rail or NIC", true, 300, 4),
    check(
        "network-connectivity",
        Micro,
        "front-end and back-end reachability between every pair of nodes",
        true,
        120,
        1,
    ),
    check(
        "matmul-all-reduce-overlap",
        Micro,
        "errors/hangs or slow steps with GEMM and all-reduce at once",
        true,
        60,
        2,
    ),
    check("mini-gpt", Model, "training loss abnormal, hang, error; slow step", true, 60, 7),
    check("megatron-gpt", Model, "the same for a tensor+data-parallel GPT", true, 300, 14),
    check("resnet", Model, "the same for ResNet training", true, 120, 4),
];

pub fn find(name: &str) -> Option<&'static CheckInfo> {
    CHECKS.iter().find(|c| c.name == name)
}

pub fn names(group: CheckGroup) -> Vec<&'static str> {
    CHECKS.iter().filter(|c| c.group == group).map(|c| c.name).collect()
}
