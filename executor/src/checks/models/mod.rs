//! The model checks: `mini-gpt`, `megatron-gpt` and `resnet` train a real model for a few
//! dozen steps on a learnable synthetic task, over the models crate's tensor ops (CPU, or
//! CUDA on the worker's GPU) and its groups of ranks ([`comm`]).
//!
//! Each rank reports its loss curve's verdict (finite and clearly falling, or the step where it
//! went wrong), a checksum of its parameters after training (identical on every rank of one
//! data-parallel group, else silent data corruption), whether its parameters changed after
//! their last update, its median step time after warm-up, throughput and, on GPU, MFU and the
//! power draw and SM clock during the timed steps ([`load`]).

pub mod comm;
mod gpt;
mod load;
mod resnet;
mod ring_comm;

use anyhow::{Context, Result};
use gpusanity_common::config::models::{GptCheckConfig, ResnetCheckConfig};
use gpusanity_common::findings::Code;
use gpusanity_common::report::{CheckDetail, CheckStatus, DeviceKind, RankResult};
use gpusanity_models::cpu::CpuOps;
use gpusanity_models::cuda::CudaOps;
use gpusanity_models::train::{judge_losses, train, LossVerdict, Model, TrainOpts, TrainOutcome};

use gpusanity_common::registry::CheckId;
use gpusanity_common::stats::median;

use super::CheckCtx;
use crate::backend::WorkerPlace;
use comm::Groups;

/// Which model a model check trains, with its configuration.
pub enum Which {
    /// A GPT; `true`: tensor-parallel over the node (megatron-gpt).
    Gpt(GptCheckConfig, bool),
    Resnet(ResnetCheckConfig),
}

/// Runs model check `name` on this rank's device. A panic inside the CUDA bindings becomes an
/// error of this rank.
pub fn run(name: CheckId, which: Which, ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_here(name, &which, ctx))).unwrap_or_else(|p| {
        let why = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
        anyhow::bail!("{name} panicked: {}", why.unwrap_or_default())
    })
}

fn run_here(name: CheckId, which: &Which, ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    match ctx.backend.kind() {
        DeviceKind::Cpu => run_on(&mut CpuOps, name, which, ctx),
        DeviceKind::Cuda => {
            let device = ctx.backend.cuda_device().context("the CUDA backend shares no device")?;
            let mut ops = CudaOps::new(device).context("opening the model layer on the GPU")?;
            run_on(&mut ops, name, which, ctx)
        }
    }
}

fn run_on<O: Groups>(ops: &mut O, name: CheckId, which: &Which, ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    match which {
        Which::Gpt(cfg, tensor_parallel) => gpt::run(ops, name, cfg, *tensor_parallel, ctx),
        Which::Resnet(cfg) => resnet::run(ops, name, cfg, ctx),
    }
}

/// Which ranks a rank trains with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Global ranks of this rank's tensor-parallel group (consecutive ranks of one node).
    pub tp: Vec<usize>,
    /// Global ranks of this rank's data-parallel group (the same place in every TP group).
    pub dp: Vec<usize>,
}

impl Layout {
    /// Tensor-parallel groups of `tp` consecutive ranks inside each node (`tp = 0`: the whole
    /// node); data parallelism across them.
    pub fn new(place: &WorkerPlace, tp: usize) -> Result<Layout> {
        let node = place.node_ranks(place.node_rank);
        let tp = if tp == 0 { node.len() } else { tp };
        if let Some((n, size)) = place.node_sizes.iter().enumerate().find(|(_, s)| tp == 0 || **s % tp != 0) {
            anyhow::bail!("tensor-parallel size {tp} does not divide node {n}'s {size} workers");
        }
        let pos = place.rank - node.start;
        let (group, index) = (pos / tp, pos % tp);
        let start = node.start + group * tp;
        let dp = (0..place.node_sizes.len())
            .flat_map(|n| {
                let r = place.node_ranks(n);
                (0..r.len() / tp).map(move |g| r.start + g * tp + index)
            })
            .collect();
        Ok(Layout { tp: (start..start + tp).collect(), dp })
    }

