//! The training loop shared by the models: a step is load batch, forward and backward
//! (the model's, with the data-parallel gradient sums started in buckets as it goes), AdamW.
//! Records each step's loss and time and checksums the parameters at the end.

use std::time::Instant;

use crate::comm::Comm;
use crate::ops::{Adam, GraphRun, Ops};
use crate::Result;

mod buckets;

use buckets::Overlap;
pub use buckets::{buckets, GradsReady, NotWatching, BUCKET_BYTES};

/// A learnable tensor with its gradient and AdamW moments.
pub struct Param<B> {
    pub name: String,
    pub w: B,
    pub g: B,
    m: B,
    v: B,
    /// Whether weight decay applies (matrices, not norms or biases).
    pub decay: bool,
}

impl<B> Param<B> {
    pub fn new<O: Ops<Buf = B>>(ops: &mut O, name: String, init: &[f32], decay: bool) -> Result<Param<B>> {
        let n = init.len();
        Ok(Param { name, w: ops.upload(init)?, g: ops.zeros(n)?, m: ops.zeros(n)?, v: ops.zeros(n)?, decay })
    }
}

/// A model the loop can train.
pub trait Model<O: Ops> {
    fn params_mut(&mut self) -> &mut [Param<O::Buf>];
    /// Loads the synthetic batch of step `step` onto the device.
    fn load_batch(&mut self, ops: &mut O, step: usize) -> Result<()>;
    /// Enqueues forward and backward on the loaded batch, leaving the gradients in the
    /// parameters and each example's loss on the device; reads nothing back, so that a backend
    /// can record it as a graph (the same work on the same buffers for the same
    /// [`Model::graph_key`]). `tp` is the tensor-parallel group (a one-rank group for a model
    /// without tensor parallelism). As the backward goes, it tells `grads` each time the
    /// gradients of a further run of parameters are final, so that their data-parallel sum
    /// can start while it computes the rest.
    fn forward_backward(
        &mut self,
        ops: &mut O,
        tp: &mut dyn Comm<O::Buf>,
        grads: &mut dyn GradsReady<O::Buf>,
    ) -> Result<()>;
    /// This rank's mean loss of the last forward (reads it back: waits for the device).
    fn loss(&mut self, ops: &mut O) -> Result<f32>;
    /// Which step graph the loaded batch's forward and backward are: steps with the same key
    /// enqueue the same work on the same buffers.
    fn graph_key(&self) -> usize;
    /// Floating-point operations of one training step on this rank (matrix products, forward
    /// and backward).
    fn flops_per_step(&self) -> f64;
}

#[derive(Debug, Clone, PartialEq)]
pub struct TrainOpts {
    pub steps: usize,
    pub lr: f32,
    /// The learning rate ramps up linearly over this many first steps.
    pub lr_warmup: usize,
    pub weight_decay: f32,
    /// Fault injection: poison a parameter with NaN before this step's forward.
    pub nan_at: Option<usize>,
    /// Fault injection: run each step's forward and backward this many times (the device
    /// really does the work; 1 = healthy).
    pub repeat: usize,
    /// Fault injection: flip a bit of one parameter after training, before the final checksum.
    pub corrupt: bool,
    /// Forward and backward as step graphs from step [`GRAPH_FROM`] on, where the backend has
    /// them ([`Ops::graph_step`]) and the model runs on one rank of tensor parallelism.
    pub graphs: bool,
    /// The most gradient bytes per data-parallel collective ([`BUCKET_BYTES`]).
    pub bucket_bytes: usize,
}

/// The first step that may run as a graph: the ones before make the operand copies and grow
/// the scratch buffers (neither may happen in a graph), so that the state a graph is recorded
/// in is the one every later step starts from.
pub const GRAPH_FROM: usize = 2;

#[derive(Debug, Clone, PartialEq)]
pub struct TrainOutcome {
    /// This rank's mean loss at each step.
    pub losses: Vec<f32>,
    /// Seconds of each step (from a synchronized device to a synchronized device).
    pub step_s: Vec<f64>,
    /// Seconds of each step's own work: batch, forward and backward, before the data-parallel
    /// all-reduce makes every rank wait for the slowest.
    pub compute_s: Vec<f64>,
    /// xxh3 of every parameter's bytes right after the last update...
    pub checksum_after_update: u64,
    /// ...and when the check reads them at the end (differs only if memory changed at rest).
    pub checksum_final: u64,
    pub param_count: usize,
    /// Steps whose forward and backward ran from a graph (recorded or replayed).
    pub graph_steps: usize,
    /// Why a step graph could not be recorded (the steps then ran op by op), if one could not.
    pub graph_error: Option<String>,
    /// Data-parallel all-reduces per step (buckets of gradients; 0 on one replica).
    pub dp_buckets: usize,
}

/// The hash of every parameter's value, in order.
pub fn checksum<O: Ops>(ops: &mut O, params: &[Param<O::Buf>]) -> Result<u64> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut bytes = Vec::with_capacity(HASH_CHUNK * 4);
    for p in params {
        hash_f32s(&mut h, &ops.download(&p.w)?, &mut bytes);
    }
    Ok(h.digest())
}

/// Floats hashed per call of the hasher: one call per float cost seconds on a model of 400 M
/// parameters; the bytes (little-endian, so the digest is the same on every host) go in by
/// the chunk, and the digest is that of the same byte stream.
const HASH_CHUNK: usize = 1 << 16;

