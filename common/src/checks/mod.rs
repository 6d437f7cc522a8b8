//! One descriptor per check: everything the rest of gpusanity knows about a check item,
//! in one place per check (one file each), looked up by [`CheckId`]:
//!
//! - what it finds, its group, whether this build runs it, its estimated durations;
//! - its configuration (`Config`, a field of [`CheckConfigs`]) and its defaults per backend
//!   (`defaults`), its `--check-param` fields and how they apply to it, and its configuration as
//!   reported;
//! - its headline metric (judged against the peers and the expected figures), its
//!   wrong-result code, its report columns.
//!
//! `gpusanity list`, `--check-param` parsing, the report's configuration per check, the
//! workers' re-measure, the diagnosis and the report tables all read these descriptors.
//!
//! The descriptors stand above the configurations' types ([`crate::config`]) and the words of
//! the findings table ([`crate::findings::doc`], `findings/codes.rs`), which know
//! nothing of them. What is gathered from every descriptor module is declared here, beside
//! them: [`CheckConfigs`] (each check's `Config`) and [`Code`] (each check's `check_codes!`);
//! `config::CheckConfigs` and `findings::Code` name the same types.

mod params;

/// Declares a check's own finding codes in its descriptor module: entries of
/// the `finding_codes!` list of [`crate::findings::doc`] (code, worst severity, the severities as
/// the docs state them, what raises it, where it is placed, what it means, what to do). It
/// defines the module's `codes!`, through which [`Code`] gathers them (`gather_codes!`), in run
/// order.
macro_rules! check_codes {
    // `$d` is a `$` for the macro this one writes (macro_rules has no escape for it).
    (@with_dollar ($d:tt) $($entries:tt)*) => {
        macro_rules! codes {
            ($d then:ident [$d ($d gathered:tt)*] $d ($d rest:ident)*) => {
                $d then! { [$d ($d gathered)* $($entries)*] $d ($d rest)* }
            };
        }
        pub(crate) use codes;
    };
    ($($entries:tt)*) => {
        check_codes! { @with_dollar ($) $($entries)* }
    };
}

/// Gathers the codes of every check's descriptor module (`$module`s, each one's `codes!` from
/// `check_codes!`) after those in `[...]`, then declares [`Code`] from them all.
macro_rules! gather_codes {
    ([$($gathered:tt)*]) => {
        crate::findings::doc::finding_codes! { $($gathered)* }
    };
    ([$($gathered:tt)*] $module:ident $($rest:ident)*) => {
        $module::codes! { gather_codes [$($gathered)*] $($rest)* }
    };
}

/// One descriptor module per check, named in [`crate::registry`]'s list of checks, and what is
/// gathered from them all: [`CheckConfigs`], one field per check, named after its descriptor
/// module, of the type that module names `Config`, with that module's `defaults`, spelled by
/// the check's name in JSON (`"all-reduce": {...}`); and [`Code`], the codes that are no one
/// check's (`findings/codes.rs`), then every check's own, in run order.
macro_rules! descriptor_modules {
    ($($id:ident = $name:literal => $module:ident,)+) => {
        $(pub mod $module;)+

        impl CheckId {
            /// This check's descriptor.
            pub fn descriptor(self) -> &'static Descriptor {
                match self {
                    $(CheckId::$id => &$module::DESCRIPTOR,)+
                }
            }
        }

        /// The configuration of every check, for one run, and the diagnosis's own settings.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        pub struct CheckConfigs {
            $(
                #[serde(rename = $name)]
                pub $module: $module::Config,
            )+
            /// A rank whose figure is below this fraction of its peers' median is named slow.
            pub slow_fraction: f64,
            /// Seconds without progress on any rank of a node (or without a heartbeat from one)
            /// after which the running test is stopped as hung, well before its per-test limit.
            #[serde(default = "crate::config::diagnosis::default_stall_s")]
            pub stall_s: u64,
        }

        impl CheckConfigs {
            pub fn defaults(device: DeviceKind) -> Self {
                CheckConfigs {
                    $($module: $module::defaults(device),)+
                    slow_fraction: match device {
                        DeviceKind::Cuda => 0.8,
                        DeviceKind::Cpu => 0.5,
                    },
                    stall_s: DEFAULT_STALL_S,
                }
            }
        }

        crate::findings::codes::general_codes! { gather_codes [] $($module)+ }
    };
}
crate::registry::for_each_check!(descriptor_modules);

use serde::{Deserialize, Serialize};

use crate::config::buffers::Need;
use crate::config::diagnosis::{DEFAULT_STALL_S, DIAGNOSIS_PARAM_KEYS};
use crate::config::param::{Param, ParamError};
use crate::config::sweep::SweepConfig;
use crate::kinds::DeviceKind;
pub use crate::registry::{CheckGroup, CheckId, UnknownCheck};