    /// Data parallelism over every rank.
    pub fn data_parallel(place: &WorkerPlace) -> Layout {
        Layout { tp: vec![place.rank], dp: (0..place.world).collect() }
    }

    /// This rank's index in its TP group (its DP group's label).
    pub fn tp_index(&self, rank: usize) -> usize {
        self.tp.iter().position(|r| *r == rank).unwrap_or(0)
    }

    pub fn dp_index(&self, rank: usize) -> usize {
        self.dp.iter().position(|r| *r == rank).unwrap_or(0)
    }

    pub fn describe(&self) -> String {
        format!("TP {} x DP {}", self.tp.len(), self.dp.len())
    }
}

/// Dense bf16 tensor-core peak of known devices, TFLOP/s (vendor data sheets, SXM parts).
pub fn peak_bf16_tflops(device: &str) -> Option<f64> {
    const TABLE: &[(&str, f64)] = &[
        ("H100 PCIe", 756.0),
        ("H100", 989.0),
        ("H200", 989.0),
        ("H800", 989.0),
        ("H20", 148.0),
        ("B200", 2250.0),
        ("A100", 312.0),
        ("A800", 312.0),
        ("L40S", 362.0),
        ("A10", 125.0),
    ];
    TABLE.iter().find(|(name, _)| device.contains(name)).map(|(_, p)| *p)
}

/// Forward and backward passes per step of a rank with the `model-slow` fault.
const SLOW_REPEAT: usize = 6;

/// The fault-injection options of this rank.
fn train_opts(ctx: &CheckCtx<'_>, steps: usize, lr: f64, warmup: usize) -> TrainOpts {
    let rank = ctx.place.rank;
    TrainOpts {
        steps,
        lr: lr as f32,
        lr_warmup: warmup,
        weight_decay: 0.01,
        nan_at: ctx.faults.has("model-nan", rank).then_some(steps / 3),
        repeat: if ctx.faults.has("model-slow", rank) { SLOW_REPEAT } else { 1 },
        corrupt: ctx.faults.has("model-corrupt", rank),
        graphs: true,
        bucket_bytes: gpusanity_models::train::BUCKET_BYTES,
    }
}

/// What a model check trains and how it is judged.
pub struct Plan<'a> {
    pub name: CheckId,
    pub layout: Layout,
    pub steps: usize,
    pub lr: f64,
    pub warmup: usize,
    pub min_loss_drop: f64,
    /// Tokens or images of one step of this rank's replica, and their unit.
    pub items_per_step: f64,
    pub unit: &'a str,
}

/// Joins this rank's tensor- and data-parallel groups, trains `model` and judges the run.
pub fn train_check<O: Groups, M: Model<O>>(
    ops: &mut O,
    model: &mut M,
    ctx: &mut CheckCtx<'_>,
    plan: Plan<'_>,
) -> Result<RankResult> {
    let (place, name, layout) = (ctx.place, plan.name, &plan.layout);
    ctx.progress.phase(name, "connect", 0);
    let tp_index = layout.tp_index(place.rank);
    let mut tp = ops.group(place, ctx.store, &format!("{name}/tp/{}", layout.tp[0]), &layout.tp)?;
    let mut dp = ops.group(place, ctx.store, &format!("{name}/dp/{tp_index}"), &layout.dp)?;
    let opts = train_opts(ctx, plan.steps, plan.lr, plan.warmup);
    let progress = ctx.progress;
    let first_timed = first_timed(plan.warmup, plan.steps);
    let mut watch = load::Watch::new(ctx.backend, first_timed, plan.steps);
    let out = train(ops, model, dp.as_mut(), tp.as_mut(), &opts, &mut |s| {
        watch.step(s);
        progress.phase(name, "train", s as u64);
    })?;
    let flops_per_step = model.flops_per_step();
    let mut r = rank_result(
        place.rank,
        Measured { out, flops_per_step, plan: &plan, device: ctx.backend.device_name(), ops: ops.describe() },
    );
    let timed_steps = format!("{first_timed}..{}", plan.steps.saturating_sub(1));
    load::record(&mut r, watch.finish(), &timed_steps);
    Ok(r)
}

