//! Typed configurations of the model checks (`mini-gpt`, `megatron-gpt`, `resnet`), their
//! defaults per backend, and their `--check-param` keys (`mini-gpt.layers=4`).
//!
//! CPU sizes are deliberately small (each check well under a minute with two workers on two
//! cores); GPU sizes load an H200 meaningfully. See docs/models.md.

use serde::{Deserialize, Serialize};

use crate::config::ParamError;
use crate::report::DeviceKind;

/// The shape of a GPT and its batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GptShape {
    pub vocab: usize,
    /// Sequence length.
    pub ctx: usize,
    pub layers: usize,
    pub heads: usize,
    pub dim: usize,
    /// Sequences per data-parallel replica and step.
    pub batch: usize,
}

/// A GPT trained for a few dozen steps on the synthetic next-token task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GptCheckConfig {
    #[serde(flatten)]
    pub shape: GptShape,
    pub steps: usize,
    /// Steps left out of the step-time median; the learning rate ramps up over them.
    pub warmup: usize,
    pub lr: f64,
    /// The loss must fall by at least this fraction (mean of the last fifth of the steps
    /// against the mean of the first fifth).
    pub min_loss_drop: f64,
    /// Tensor-parallel size (megatron-gpt); 0 = every worker of a node.
    pub tp: usize,
}

/// A ResNet with bottleneck blocks trained on synthetic images.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResnetCheckConfig {
    /// Height and width of the images.
    pub image: usize,
    /// Images per data-parallel rank and step.
    pub batch: usize,
    /// Channels of the stem; ResNet-50 has 64.
    pub width: usize,
    /// Bottleneck blocks per stage; ResNet-50 has 3, 4, 6, 3.
    pub blocks: Vec<usize>,
    pub classes: usize,
    pub steps: usize,
    /// As [`GptCheckConfig::warmup`].
    pub warmup: usize,
    pub lr: f64,
    pub min_loss_drop: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfigs {
    pub mini_gpt: GptCheckConfig,
    pub megatron_gpt: GptCheckConfig,
    pub resnet: ResnetCheckConfig,
}

pub const MODEL_PARAM_KEYS: &[&str] = &[
    "mini-gpt.{vocab,ctx,layers,heads,dim,batch,steps,warmup,lr,min-loss-drop}",
    "megatron-gpt.{the same keys,tp}",
    "resnet.{image,batch,width,blocks (e.g. 3:4:6:3),classes,steps,warmup,lr,min-loss-drop}",
];

impl ModelConfigs {
    pub fn defaults(device: DeviceKind) -> Self {
        match device {
            DeviceKind::Cuda => {
                let mini = GptCheckConfig {
                    shape: GptShape { vocab: 4096, ctx: 512, layers: 12, heads: 12, dim: 768, batch: 16 },
                    steps: 40,
                    warmup: 5,
                    lr: 6e-4,
                    min_loss_drop: 0.2,
                    tp: 1,
                };
                ModelConfigs {
                    megatron_gpt: GptCheckConfig {
                        shape: GptShape { ctx: 1024, layers: 8, heads: 16, dim: 2048, batch: 8, ..mini.shape.clone() },
                        lr: 3e-4,
                        tp: 0,
                        ..mini.clone()
                    },
                    mini_gpt: mini,
                    resnet: ResnetCheckConfig {
                        image: 224,
                        batch: 32,
                        width: 64,
                        blocks: vec![3, 4, 6, 3],
                        classes: 10,
                        steps: 20,
                        warmup: 5,
                        lr: 2e-3,
                        min_loss_drop: 0.2,
                    },
                }
            }
            DeviceKind::Cpu => {
                let mini = GptCheckConfig {
                    shape: GptShape { vocab: 64, ctx: 32, layers: 2, heads: 4, dim: 64, batch: 8 },
                    steps: 40,
                    warmup: 3,
                    lr: 3e-3,
                    min_loss_drop: 0.2,
                    tp: 1,
                };
                ModelConfigs {
                    megatron_gpt: GptCheckConfig { tp: 0, ..mini.clone() },
                    mini_gpt: mini,
                    resnet: ResnetCheckConfig {
                        image: 32,
                        batch: 8,
                        width: 8,
                        blocks: vec![1, 1, 1, 1],
                        classes: 4,
                        steps: 20,
                        warmup: 3,
                        lr: 2e-3,
                        min_loss_drop: 0.2,
                    },
                }
            }
        }
    }

    /// Whether `key` belongs to a model check.
    pub fn owns(key: &str) -> bool {
        ["mini-gpt.", "megatron-gpt.", "resnet."].iter().any(|p| key.starts_with(p))
    }