/// A report column: the metric key and its title.
pub type Column = (&'static str, &'static str);

/// Which side of a headline figure is bad. Every headline figure today is a throughput, and
/// the peer and expected-figure judging ([`crate::peers`]) is written for `Low`; a check whose
/// high figures are bad needs a `High` variant and that judging for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Bad {
    /// A low figure is bad (a throughput: TFLOP/s, GB/s, steps per second).
    Low,
}

/// A headline figure that the peers and the expected values judge.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Metric {
    pub key: &'static str,
    pub unit: &'static str,
    /// Code for a rank below its peers.
    pub slow: Code,
    /// Code for a figure below the expected value of the device model.
    pub below: Code,
    pub bad: Bad,
    /// Every rank measures the same collective operation: one figure for the job.
    pub collective: bool,
}

/// The topology a check needs to measure anything. Where it is not met the check reports
/// `not_applicable` with the reason, at no cost, rather than a figure that means nothing (the
/// bus bandwidth of one rank is 0 by definition) or a "passed" that measured nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Needs {
    /// Any topology, one rank included.
    Nothing,
    /// Two ranks or more: a collective among one rank moves no data.
    TwoRanks,
    /// Two nodes or more: it probes between nodes.
    TwoNodes,
}

impl Needs {
    /// Why a run of `world` ranks on `nodes` nodes cannot run the check, if it cannot.
    pub fn unmet(self, world: usize, nodes: usize) -> Option<String> {
        match self {
            Needs::Nothing => None,
            Needs::TwoRanks if world < 2 => {
                Some("one rank: a collective needs two or more ranks to move any data".into())
            }
            Needs::TwoNodes if nodes < 2 => Some(format!(
                "one node ({world} rank{}): nothing to probe between nodes",
                if world == 1 { "" } else { "s" }
            )),
            Needs::TwoRanks | Needs::TwoNodes => None,
        }
    }
}

/// What a rank that failed the check's own verification means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WrongResult {
    /// A wrong result, under this code.
    Code(Code),
    /// The check names its own failures (a failed probe or a diverging loss is not a wrong
    /// product); the diagnosis of its family reports them.
    Own,
}

/// How a check's configuration is read and overridden, inside [`CheckConfigs`].
#[derive(Clone, Copy)]
pub struct ConfigAccess {
    /// Applies one `--check-param` of this check (`param.field` is the part after `NAME.`);
    /// `Ok(false)` for a field it does not have.
    pub apply: fn(&mut CheckConfigs, &Param<'_>) -> Result<bool, ParamError>,
    /// Checks the configuration once every override is applied, and settles derived values.
    pub settle: fn(&mut CheckConfigs) -> Result<(), ParamError>,
    /// The configuration the check runs with, as the report shows it.
    pub to_value: fn(&CheckConfigs) -> serde_json::Value,
}

/// Bytes one rank needs for a check under a configuration, on a backend.
pub type MemoryNeed = fn(&CheckConfigs, DeviceKind) -> Need;

fn no_settling(_: &mut CheckConfigs) -> Result<(), ParamError> {
    Ok(())
}

/// Everything about one check item.
#[derive(Clone, Copy, Serialize)]
pub struct Descriptor {
    #[serde(rename = "name")]
    pub id: CheckId,
    pub group: CheckGroup,
    /// What a failure of this check finds.
    pub description: &'static str,
    /// Whether users select it (`gpusanity list` shows it); the link test is added by the
    /// launcher instead.
    #[serde(skip)]
    pub listed: bool,
    /// The topology it needs to measure anything.
    pub needs: Needs,
    /// The duration the product's specification estimates for it on 2 machines, in seconds
    /// (GEMM 1 min, each collective 5 min, ...): the yardstick `estimate_s` is measured against.
    pub reference_estimate_s: u32,
    /// Our own estimate on 2 H200 GPUs with the default configuration, in seconds.
    pub estimate_s: u32,
    /// The `--check-param` fields (`NAME.FIELD=VALUE`).
    pub params: &'static [&'static str],
    #[serde(skip)]
    pub config: ConfigAccess,
    /// What it allocates per rank at its largest size under a configuration, so that a size
    /// that cannot fit is refused before any worker starts ([`crate::config::memory`]); `None`:
    /// not estimated (nothing sized by the configuration, or a model's activations).
    #[serde(skip)]
    pub memory: Option<MemoryNeed>,
    /// The headline figure, if the check has one.
    pub metric: Option<Metric>,
    pub wrong_result: WrongResult,
    /// The headline metrics shown in the report's tables, with their column titles.
    pub columns: &'static [Column],
    /// The per-rank figures drawn as bar charts, a subset of `columns` (counts and losses are
    /// left to the tables).
    pub charted: &'static [Column],
}

