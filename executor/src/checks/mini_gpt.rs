//! `mini-gpt`: one of the model checks, all run by [`super::models`].

use anyhow::Result;
use gpusanity_common::report::RankResult;
use gpusanity_common::CheckId;

use super::CheckCtx;

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let which = super::models::Which::Gpt(ctx.configs.mini_gpt.clone(), false);
    super::models::run(CheckId::MiniGpt, which, ctx)
}