/// The first of the timed steps (after the warm-up; the last step if there are no more).
fn first_timed(warmup: usize, steps: usize) -> usize {
    warmup.min(steps.saturating_sub(1))
}

/// What one model run measured.
struct Measured<'a> {
    out: TrainOutcome,
    flops_per_step: f64,
    plan: &'a Plan<'a>,
    device: String,
    ops: String,
}

/// The rank result of a model run.
fn rank_result(rank: usize, m: Measured<'_>) -> RankResult {
    let (out, plan) = (&m.out, m.plan);
    let timed = |v: &[f64]| median(v.get(first_timed(plan.warmup, v.len())..).unwrap_or(v));
    let (step, compute) = (timed(&out.step_s), timed(&out.compute_s));
    let mut r = RankResult::new(rank, CheckStatus::Passed);
    let mut problems = Vec::new();
    let mut loss_finding = None;
    match judge_losses(&out.losses, plan.min_loss_drop as f32) {
        LossVerdict::Ok => {}
        LossVerdict::NotFinite { step, value } => {
            r.metrics.insert("first_bad_step".into(), step as f64);
            loss_finding = Some(Code::ModelLossNotFinite);
            problems.push(format!("loss is {value} at step {step}"));
        }
        LossVerdict::NotFalling { first, last, rising } => {
            loss_finding = Some(Code::ModelLossNotFalling);
            let how = if rising { "rising" } else { "flat" };
            problems.push(format!(
                "loss {how}: mean {first:.4} over the first steps, {last:.4} over the last (steps {}..{}), less than the {:.0}% drop required",
                out.losses.len() - (out.losses.len() / 5).max(1),
                out.losses.len() - 1,
                plan.min_loss_drop * 100.0
            ));
        }
    }
    let changed_at_rest = (out.checksum_after_update != out.checksum_final).then(|| {
        let sums =
            format!("checksum {:016x} after it, {:016x} at the end", out.checksum_after_update, out.checksum_final);
        problems.push(format!("parameters changed after their last update ({sums})"));
        sums
    });
    if !problems.is_empty() {
        r.status = CheckStatus::Failed;
        r.error = Some(problems.join("; "));
    }
    let first = out.losses.first().copied().unwrap_or(f32::NAN);
    let last = out.losses.last().copied().unwrap_or(f32::NAN);
    for (k, v) in [
        ("loss_first", first as f64),
        ("loss_final", last as f64),
        ("step_ms_median", step * 1e3),
        ("compute_ms_median", compute * 1e3),
        (&format!("{}_per_s", plan.unit) as &str, plan.items_per_step / step),
        ("tflops", m.flops_per_step / step / 1e12),
        ("params", out.param_count as f64),
        ("graph_steps", out.graph_steps as f64),
        ("dp_all_reduces_per_step", out.dp_buckets as f64),
    ] {
        // JSON has no NaN: a non-finite loss is `None` among the detail's losses.
        if v.is_finite() {
            r.metrics.insert(k.into(), v);
        }
    }
    if let Some(peak) = peak_bf16_tflops(&m.device) {
        r.metrics.insert("mfu".into(), m.flops_per_step / step / 1e12 / peak);
        r.notes.insert("mfu_peak".into(), format!("{peak} TFLOP/s dense bf16 ({})", m.device));
    }
    r.detail = Some(CheckDetail::Model {
        losses: out.losses.iter().map(|l| l.is_finite().then_some(f64::from(*l))).collect(),
        loss_finding,
        dp_group: plan.layout.tp_index(rank),
        param_checksum: format!("{:016x}", out.checksum_final),
        changed_at_rest,
    });
    r.notes.insert("layout".into(), plan.layout.describe());
    r.notes.insert("ops".into(), m.ops);
    if let Some(why) = &out.graph_error {
        r.notes.insert("graph_error".into(), why.clone());
    }
    r
}

#[cfg(test)]
mod tests;