impl CheckId {
    /// The configuration this check runs with, as the report shows it.
    pub fn config_value(self, configs: &CheckConfigs) -> serde_json::Value {
        (self.descriptor().config.to_value)(configs)
    }

    pub fn metric(self) -> Option<&'static Metric> {
        self.descriptor().metric.as_ref()
    }

    pub fn group(self) -> CheckGroup {
        self.descriptor().group
    }
}

/// Every descriptor, in run order.
pub fn all() -> impl Iterator<Item = &'static Descriptor> {
    CheckId::ALL.into_iter().map(CheckId::descriptor)
}

/// The checks users select, in run order (what `gpusanity list` shows).
pub fn listed() -> impl Iterator<Item = &'static Descriptor> {
    all().filter(|d| d.listed)
}

/// The names of the selectable checks of `group`.
pub fn names(group: CheckGroup) -> Vec<&'static str> {
    listed().filter(|d| d.group == group).map(|d| d.id.as_str()).collect()
}

/// Every `--check-param` key, in run order of the checks, then the diagnosis's.
pub fn param_keys() -> Vec<String> {
    all()
        .flat_map(|d| d.params.iter().map(move |f| format!("{}.{f}", d.id)))
        .chain(DIAGNOSIS_PARAM_KEYS.iter().map(|k| k.to_string()))
        .collect()
}

/// The codes of a collective sweep: a rank below its peers, a figure below the expected one of
/// its device model, a wrong result.
struct SweepCodes {
    slow: Code,
    below: Code,
    wrong: Code,
}

/// The descriptor of a collective sweep over all ranks (all-gather, all-to-all,
/// reduce-scatter): they differ only in name, description, configuration and codes.
const fn sweep_descriptor(
    id: CheckId,
    description: &'static str,
    config: ConfigAccess,
    memory: MemoryNeed,
    codes: SweepCodes,
) -> Descriptor {
    Descriptor {
        id,
        group: CheckGroup::Micro,
        description,
        listed: true,
        needs: Needs::TwoRanks,
        reference_estimate_s: 300,
        estimate_s: 5,
        params: SweepConfig::KEYS,
        config,
        memory: Some(memory),
        metric: Some(Metric {
            key: "busbw_gbps",
            unit: "GB/s busbw",
            slow: codes.slow,
            below: codes.below,
            bad: Bad::Low,
            collective: true,
        }),
        wrong_result: WrongResult::Code(codes.wrong),
        columns: SWEEP_COLUMNS,
        charted: &[("busbw_gbps", "busbw GB/s at the largest message")],
    }
}

/// The columns of the collective sweeps.
const SWEEP_COLUMNS: &[Column] = &[
    ("busbw_gbps", "busbw GB/s @max"),
    ("busbw_gbps_peak", "peak busbw"),
    ("small_time_us", "small msg us"),
    ("wrong_elements", "wrong"),
];

/// The columns of the GPT checks.
const GPT_COLUMNS: &[Column] = &[
    ("step_ms_median", "step ms"),
    ("tokens_per_s", "tokens/s"),
    ("tflops", "TFLOP/s"),
    ("mfu", "MFU"),
    ("power_w_mean", "W mean"),
    ("sm_mhz_mean", "SM MHz mean"),
    ("loss_first", "first loss"),
    ("loss_final", "final loss"),
];
const GPT_CHARTED: &[Column] = &[("step_ms_median", "step ms"), ("tokens_per_s", "tokens/s"), ("mfu", "MFU")];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_descriptor_is_its_own_and_every_charted_figure_a_column() {
        for id in CheckId::ALL {
            let d = id.descriptor();
            assert_eq!(d.id, id);
            for (key, _) in d.charted {
                assert!(d.columns.iter().any(|(k, _)| k == key), "{id}.{key}");
            }
        }
        // Every check is listed but the link test, which the launcher adds.
        let unlisted: Vec<CheckId> = all().filter(|d| !d.listed).map(|d| d.id).collect();
        assert_eq!(unlisted, [CheckId::PairBandwidth]);
    }

    #[test]
    fn checks_that_need_peers_say_why_on_one_rank() {
        assert_eq!(CheckId::Gemm.descriptor().needs.unmet(1, 1), None);
        for id in [CheckId::AllReduce, CheckId::AllGather, CheckId::AllToAll, CheckId::MultiAllReduce] {
            assert!(id.descriptor().needs.unmet(1, 1).is_some_and(|why| why.starts_with("one rank")), "{id}");
            assert_eq!(id.descriptor().needs.unmet(2, 1), None, "{id}");
        }
        assert!(CheckId::MatmulAllReduceOverlap.descriptor().needs.unmet(1, 1).is_some());
        let net = CheckId::NetworkConnectivity.descriptor().needs;
        assert_eq!(net.unmet(8, 1).as_deref(), Some("one node (8 ranks): nothing to probe between nodes"));
        assert_eq!(net.unmet(2, 2), None);
    }
}
