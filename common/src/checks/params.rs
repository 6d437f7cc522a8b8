//! `--check-param CHECK.KEY=VALUE` overrides (`gemm.size=4096`), dispatched to each check's
//! own fields through its descriptor.

use super::{all, param_keys, CheckConfigs, CheckId};
use crate::config::diagnosis::MAX_STALL_S;
use crate::config::param::{Param, ParamError};

impl CheckConfigs {
    /// Applies `CHECK.KEY=VALUE` overrides, e.g. `gemm.size=4096`, `all-reduce.max-bytes=1048576`,
    /// `diagnosis.slow-fraction=0.7`, then checks what depends on several of them.
    pub fn apply_params(&mut self, params: &[String]) -> Result<(), ParamError> {
        for p in params {
            let (key, value) = p.split_once('=').ok_or_else(|| ParamError::Syntax(p.clone()))?;
            let (check, field) = key.split_once('.').unwrap_or((key, ""));
            let param = Param { key, field, value };
            let applied = match check.parse::<CheckId>() {
                Ok(id) => (id.descriptor().config.apply)(self, &param)?,
                Err(_) => self.apply_diagnosis(&param)?,
            };
            if !applied {
                return Err(ParamError::UnknownKey(key.into(), param_keys().join(", ")));
            }
        }
        for d in all() {
            (d.config.settle)(self)?;
        }
        Ok(())
    }

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

#[cfg(test)]
mod tests {
    use crate::checks::CheckConfigs;
    use crate::kinds::DeviceKind;

    #[test]
    fn params_override_and_reject() {
        let mut c = CheckConfigs::defaults(DeviceKind::Cpu);
        c.apply_params(&["gemm.size=64".into(), "all-reduce.max-bytes=65536".into()]).unwrap();
        assert_eq!(c.gemm.size, 64);
        assert_eq!(c.gemm.verify_tile, 16);
        assert_eq!(c.all_reduce.sizes(), [4096, 16384, 65536]);
        assert!(c.apply_params(&["gemm.size=0".into()]).is_err());
        assert!(c.apply_params(&["gemm.colour=3".into()]).is_err());
        assert!(c.apply_params(&["nonsense".into()]).is_err());
        assert!(c.apply_params(&["diagnosis.slow-fraction=1.5".into()]).is_err());
        c.apply_params(&["gemm.size=8".into()]).unwrap();
        assert_eq!(c.gemm.verify_tile, 8);
    }

    #[test]
    fn micro_params_override_and_reject() {
        let mut c = CheckConfigs::defaults(DeviceKind::Cpu);
        c.apply_params(&["all-gather.max-bytes=65536".into(), "network-connectivity.timeout-ms=300".into()]).unwrap();
        assert_eq!(c.all_gather.sizes(), [4096, 16384, 65536]);
        assert_eq!(c.network_connectivity.timeout_ms, 300);
        c.apply_params(&["multi-all-reduce.world-streams=3".into(), "kernel-launch.iters=7".into()]).unwrap();
        assert_eq!((c.multi_all_reduce.world_streams, c.kernel_launch.iters), (3, 7));
        assert!(c.apply_params(&["all-to-all.colour=1".into()]).is_err());
        assert!(c.apply_params(&["all-to-all.min-bytes=999999999".into()]).is_err());
        assert!(c.apply_params(&["matmul-all-reduce-overlap.iters=0".into()]).is_err());
    }

    #[test]
    fn gpu_health_params_are_bounded_and_checked() {
        let mut c = CheckConfigs::defaults(DeviceKind::Cpu);
        assert!(c.gpu_health.fatal_xids.contains(&79));
        c.apply_params(&["gpu-health.expected-gpus=8".into(), "gpu-health.fatal-xids=79, 48,79".into()]).unwrap();
        assert_eq!(c.gpu_health.expected_gpus, Some(8));
        assert_eq!(c.gpu_health.fatal_xids, [48, 79]);
        c.apply_params(&["gpu-health.fatal-xids=none".into()]).unwrap();
        assert!(c.gpu_health.fatal_xids.is_empty());
        let huge = format!("gpu-health.fatal-xids={}", vec!["1"; 5000].join(","));
        let many = format!("gpu-health.fatal-xids={}", (1..=300).map(|x| x.to_string()).collect::<Vec<_>>().join(","));
        for bad in [
            "gpu-health.expected-gpus=0",
            "gpu-health.expected-gpus=-1",
            "gpu-health.expected-gpus=1e9",
            "gpu-health.expected-gpus=99999999999999999999999",
            "gpu-health.fatal-xids=",
            "gpu-health.fatal-xids=79,,48",
            "gpu-health.fatal-xids=abc",
            "gpu-health.fatal-xids=0",
            "gpu-health.fatal-xids=4294967296",
            "gpu-health.load-ms=0",
            "gpu-health.load-ms=86400000",
            "gpu-health.load-size=100000",
            "gpu-health.min-clock-fraction=1.5",
            "gpu-health.min-clock-fraction=NaN",
            "gpu-health.colour=1",
            huge.as_str(),
            many.as_str(),
        ] {
            assert!(c.apply_params(&[bad.to_string()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_unknown_key_lists_every_key() {
        let mut c = CheckConfigs::defaults(DeviceKind::Cpu);
        let err = c.apply_params(&["gemm.colour=3".into()]).unwrap_err().to_string();
        for k in ["gemm.size", "all-gather.iters", "megatron-gpt.tp", "resnet.blocks", "diagnosis.slow-fraction"] {
            assert!(err.contains(k), "{k}: {err}");
        }
        assert!(!err.contains("mini-gpt.tp"), "{err}");
    }
}
