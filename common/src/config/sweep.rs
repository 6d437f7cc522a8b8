//! The collective sweep: message sizes from `min_bytes` up to `max_bytes`, each the previous
//! one times `step_factor`. All-reduce, all-gather and all-to-all run one each.

use serde::{Deserialize, Serialize};

use super::param::{Param, ParamError};
use crate::kinds::DeviceKind;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepConfig {
    pub min_bytes: u64,
    pub max_bytes: u64,
    /// Each size is the previous one times this factor.
    pub step_factor: u64,
    pub warmup: usize,
    pub iters: usize,
}

impl SweepConfig {
    /// The `--check-param` fields of a sweep.
    pub const KEYS: &'static [&'static str] = &["min-bytes", "max-bytes", "step-factor", "warmup", "iters"];

    pub fn defaults(device: DeviceKind) -> Self {
        match device {
            DeviceKind::Cuda => {
                SweepConfig { min_bytes: 1 << 10, max_bytes: 1 << 30, step_factor: 4, warmup: 5, iters: 20 }
            }
            DeviceKind::Cpu => {
                SweepConfig { min_bytes: 4 << 10, max_bytes: 4 << 20, step_factor: 4, warmup: 2, iters: 5 }
            }
        }
    }

    /// Applies one field; `Ok(false)` for a field that is not a sweep's.
    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        match p.field {
            "min-bytes" => self.min_bytes = p.int()?,
            "max-bytes" => self.max_bytes = p.int()?,
            "step-factor" => self.step_factor = p.int()?.max(2),
            "warmup" => self.warmup = p.count()?,
            "iters" => self.iters = p.count()?,
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks the sweep of check `name` once every override is applied.
    pub fn validate(&self, name: &str) -> Result<(), ParamError> {
        if self.min_bytes > self.max_bytes {
            return Err(ParamError::BadValue {
                key: format!("{name}.min-bytes"),
                value: self.min_bytes.to_string(),
                why: format!("must not exceed {name}.max-bytes"),
            });
        }
        Ok(())
    }

    /// The message sizes: from `min_bytes`, times `step_factor`, up to `max_bytes`.
    pub fn sizes(&self) -> Vec<u64> {
        let mut sizes = Vec::new();
        let mut b = self.min_bytes;
        while b < self.max_bytes {
            sizes.push(b);
            b = b.saturating_mul(self.step_factor.max(2));
        }
        sizes.push(self.max_bytes);
        sizes
    }

    /// The configuration as reported, with its message sizes.
    pub fn to_value(&self) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        v["sizes"] = serde_json::to_value(self.sizes()).unwrap_or_default();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_sweep_reaches_one_gib() {
        let s = SweepConfig::defaults(DeviceKind::Cuda).sizes();
        assert_eq!(*s.last().unwrap(), 1 << 30);
        assert_eq!(s.len(), 11);
    }
}
