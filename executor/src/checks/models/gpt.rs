//! `mini-gpt` (data parallel over every rank) and `megatron-gpt` (tensor parallel inside a
//! node, data parallel across): the models crate's GPT on the synthetic next-token task.

use anyhow::Result;
use gpusanity_common::config::models::GptCheckConfig;
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::RankResult;
use gpusanity_models::gpt::{Gpt, GptConfig};

use super::comm::Groups;
use super::{train_check, Layout, Plan};
use crate::checks::CheckCtx;

/// Initial weights: the same on every rank.
const WEIGHT_SEED: u64 = 0x0067_7074;

pub fn run<O: Groups>(
    ops: &mut O,
    name: CheckId,
    cfg: &GptCheckConfig,
    megatron: bool,
    ctx: &mut CheckCtx<'_>,
) -> Result<RankResult> {
    let place = ctx.place;
    let layout = if megatron { Layout::new(place, cfg.tp)? } else { Layout::data_parallel(place) };
    let (tp_index, dp_index) = (layout.tp_index(place.rank), layout.dp_index(place.rank));
    let model_cfg = GptConfig {
        shape: cfg.shape.clone(),
        tp_size: layout.tp.len(),
        tp_rank: tp_index,
        seed: WEIGHT_SEED,
        data_seed: dp_index as u64,
    };
    ctx.progress.phase(name, "build", 0);
    let mut model = Gpt::new(ops, model_cfg)?;
    let plan = Plan {
        name,
        layout,
        steps: cfg.steps,
        lr: cfg.lr,
        warmup: cfg.warmup,
        min_loss_drop: cfg.min_loss_drop,
        items_per_step: (cfg.shape.batch * cfg.shape.ctx) as f64,
        unit: "tokens",
    };
    train_check(ops, &mut model, ctx, plan)
}