    /// Applies one `CHECK.KEY=VALUE` override of a model check.
    pub fn apply(&mut self, key: &str, value: &str) -> Result<(), ParamError> {
        let bad = |why: &str| ParamError::BadValue { key: key.into(), value: value.into(), why: why.into() };
        let int = || value.parse::<usize>().ok().filter(|v| *v > 0).ok_or_else(|| bad("a positive integer"));
        let frac = || {
            value.parse::<f64>().ok().filter(|v| *v > 0.0 && *v < 1.0).ok_or_else(|| bad("a number between 0 and 1"))
        };
        let unknown = || ParamError::UnknownKey(key.into(), MODEL_PARAM_KEYS.join(", "));
        let (check, field) = key.split_once('.').ok_or_else(unknown)?;
        if check == "resnet" {
            let r = &mut self.resnet;
            match field {
                "image" => r.image = int()?,
                "batch" => r.batch = int()?,
                "width" => r.width = int()?,
                "classes" => r.classes = int()?,
                "steps" => r.steps = int()?,
                "warmup" => r.warmup = value.parse().map_err(|_| bad("an integer"))?,
                "lr" => r.lr = frac()?,
                "min-loss-drop" => r.min_loss_drop = frac()?,
                "blocks" => {
                    r.blocks = value
                        .split(':')
                        .map(|b| b.parse::<usize>().ok().filter(|v| *v > 0))
                        .collect::<Option<Vec<_>>>()
                        .filter(|b| (1..=4).contains(&b.len()))
                        .ok_or_else(|| bad("1 to 4 positive block counts separated by ':'"))?
                }
                _ => return Err(unknown()),
            }
            return Ok(());
        }
        let g = match check {
            "mini-gpt" => &mut self.mini_gpt,
            "megatron-gpt" => &mut self.megatron_gpt,
            _ => return Err(unknown()),
        };
        match field {
            "vocab" => g.shape.vocab = int()?,
            "ctx" => g.shape.ctx = int()?,
            "layers" => g.shape.layers = int()?,
            "heads" => g.shape.heads = int()?,
            "dim" => g.shape.dim = int()?,
            "batch" => g.shape.batch = int()?,
            "steps" => g.steps = int()?,
            "warmup" => g.warmup = value.parse().map_err(|_| bad("an integer"))?,
            "lr" => g.lr = frac()?,
            "min-loss-drop" => g.min_loss_drop = frac()?,
            "tp" if check == "megatron-gpt" => {
                g.tp = value.parse().map_err(|_| bad("an integer (0 = the node's workers)"))?
            }
            _ => return Err(unknown()),
        }
        if g.shape.dim % g.shape.heads != 0 {
            return Err(bad("dim must be a multiple of heads"));
        }
        Ok(())
    }

    /// The configuration of model check `name`, for the report.
    pub fn to_value(&self, name: &str) -> Option<serde_json::Value> {
        match name {
            "mini-gpt" => serde_json::to_value(&self.mini_gpt).ok(),
            "megatron-gpt" => serde_json::to_value(&self.megatron_gpt).ok(),
            "resnet" => serde_json::to_value(&self.resnet).ok(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_layouts() {
        for d in [DeviceKind::Cpu, DeviceKind::Cuda] {
            let m = ModelConfigs::defaults(d);
            for g in [&m.mini_gpt, &m.megatron_gpt] {
                assert_eq!(g.shape.dim % g.shape.heads, 0);
                assert!(g.warmup < g.steps);
            }
            // Tensor parallelism over 1, 2, 4 or 8 workers per node splits the heads evenly.
            assert_eq!(m.megatron_gpt.shape.heads % if d == DeviceKind::Cuda { 8 } else { 2 }, 0);
            assert!(m.resnet.warmup < m.resnet.steps);
        }
    }

    #[test]
    fn model_params_override_and_reject() {
        let mut m = ModelConfigs::defaults(DeviceKind::Cpu);
        m.apply("mini-gpt.layers", "3").unwrap();
        m.apply("resnet.blocks", "3:4:6:3").unwrap();
        m.apply("megatron-gpt.tp", "2").unwrap();
        assert_eq!((m.mini_gpt.shape.layers, m.resnet.blocks.len(), m.megatron_gpt.tp), (3, 4, 2));
        assert!(m.apply("mini-gpt.tp", "2").is_err());
        assert!(m.apply("mini-gpt.heads", "5").is_err());
        assert!(m.apply("resnet.blocks", "3:x").is_err());
        assert!(m.apply("resnet.lr", "2").is_err());
        assert!(m.apply("mini-gpt.colour", "1").is_err());
    }
}
