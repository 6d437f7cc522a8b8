//! `megatron-gpt`: one of the model checks, all run by [`super::models`].

use anyhow::Result;
use gpusanity_common::report::RankResult;
use gpusanity_common::CheckId;

use super::CheckCtx;

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let which = super::models::Which::Gpt(ctx.configs.megatron_gpt.clone(), true);
    super::models::run(CheckId::MegatronGpt, which, ctx)
}
