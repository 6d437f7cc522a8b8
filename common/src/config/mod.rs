//! The configuration of a run, [`CheckConfigs`]: one field per check, declared from the list
//! of checks, whose type and per-backend defaults its descriptor module names (`Config`,
//! `defaults`, in [`crate::checks`]); and the types that several checks share or that are
//! large enough for a file: [`sweep`] (the collective sweeps), [`micro`] (gemm and the other
//! micro-benchmarks), [`models`] (the model checks), [`bandwidth`], [`health`]. Each type parses
//! its own `--check-param` fields; the one `CheckConfigs::apply_params` is in
//! [`crate::checks`].

pub mod bandwidth;
pub mod health;
pub mod memory;
pub mod micro;
pub mod models;
pub mod sweep;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::kinds::DeviceKind;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParamError {
    #[error("bad --check-param `{0}`: expected CHECK.KEY=VALUE")]
    Syntax(String),
    #[error("unknown --check-param key `{0}` (known: {1})")]
    UnknownKey(String, String),
    #[error("bad value `{value}` for --check-param {key}: {why}")]
    BadValue { key: String, value: String, why: String },
}

/// The largest byte count or time a `--check-param` takes: 1 TiB.
pub const MAX_INT: u64 = 1 << 40;
/// The largest count of iterations, steps or streams.
pub const MAX_COUNT: u64 = 1 << 20;
/// The largest matrix side or model dimension.
pub const MAX_DIM: u64 = 1 << 16;

/// One `--check-param CHECK.KEY=VALUE`: the whole key, the field after the check's name, and
/// the value, with the parsers the configurations share.
#[derive(Debug, Clone, Copy)]
pub struct Param<'a> {
    /// `CHECK.KEY`, for error messages.
    pub key: &'a str,
    /// `KEY`.
    pub field: &'a str,
    pub value: &'a str,
}

impl Param<'_> {
    pub fn bad(&self, why: &str) -> ParamError {
        ParamError::BadValue { key: self.key.into(), value: self.value.into(), why: why.into() }
    }

    /// A positive integer up to `max`.
    pub fn bounded(&self, max: u64) -> Result<u64, ParamError> {
        self.value
            .parse::<u64>()
            .ok()
            .filter(|v| (1..=max).contains(v))
            .ok_or_else(|| self.bad(&format!("a positive integer up to {max}")))
    }

    /// A positive integer: a byte count or a time (at most [`MAX_INT`]).
    pub fn int(&self) -> Result<u64, ParamError> {
        self.bounded(MAX_INT)
    }

    /// A positive integer, as a count of iterations, steps or streams (at most [`MAX_COUNT`]).
    pub fn count(&self) -> Result<usize, ParamError> {
        self.bounded(MAX_COUNT).map(|v| v as usize)
    }

    /// A positive integer, as one side of a matrix or a model dimension (at most
    /// [`MAX_DIM`]), so that products of two of them never overflow.
    pub fn dim(&self) -> Result<usize, ParamError> {
        self.bounded(MAX_DIM).map(|v| v as usize)
    }

    /// A number strictly between 0 and 1, `what` naming it in the error.
    pub fn fraction(&self, what: &str) -> Result<f64, ParamError> {
        self.value.parse::<f64>().ok().filter(|v| *v > 0.0 && *v < 1.0).ok_or_else(|| self.bad(what))
    }
}

/// Declares [`CheckConfigs`] from the list of checks ([`crate::registry`]): one field per
/// check, named after its descriptor module, of the type that module names `Config`, with that
/// module's `defaults`; spelled by the check's name in JSON (`"all-reduce": {...}`).
macro_rules! check_configs {
    ($($id:ident = $name:literal => $module:ident,)+) => {
        /// The configuration of every check, for one run, and the diagnosis's own settings.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        pub struct CheckConfigs {
            $(
                #[serde(rename = $name)]
                pub $module: crate::checks::$module::Config,
            )+
            /// A rank whose figure is below this fraction of its peers' median is named slow.
            pub slow_fraction: f64,
            /// Seconds without progress on any rank of a node (or without a heartbeat from one)
            /// after which the running test is stopped as hung, well before its per-test limit.
            #[serde(default = "default_stall_s")]
            pub stall_s: u64,
        }

        impl CheckConfigs {
            pub fn defaults(device: DeviceKind) -> Self {
                CheckConfigs {
                    $($module: crate::checks::$module::defaults(device),)+
                    slow_fraction: match device {
                        DeviceKind::Cuda => 0.8,
                        DeviceKind::Cpu => 0.5,
                    },
                    stall_s: DEFAULT_STALL_S,
                }
            }
        }
    };
}
crate::registry::for_each_check!(check_configs);

/// The configuration of a check that has none (`pair-bandwidth`: the launcher sizes it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoConfig;

/// The `--check-param` keys that belong to no check.
pub const DIAGNOSIS_PARAM_KEYS: &[&str] = &["diagnosis.slow-fraction", "diagnosis.stall-s"];

/// The default stall time: far above any single operation of the checks, far below the
/// default per-test limit (6 min).
pub const DEFAULT_STALL_S: u64 = 30;
/// The longest stall time accepted (a day).
const MAX_STALL_S: u64 = 86_400;

fn default_stall_s() -> u64 {
    DEFAULT_STALL_S
}

impl CheckConfigs {
    /// Applies a `diagnosis.KEY=VALUE` override; `Ok(false)` for a key that is not one.
    pub fn apply_diagnosis(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.key {
            "diagnosis.slow-fraction" => self.slow_fraction = p.fraction("a fraction between 0 and 1")?,
            "diagnosis.stall-s" => self.stall_s = p.bounded(MAX_STALL_S)?,
            _ => return Ok(false),
        }
        Ok(true)
    }
}
