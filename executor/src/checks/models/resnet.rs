//! `resnet`: the models crate's bottleneck ResNet (ResNet-50-shaped on GPU, reduced on CPU)
//! trained data parallel over every rank on synthetic images. Convolutions are im2col + GEMM
//! on both backends (no cuDNN).

use anyhow::Result;
use gpusanity_common::config::models::ResnetCheckConfig;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::RankResult;
use gpusanity_models::resnet::{Resnet, ResnetConfig};

use super::comm::Groups;
use super::{train_check, Layout, Plan};
use crate::checks::CheckCtx;

/// Initial weights: the same on every rank.
const WEIGHT_SEED: u64 = 0x7265_736e;

pub fn run<O: Groups>(
    ops: &mut O,
    name: CheckId,
    cfg: &ResnetCheckConfig,
    ctx: &mut CheckCtx<'_>,
) -> Result<RankResult> {
    let place = ctx.place;
    let model_cfg = ResnetConfig {
        image: cfg.image,
        batch: cfg.batch,
        width: cfg.width,
        blocks: cfg.blocks.clone(),
        classes: cfg.classes,
        seed: WEIGHT_SEED,
        data_seed: place.rank as u64,
    };
    ctx.progress.phase(name, "build", 0);
    let mut model = Resnet::new(ops, model_cfg)?;
    let plan = Plan {
        name,
        layout: Layout::data_parallel(place),
        steps: cfg.steps,
        lr: cfg.lr,
        warmup: cfg.warmup,
        min_loss_drop: cfg.min_loss_drop,
        items_per_step: cfg.batch as f64,
        unit: "images",
    };
    let mut r = train_check(ops, &mut model, ctx, plan)?;
    r.notes.insert("convolution".into(), "im2col + GEMM (no cuDNN)".into());
    let blocks: Vec<String> = cfg.blocks.iter().map(|b| b.to_string()).collect();
    r.notes.insert(
        "shape".into(),
        format!("{}x{} images, width {}, bottleneck blocks {}", cfg.image, cfg.image, cfg.width, blocks.join("-")),
    );
    Ok(r)
}
