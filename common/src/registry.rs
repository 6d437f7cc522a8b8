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

/// Declares [`CheckId`], its names and [`CheckId::ALL`] from one list, so that a check is
/// added by one line here (and its descriptor module, named beside it).
macro_rules! check_ids {
    ($($(#[$doc:meta])* $id:ident = $name:literal => $module:ident,)+) => {
        /// Every check item, in run order; `GpuHealth` after every other selectable check (so
        /// its XID and counter window covers them), `PairBandwidth` last (the launcher adds it,
        /// nobody selects it).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum CheckId {
            $($(#[$doc])* $id,)+
        }

        impl CheckId {
            /// Every check, in run order.
            pub const ALL: [CheckId; [$(CheckId::$id),+].len()] = [$(CheckId::$id),+];

            /// The check's name, as users and report.json spell it.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(CheckId::$id => $name,)+
                }
            }
        }

        /// The descriptor modules, one per check, named in the same list.
        #[macro_export]
        #[doc(hidden)]
        macro_rules! __for_each_check {
            ($m:ident) => { $m! { $($id = $name => $module,)+ } };
        }
        pub use __for_each_check as for_each_check;
    };
}

check_ids! {
    Gemm = "gemm" => gemm,
    KernelLaunch = "kernel-launch" => kernel_launch,
    MemoryBandwidth = "memory-bandwidth" => memory_bandwidth,
    HostBandwidth = "host-bandwidth" => host_bandwidth,
    AllReduce = "all-reduce" => all_reduce,
    AllToAll = "all-to-all" => all_to_all,
    AllGather = "all-gather" => all_gather,
    ReduceScatter = "reduce-scatter" => reduce_scatter,
    MultiAllReduce = "multi-all-reduce" => multi_all_reduce,
    NetworkConnectivity = "network-connectivity" => network_connectivity,
    MatmulAllReduceOverlap = "matmul-all-reduce-overlap" => overlap,
    MiniGpt = "mini-gpt" => mini_gpt,
    MegatronGpt = "megatron-gpt" => megatron_gpt,
    Resnet = "resnet" => resnet,
    RdmaPorts = "rdma-ports" => rdma_ports,
    GpuHealth = "gpu-health" => gpu_health,
    PairBandwidth = "pair-bandwidth" => pair_bandwidth,
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

/// What a finding is about: a check, or the run around the checks (`Finding.check` in
/// report.json, spelled as the check's name or `run`, `rendezvous`, `agent`, `service`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    Check(CheckId),
    /// The launcher's run as a whole: a worker that never started, a run that timed out.
    Run,
    /// The nodes' rendezvous before any check (a node that never arrived).
    Rendezvous,
    /// The node's devices, judged by its launcher before any check (a GPU CUDA cannot use).
    Device,
    /// The node's agent (the service's coordinator lost it or it failed).
    Agent,
    /// The service's own supervision (the whole run's time overrun).
    Service,
}

impl Scope {
    const OTHERS: [(Scope, &'static str); 5] = [
        (Scope::Run, "run"),
        (Scope::Rendezvous, "rendezvous"),
        (Scope::Device, "device"),
        (Scope::Agent, "agent"),
        (Scope::Service, "service"),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Check(id) => id.as_str(),
            Scope::Run => "run",
            Scope::Rendezvous => "rendezvous",
            Scope::Device => "device",
            Scope::Agent => "agent",
            Scope::Service => "service",
        }
    }

    /// The check, when the finding is about one.
    pub fn check(self) -> Option<CheckId> {
        match self {
            Scope::Check(id) => Some(id),
            Scope::Run | Scope::Rendezvous | Scope::Device | Scope::Agent | Scope::Service => None,
        }
    }
}

impl From<CheckId> for Scope {
    fn from(id: CheckId) -> Scope {
        Scope::Check(id)
    }
}

impl FromStr for Scope {
    type Err = UnknownCheck;

    fn from_str(s: &str) -> Result<Scope, UnknownCheck> {
        match Scope::OTHERS.into_iter().find(|(_, n)| *n == s) {
            Some((scope, _)) => Ok(scope),
            None => s.parse().map(Scope::Check),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl PartialEq<CheckId> for Scope {
    fn eq(&self, other: &CheckId) -> bool {
        *self == Scope::Check(*other)
    }
}

impl Serialize for Scope {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Scope, D::Error> {
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
        for scope in CheckId::ALL.map(Scope::Check).into_iter().chain([
            Scope::Run,
            Scope::Rendezvous,
            Scope::Agent,
            Scope::Service,
        ]) {
            let json = serde_json::to_string(&scope).unwrap();
            assert_eq!(json, format!("\"{scope}\""));
            assert_eq!(serde_json::from_str::<Scope>(&json).unwrap(), scope);
        }
        assert_eq!(serde_json::to_string(&Scope::Check(CheckId::Gemm)).unwrap(), "\"gemm\"");
        assert!(serde_json::from_str::<Scope>("\"runn\"").is_err());
    }
}
