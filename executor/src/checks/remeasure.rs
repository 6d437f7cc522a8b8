//! Re-measure before a verdict, on the workers' side. After a check with a headline figure,
//! every rank publishes its figure in the store; rank 0 reads them all, judges them with
//! [`peers::critical_ranks`] (the diagnosis's own judging) and publishes which ranks were slow,
//! which every rank reads: all agree whether to run the check again, in O(n) store operations
//! (every rank reading every figure would make n², 268 million at 16,384 ranks). A check is re-run once, on every rank (collectives need everyone), and
//! only the second measurement counts: a transient blip does not fail a job, a slow device is
//! slow twice. The re-measure runs inside the same test, under the same per-test deadline.

use gpusanity_common::expected::Conditions;
use gpusanity_common::peers::{self, PeerBands};
use gpusanity_common::registry::CheckId;
use gpusanity_common::report::{CheckStatus, DeviceKind, RankResult};
use serde::{Deserialize, Serialize};

use super::{CheckCtx, BARRIER_WAIT};

#[derive(Debug, Serialize, Deserialize)]
struct Figure {
    device: String,
    value: Option<f64>,
}

/// Runs check `id` on this rank, and once more on every rank if any rank's figure is
/// critical against its peers or its expected value.
pub fn run(id: CheckId, ctx: &mut CheckCtx<'_>, device: &str) -> RankResult {
    let first_faults = ctx.faults.first_attempt();
    let first = {
        let mut c = CheckCtx { faults: &first_faults, ..reborrow(ctx) };
        super::run(id, &mut c)
    };
    let Some(m) = id.metric() else {
        return first;
    };
    let value = (first.status == CheckStatus::Passed).then(|| first.metrics.get(m.key).copied()).flatten();
    let fig = Figure { device: device.to_string(), value };
    let judge = |ctx: &CheckCtx<'_>, figures: &peers::Figures| {
        // The check's own configuration, as the report will show it to node 0's diagnosis.
        // The link as rank 0 reads it (the diagnosis takes the one every rank reported).
        let local_gpus = ctx.place.node_sizes.get(ctx.place.node_rank).copied().unwrap_or(1);
        let link = super::gpu_health::link(&*ctx.backend, local_gpus);
        let when = Conditions::from_config(&id.config_value(ctx.configs), &ctx.place.node_sizes).with_link(link);
        let bands = PeerBands::new(ctx.configs.slow_fraction, ctx.backend.kind() == DeviceKind::Cpu);
        let slow = peers::critical_ranks(id, m.key, figures, bands, when);
        figures.iter().filter(|(r, _, _)| slow.contains(r)).map(|(r, _, v)| (*r, *v)).collect()
    };
    let slow: Vec<(usize, f64)> = match exchange(ctx, id, &fig, judge) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("could not share figures for a re-measure: {e}");
            return first;
        }
    };
    if slow.is_empty() {
        return first;
    }
    let list: Vec<String> = slow.iter().map(|(r, _)| r.to_string()).collect();
    tracing::info!(check = id.as_str(), "re-measuring: ranks {} were slow", list.join(", "));
    ctx.progress.phase(id, "re-measure", 0);
    // Fresh store keys, so that the check's own barriers synchronize the ranks again.
    ctx.store.set_namespace(&format!("remeasure/{id}/"));
    let mut second = super::run(id, ctx);
    ctx.store.set_namespace("");
    let firsts: Vec<String> = slow.iter().map(|(r, v)| format!("rank {r} at {v:.2} {}", m.unit)).collect();
    second.notes.insert(
        "remeasured".into(),
        format!("re-measured on every rank after a slow first measurement ({})", firsts.join(", ")),
    );
    if let Some(v) = value {
        second.metrics.insert(format!("first_{}", m.key), v);
    }
    second
}

fn reborrow<'b>(ctx: &'b mut CheckCtx<'_>) -> CheckCtx<'b> {
    CheckCtx {
        backend: &mut *ctx.backend,
        store: &mut *ctx.store,
        place: ctx.place,
        configs: ctx.configs,
        progress: ctx.progress,
        baseline: ctx.baseline,
        faults: ctx.faults,
        health: ctx.health,
        load: &mut *ctx.load,
    }
}

/// Publishes this rank's figure; rank 0 reads every rank's, `judge`s them and publishes the
/// slow ranks with their figures, which every rank returns.
fn exchange(
    ctx: &mut CheckCtx<'_>,
    id: CheckId,
    fig: &Figure,
    judge: impl FnOnce(&CheckCtx<'_>, &peers::Figures) -> Vec<(usize, f64)>,
) -> anyhow::Result<Vec<(usize, f64)>> {
    // Two-level rounds (store::Rounds): node 0's store sees one value per node each way.
    let gathered = ctx.store.gather(&format!("diag/{id}"), &serde_json::to_string(fig)?, BARRIER_WAIT)?;
    let decision = match gathered {
        Some(all) => {
            let mut figures = Vec::new();
            for (r, v) in all.into_iter().enumerate() {
                let f: Figure = serde_json::from_str(&v)?;
                if let Some(v) = f.value {
                    figures.push((r, f.device, v));
                }
            }
            let slow = judge(ctx, &figures);
            Some(serde_json::to_string(&slow)?)
        }
        None => None,
    };
    let slow = ctx.store.broadcast(&format!("diag/{id}/slow"), decision.as_deref(), BARRIER_WAIT)?;
    Ok(serde_json::from_str(&slow)?)
}