fn hash_f32s(h: &mut xxhash_rust::xxh3::Xxh3, values: &[f32], bytes: &mut Vec<u8>) {
    for chunk in values.chunks(HASH_CHUNK) {
        bytes.clear();
        for v in chunk {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        h.update(bytes);
    }
}

/// Trains `model` for `opts.steps` steps; `progress` is told each step's number before the
/// step (the device idle, the previous step synchronized), and `opts.steps` once the last step
/// has finished, before the checksums: a caller can watch the device over any run of steps.
pub fn train<O: Ops, M: Model<O>>(
    ops: &mut O,
    model: &mut M,
    dp: &mut dyn Comm<O::Buf>,
    tp: &mut dyn Comm<O::Buf>,
    opts: &TrainOpts,
    progress: &mut dyn FnMut(usize),
) -> Result<TrainOutcome> {
    let mut losses = Vec::with_capacity(opts.steps);
    let mut step_s = Vec::with_capacity(opts.steps);
    let mut compute_s = Vec::with_capacity(opts.steps);
    let grad_scale = 1.0 / dp.size() as f32;
    let graphs = opts.graphs && tp.size() == 1;
    let (mut graph_steps, mut graph_error) = (0, None);
    let lens: Vec<usize> = model.params_mut().iter().map(|p| O::len(&p.g)).collect();
    let dp_buckets = if dp.size() > 1 { buckets(&lens, opts.bucket_bytes) } else { Vec::new() };
    for step in 0..opts.steps {
        progress(step);
        ops.sync()?;
        let start = Instant::now();
        model.load_batch(ops, step)?;
        if opts.nan_at == Some(step) {
            if let Some(p) = model.params_mut().first_mut() {
                ops.set(&mut p.w, 0, f32::NAN)?;
            }
        }
        let key = model.graph_key();
        let mut graphed = false;
        let mut sums = Overlap { dp: &mut *dp, buckets: &dp_buckets, started: 0 };
        let reps = opts.repeat.max(1);
        for rep in 0..reps {
            if !graphs || step < GRAPH_FROM {
                // The sums overlap the last pass's backward only: each pass rewrites the
                // gradients.
                let grads: &mut dyn GradsReady<O::Buf> = if rep + 1 == reps { &mut sums } else { &mut NotWatching };
                model.forward_backward(ops, tp, grads)?;
                continue;
            }
            let mut body = |o: &mut O| model.forward_backward(o, tp, &mut NotWatching);
            match ops.graph_step(key, &mut body)? {
                GraphRun::Recorded | GraphRun::Replayed => graphed = true,
                GraphRun::Failed(why) => {
                    graph_error.get_or_insert(why);
                }
                GraphRun::Eager | GraphRun::Stale => {}
            }
        }
        graph_steps += usize::from(graphed);
        let loss = model.loss(ops)?;
        ops.sync()?;
        compute_s.push(start.elapsed().as_secs_f64());
        let params = model.params_mut();
        sums.finish(params)?;
        for p in params {
            let a = Adam {
                lr: opts.lr * ((step + 1) as f32 / opts.lr_warmup.max(1) as f32).min(1.0),
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: if p.decay { opts.weight_decay } else { 0.0 },
                step: step as u32 + 1,
                grad_scale,
            };
            ops.adamw(&mut p.w, &p.g, &mut p.m, &mut p.v, a)?;
        }
        ops.sync()?;
        step_s.push(start.elapsed().as_secs_f64());
        losses.push(loss);
    }
    ops.drop_graphs();
    progress(opts.steps);
    let checksum_after_update = checksum(ops, model.params_mut())?;
    if opts.corrupt {
        if let Some(p) = model.params_mut().last_mut() {
            let v = ops.download(&p.w)?;
            let i = v.len() / 2;
            if let Some(x) = v.get(i) {
                // One flipped mantissa bit, as a memory fault would flip it.
                ops.set(&mut p.w, i, f32::from_bits(x.to_bits() ^ (1 << 20)))?;
            }
        }
    }
    let checksum_final = checksum(ops, model.params_mut())?;
    let param_count = model.params_mut().iter().map(|p| O::len(&p.w)).sum();
    Ok(TrainOutcome {
        losses,
        step_s,
        compute_s,
        checksum_after_update,
        checksum_final,
        param_count,
        graph_steps,
        graph_error,
        dp_buckets: dp_buckets.len(),
    })
}

/// What the loss curve says, judged on a learnable task.
#[derive(Debug, Clone, PartialEq)]
pub enum LossVerdict {
    Ok,
    /// NaN or infinite at this step (0-based).
    NotFinite {
        step: usize,
        value: f32,
    },
    /// The mean of the last steps is not clearly below the mean of the first ones.
    NotFalling {
        first: f32,
        last: f32,
        rising: bool,
    },
}

/// Finite at every step, and the mean of the last `w` losses below `(1 - min_drop)` times the
/// mean of the first `w` (`w` a fifth of the steps, at least 1).
pub fn judge_losses(losses: &[f32], min_drop: f32) -> LossVerdict {
    if let Some((step, v)) = losses.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return LossVerdict::NotFinite { step, value: *v };
    }
    if losses.len() < 2 {
        return LossVerdict::Ok;
    }
    let w = (losses.len() / 5).max(1);
    let mean = |s: &[f32]| s.iter().sum::<f32>() / s.len() as f32;
    let (first, last) = (mean(&losses[..w]), mean(&losses[losses.len() - w..]));
    if last < (1.0 - min_drop) * first {
        LossVerdict::Ok
    } else {
        LossVerdict::NotFalling { first, last, rising: last > first }
    }
}

#[cfg(test)]
mod tests;
