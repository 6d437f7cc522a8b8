//! Typed configurations of the check items, their defaults per backend, and `--check-param`
//! overrides (`gemm.size=4096`).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::config_micro::{MicroConfigs, MICRO_PARAM_KEYS};
use crate::config_models::ModelConfigs;
use crate::report::DeviceKind;

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParamError {
    #[error("bad --check-param `{0}`: expected CHECK.KEY=VALUE")]
    Syntax(String),
    #[error("unknown --check-param key `{0}` (known: {1})")]
    UnknownKey(String, String),
    #[error("bad value `{value}` for --check-param {key}: {why}")]
    BadValue { key: String, value: String, why: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmConfig {
    /// m = n = k of the square product.
    pub size: usize,
    pub warmup: usize,
    pub iters: usize,
    /// Side of the square tile of C verified against an f64 reference on the host.
    pub verify_tile: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllReduceConfig {
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// Each size is the previous one times this factor.
    pub step_factor: u64,
    pub warmup: usize,
    pub iters: usize,
}

/// The configuration of every check, for one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckConfigs {
    pub gemm: GemmConfig,
    pub all_reduce: AllReduceConfig,
    /// A rank whose figure is below this fraction of its peers' median is named slow.
    pub slow_fraction: f64,
    /// The other micro-benchmarks.
    #[serde(flatten)]
    pub micro: MicroConfigs,
    /// The model checks.
    pub models: ModelConfigs,
}

impl CheckConfigs {
    pub fn defaults(device: DeviceKind) -> Self {
        match device {
            DeviceKind::Cuda => CheckConfigs {
                gemm: GemmConfig { size: 8192, warmup: 50, iters: 50, verify_tile: 32 },
                all_reduce: AllReduceConfig {
                    min_bytes: 1 << 10,
                    max_bytes: 1 << 30,
                    step_factor: 4,
                    warmup: 5,
                    iters: 20,
                },
                slow_fraction: 0.8,
                micro: MicroConfigs::defaults(device),
                models: ModelConfigs::defaults(device),
            },
            DeviceKind::Cpu => CheckConfigs {
                gemm: GemmConfig { size: 1024, warmup: 2, iters: 10, verify_tile: 16 },
                all_reduce: AllReduceConfig {
                    min_bytes: 4 << 10,
                    max_bytes: 4 << 20,
                    step_factor: 4,
                    warmup: 2,
                    iters: 5,
                },
                slow_fraction: 0.5,
                micro: MicroConfigs::defaults(device),
                models: ModelConfigs::defaults(device),
            },
        }
    }

    /// Applies `CHECK.KEY=VALUE` overrides, e.g. `gemm.size=4096`, `all-reduce.max-bytes=1048576`,
    /// `diagnosis.slow-fraction=0.7`.
    pub fn apply_params(&mut self, params: &[String]) -> Result<(), ParamError> {
        for p in params {
            let (key, value) = p.split_once('=').ok_or_else(|| ParamError::Syntax(p.clone()))?;
            let int = || -> Result<u64, ParamError> {
                value.parse::<u64>().ok().filter(|v| *v > 0).ok_or_else(|| ParamError::BadValue {
                    key: key.into(),
                    value: value.into(),
                    why: "a positive integer".into(),
                })
            };
            match key {
                "gemm.size" => self.gemm.size = int()? as usize,
                "gemm.warmup" => self.gemm.warmup = int()? as usize,
                "gemm.iters" => self.gemm.iters = int()? as usize,
                "gemm.verify-tile" => self.gemm.verify_tile = int()? as usize,
                "all-reduce.min-bytes" => self.all_reduce.min_bytes = int()?,
                "all-reduce.max-bytes" => self.all_reduce.max_bytes = int()?,
                "all-reduce.step-factor" => self.all_reduce.step_factor = int()?.max(2),
                "all-reduce.warmup" => self.all_reduce.warmup = int()? as usize,
                "all-reduce.iters" => self.all_reduce.iters = int()? as usize,
                k if ModelConfigs::owns(k) => self.models.apply(k, value)?,
                "diagnosis.slow-fraction" => {
                    self.slow_fraction =
                        value.parse::<f64>().ok().filter(|v| *v > 0.0 && *v < 1.0).ok_or_else(|| {
                            ParamError::BadValue {
                                key: key.into(),
                                value: value.into(),
                                why: "a fraction between 0 and 1".into(),
                            }
                        })?
                }
                _ => {
                    if !self.micro.apply(key, int)? {
                        let known: Vec<&str> = PARAM_KEYS
                            .iter()
                            .chain(MICRO_PARAM_KEYS)
                            .chain(crate::config_models::MODEL_PARAM_KEYS)
                            .copied()
                            .collect();
                        return Err(ParamError::UnknownKey(key.into(), known.join(", ")));
                    }
                }
            }
        }
        if self.all_reduce.min_bytes > self.all_reduce.max_bytes {
            return Err(ParamError::BadValue {
                key: "all-reduce.min-bytes".into(),
                value: self.all_reduce.min_bytes.to_string(),
                why: "must not exceed all-reduce.max-bytes".into(),
            });
        }
        self.gemm.verify_tile = self.gemm.verify_tile.min(self.gemm.size);
        Ok(())
    }

    /// The message sizes of the all-reduce sweep.
    pub fn all_reduce_sizes(&self) -> Vec<u64> {
        crate::config_micro::sweep_sizes(&self.all_reduce)
    }
}

pub const PARAM_KEYS: &[&str] = &[
    "gemm.size",
    "gemm.warmup",
    "gemm.iters",
    "gemm.verify-tile",
    "all-reduce.min-bytes",
    "all-reduce.max-bytes",
    "all-reduce.step-factor",
    "all-reduce.warmup",
    "all-reduce.iters",
    "diagnosis.slow-fraction",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_override_and_reject() {
        let mut c = CheckConfigs::defaults(DeviceKind::Cpu);
        c.apply_params(&["gemm.size=64".into(), "all-reduce.max-bytes=65536".into()]).unwrap();
        assert_eq!(c.gemm.size, 64);
        assert_eq!(c.all_reduce_sizes(), [4096, 16384, 65536]);
        assert!(c.apply_params(&["gemm.size=0".into()]).is_err());
        assert!(c.apply_params(&["gemm.colour=3".into()]).is_err());
        assert!(c.apply_params(&["nonsense".into()]).is_err());
        assert!(c.apply_params(&["diagnosis.slow-fraction=1.5".into()]).is_err());
    }

    #[test]
    fn gpu_sweep_reaches_one_gib() {
        let c = CheckConfigs::defaults(DeviceKind::Cuda);
        let s = c.all_reduce_sizes();
        assert_eq!(*s.last().unwrap(), 1 << 30);
        assert_eq!(s.len(), 11);
    }
}
