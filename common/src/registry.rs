//! The names of the check items: [`CheckId`], spelled as in `--micro-benchmarks`,
//! `--model-benchmarks`, `--check-param` and report.json, and the group each is selected in.
//! Everything else about a check is in its descriptor ([`crate::checks`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

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
        f.pad(match self {
            CheckGroup::Micro => "micro",
            CheckGroup::Model => "model",
        })
    }
}

/// Every check item, in run order; `GpuHealth` after every other selectable check (so its
/// XID and counter window covers them), `PairBandwidth` last (the launcher adds it, nobody
/// selects it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CheckId {
    Gemm,
    KernelLaunch,
    MemoryBandwidth,
    HostBandwidth,
    AllReduce,
    AllToAll,
    AllGather,
    MultiAllReduce,
    NetworkConnectivity,
    MatmulAllReduceOverlap,
    MiniGpt,
    MegatronGpt,
    Resnet,
    RdmaPorts,
    GpuHealth,
    PairBandwidth,
}

impl CheckId {
    pub const ALL: [CheckId; 16] = [
        CheckId::Gemm,
        CheckId::KernelLaunch,
        CheckId::MemoryBandwidth,
        CheckId::HostBandwidth,
        CheckId::AllReduce,
        CheckId::AllToAll,
        CheckId::AllGather,
        CheckId::MultiAllReduce,
        CheckId::NetworkConnectivity,
        CheckId::MatmulAllReduceOverlap,
        CheckId::MiniGpt,
        CheckId::MegatronGpt,
        CheckId::Resnet,
        CheckId::RdmaPorts,
        CheckId::GpuHealth,
        CheckId::PairBandwidth,
    ];

    /// The check's name, as users and report.json spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            CheckId::Gemm => "gemm",
            CheckId::KernelLaunch => "kernel-launch",
            CheckId::MemoryBandwidth => "memory-bandwidth",
            CheckId::HostBandwidth => "host-bandwidth",
            CheckId::AllReduce => "all-reduce",
            CheckId::AllToAll => "all-to-all",
            CheckId::AllGather => "all-gather",
            CheckId::MultiAllReduce => "multi-all-reduce",
            CheckId::NetworkConnectivity => "network-connectivity",
            CheckId::MatmulAllReduceOverlap => "matmul-all-reduce-overlap",
            CheckId::MiniGpt => "mini-gpt",
            CheckId::MegatronGpt => "megatron-gpt",
            CheckId::Resnet => "resnet",
            CheckId::GpuHealth => "gpu-health",
            CheckId::RdmaPorts => "rdma-ports",
            CheckId::PairBandwidth => "pair-bandwidth",
        }
    }
}

/// A name that is no check's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown check `{0}`")]
pub struct UnknownCheck(pub String);

impl FromStr for CheckId {
    type Err = UnknownCheck;

    fn from_str(s: &str) -> Result<CheckId, UnknownCheck> {
        CheckId::ALL.into_iter().find(|c| c.as_str() == s).ok_or_else(|| UnknownCheck(s.to_string()))
    }
}

impl fmt::Display for CheckId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl From<CheckId> for String {
    fn from(id: CheckId) -> String {
        id.as_str().to_string()
    }
}

impl PartialEq<str> for CheckId {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<CheckId> for str {
    fn eq(&self, other: &CheckId) -> bool {
        self == other.as_str()
    }
}

impl PartialEq<CheckId> for String {
    fn eq(&self, other: &CheckId) -> bool {
        self == other.as_str()
    }
}

impl Serialize for CheckId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for CheckId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<CheckId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_as_strings() {
        for id in CheckId::ALL {
            assert_eq!(id.as_str().parse::<CheckId>(), Ok(id));
            assert_eq!(serde_json::to_string(&id).unwrap(), format!("\"{id}\""));
            assert_eq!(serde_json::from_str::<CheckId>(&format!("\"{id}\"")).unwrap(), id);
        }
        assert_eq!(serde_json::to_string(&CheckId::MatmulAllReduceOverlap).unwrap(), "\"matmul-all-reduce-overlap\"");
        assert!("gemmm".parse::<CheckId>().is_err());
    }
}
