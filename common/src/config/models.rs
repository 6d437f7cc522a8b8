//! Typed configurations of the model checks (`mini-gpt`, `megatron-gpt`, `resnet`), their
//! defaults per backend, and their `--check-param` keys (`mini-gpt.layers=4`).
//!
//! CPU sizes are deliberately small (each check well under a minute with two workers on two
//! cores); GPU sizes load an H200 meaningfully. See docs/models.md.

use serde::{Deserialize, Serialize};

use super::param::{Param, ParamError};

/// The widest attention head the model checks take (dim / heads): the GPU's fused attention
/// keeps a warp's rows of one head in registers.
pub const MAX_HEAD_DIM: usize = 128;

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

impl GptCheckConfig {
    /// The `--check-param` fields of a GPT check; the tensor-parallel one adds `tp`.
    pub const KEYS: &'static [&'static str] =
        &["vocab", "ctx", "layers", "heads", "dim", "batch", "steps", "warmup", "lr", "min-loss-drop"];
    pub const TENSOR_PARALLEL_KEYS: &'static [&'static str] =
        &["vocab", "ctx", "layers", "heads", "dim", "batch", "steps", "warmup", "lr", "min-loss-drop", "tp"];

    /// Applies one field; `tp` only where `tensor_parallel`. `Ok(false)` for a field that is
    /// not this check's.
    pub fn apply(&mut self, p: &Param<'_>, tensor_parallel: bool) -> Result<bool, ParamError> {
        let frac = || p.fraction("a number between 0 and 1");
        match p.field {
            "vocab" => self.shape.vocab = p.dim()?,
            "ctx" => self.shape.ctx = p.dim()?,
            "layers" => self.shape.layers = p.count()?,
            "heads" => self.shape.heads = p.dim()?,
            "dim" => self.shape.dim = p.dim()?,
            "batch" => self.shape.batch = p.dim()?,
            "steps" => self.steps = p.count()?,
            "warmup" => self.warmup = p.value.parse().map_err(|_| p.bad("an integer"))?,
            "lr" => self.lr = frac()?,
            "min-loss-drop" => self.min_loss_drop = frac()?,
            "tp" if tensor_parallel => {
                self.tp = p.value.parse().map_err(|_| p.bad("an integer (0 = the node's workers)"))?
            }
            _ => return Ok(false),
        }
        if !self.shape.dim.is_multiple_of(self.shape.heads) {
            return Err(p.bad("dim must be a multiple of heads"));
        }
        if self.shape.dim / self.shape.heads.max(1) > MAX_HEAD_DIM {
            return Err(p.bad(&format!("a head (dim / heads) holds at most {MAX_HEAD_DIM} features")));
        }
        Ok(true)
    }
}

impl ResnetCheckConfig {
    pub const KEYS: &'static [&'static str] =
        &["image", "batch", "width", "blocks", "classes", "steps", "warmup", "lr", "min-loss-drop"];

    /// Applies one field (`blocks` as `3:4:6:3`); `Ok(false)` for a field that is not a ResNet's.
    pub fn apply(&mut self, p: &Param<'_>) -> Result<bool, ParamError> {
        let frac = || p.fraction("a number between 0 and 1");
        match p.field {
            "image" => self.image = p.dim()?,
            "batch" => self.batch = p.dim()?,
            "width" => self.width = p.dim()?,
            "classes" => self.classes = p.dim()?,
            "steps" => self.steps = p.count()?,
            "warmup" => self.warmup = p.value.parse().map_err(|_| p.bad("an integer"))?,
            "lr" => self.lr = frac()?,
            "min-loss-drop" => self.min_loss_drop = frac()?,
            "blocks" => {
                self.blocks = p
                    .value
                    .split(':')
                    .map(|b| b.parse::<usize>().ok().filter(|v| *v > 0))
                    .collect::<Option<Vec<_>>>()
                    .filter(|b| (1..=4).contains(&b.len()))
                    .ok_or_else(|| p.bad("1 to 4 positive block counts separated by ':'"))?
            }
            _ => return Ok(false),
        }
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use crate::kinds::DeviceKind;

    #[test]
    fn defaults_are_valid_layouts() {
        for d in [DeviceKind::Cpu, DeviceKind::Cuda] {
            let m = crate::checks::CheckConfigs::defaults(d);
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
        let mut c = crate::checks::CheckConfigs::defaults(DeviceKind::Cpu);
        let mut apply = |kv: &str| c.apply_params(&[kv.to_string()]);
        apply("mini-gpt.layers=3").unwrap();
        apply("resnet.blocks=3:4:6:3").unwrap();
        apply("megatron-gpt.tp=2").unwrap();
        assert!(apply("mini-gpt.tp=2").is_err());
        assert!(apply("mini-gpt.heads=5").is_err());
        // dim 64 over 1 head is 64 features a head; 256 over 1 is too wide.
        apply("mini-gpt.heads=1").unwrap();
        assert!(apply("mini-gpt.dim=256").is_err());
        assert!(apply("resnet.blocks=3:x").is_err());
        assert!(apply("resnet.lr=2").is_err());
        assert!(apply("mini-gpt.colour=1").is_err());
        let m = &c;
        assert_eq!((m.mini_gpt.shape.layers, m.resnet.blocks.len(), m.megatron_gpt.tp), (3, 4, 2));
    }
}
