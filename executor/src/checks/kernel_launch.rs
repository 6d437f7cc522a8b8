//! `kernel-launch`: per rank, the launch latency of an empty kernel (host time per launch over
//! a batch of asynchronous launches) and the launch + synchronize round trip, through the
//! driver API with a kernel written in PTX (no compiler on the node). A launch error fails the
//! rank; a hang is ended by the per-test timeout. Not applicable on CPU, with the reason.

use anyhow::Result;
use gpusanity_common::report::{CheckStatus, RankResult};

use super::CheckCtx;
use crate::backend::BackendError;

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::KernelLaunch;

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let rank = ctx.place.rank;
    let iters = ctx.configs.kernel_launch.iters;
    ctx.progress.phase(NAME, "launches", iters as u64);
    match ctx.backend.kernel_launch(iters) {
        Ok(t) => {
            let mut r = RankResult::new(rank, CheckStatus::Passed);
            r.metrics.insert("launch_us".into(), t.launch_us);
            r.metrics.insert("round_trip_us".into(), t.round_trip_us);
            r.metrics.insert("round_trip_best_us".into(), t.round_trip_best_us);
            r.metrics.insert("launches_per_s".into(), if t.round_trip_us > 0.0 { 1e6 / t.round_trip_us } else { 0.0 });
            r.metrics.insert("iters".into(), iters as f64);
            r.notes.insert("kernel".into(), "empty PTX kernel, 1 block of 1 thread, driver API".into());
            Ok(r)
        }
        Err(BackendError::NotApplicable(why)) => Ok(super::not_applicable(rank, why)),
        Err(e) => Err(anyhow::Error::from(e).context("empty kernel launches")),
    }
}
