//! The training loop: bucketed, overlapped data-parallel sums; the loss verdicts; the
//! parameter checksum.

use super::*;
use crate::comm::Solo;
use crate::cpu::CpuOps;
use crate::gpt::{Gpt, GptConfig, GptShape};
use crate::resnet::{Resnet, ResnetConfig};

/// Eager training, no faults, lr 1e-2 and weight decay 0.01.
fn opts(steps: usize, bucket_bytes: usize) -> TrainOpts {
    TrainOpts {
        steps,
        lr: 1e-2,
        lr_warmup: 1,
        weight_decay: 0.01,
        nan_at: None,
        repeat: 1,
        corrupt: false,
        graphs: false,
        bucket_bytes,
    }
}

#[test]
fn progress_sees_every_step_then_the_end() {
    let shape = GptShape { vocab: 8, ctx: 4, layers: 1, heads: 2, dim: 8, batch: 2 };
    let mut ops = CpuOps;
    let mut m = Gpt::new(&mut ops, GptConfig { shape, tp_size: 1, tp_rank: 0, seed: 1, data_seed: 1 }).unwrap();
    let opts = TrainOpts { lr: 1e-3, weight_decay: 0.0, ..opts(3, BUCKET_BYTES) };
    let mut seen = Vec::new();
    train(&mut ops, &mut m, &mut Solo, &mut Solo, &opts, &mut |s| seen.push(s)).unwrap();
    assert_eq!(seen, [0, 1, 2, 3]);
}

#[test]
fn buckets_run_from_the_last_parameter_back_and_cover_each_once() {
    // 80 bytes hold two parameters of 10 f32.
    assert_eq!(buckets(&[10, 10, 10], 80), [1..3, 0..1]);
    // One larger than the cap is a bucket of its own.
    assert_eq!(buckets(&[5, 100, 5], 80), [2..3, 1..2, 0..1]);
    assert_eq!(buckets(&[3, 4], BUCKET_BYTES), vec![std::ops::Range { start: 0, end: 2 }]);
    assert!(buckets(&[], 80).is_empty());
    let lens: Vec<usize> = (0..50).map(|i| (i * 37) % 23).collect();
    let bs = buckets(&lens, 40);
    assert_eq!(bs.first().map(|r| r.end), Some(50));
    assert_eq!(bs.last().map(|r| r.start), Some(0));
    for w in bs.windows(2) {
        assert!(w[1].end == w[0].start && !w[0].is_empty(), "{bs:?}");
    }
}

/// A data-parallel group of two replicas with the same gradient: the sum doubles it.
struct Twice {
    buckets: usize,
}

impl Comm<Vec<f32>> for Twice {
    fn size(&self) -> usize {
        2
    }
    fn rank(&self) -> usize {
        0
    }
    fn all_reduce_sum(&mut self, buf: &mut Vec<f32>) -> Result<()> {
        buf.iter_mut().for_each(|x| *x *= 2.0);
        Ok(())
    }
    fn all_reduce_sum_bucket(&mut self, bufs: &mut [&mut Vec<f32>]) -> Result<()> {
        self.buckets += 1;
        bufs.iter_mut().try_for_each(|b| self.all_reduce_sum(b))
    }
}

/// Every gradient is summed exactly once a step: doubled by the sum and halved by the
/// update's 1 / replicas (both exact), training ends with the parameters of one replica
/// alone, bit for bit; a gradient summed twice or not at all would differ.
#[test]
fn every_gradient_is_summed_once_per_step() {
    let shape = GptShape { vocab: 8, ctx: 4, layers: 2, heads: 2, dim: 8, batch: 2 };
    let cfg = GptConfig { shape, tp_size: 1, tp_rank: 0, seed: 1, data_seed: 1 };
    let opts = opts(3, BUCKET_BYTES);
    let mut ops = CpuOps;
    let mut m = Gpt::new(&mut ops, cfg.clone()).unwrap();
    let alone = train(&mut ops, &mut m, &mut Solo, &mut Solo, &opts, &mut |_| {}).unwrap();
    assert_eq!(alone.dp_buckets, 0);
    let mut dp = Twice { buckets: 0 };
    let mut m = Gpt::new(&mut ops, cfg).unwrap();
    let pair = train(&mut ops, &mut m, &mut dp, &mut Solo, &opts, &mut |_| {}).unwrap();
    assert_eq!(pair.dp_buckets, 1, "a small model's gradients fit one bucket");
    assert_eq!(dp.buckets, opts.steps);
    assert_eq!(pair.checksum_final, alone.checksum_final);
    assert_eq!(pair.losses, alone.losses);

    // The ResNet's blocks, each its own bucket or more, at 64 bytes a bucket.
    let cfg = ResnetConfig { image: 12, batch: 3, width: 2, blocks: vec![1, 2], classes: 3, seed: 4, data_seed: 1 };
    let opts = TrainOpts { bucket_bytes: 64, ..opts };
    let mut m = Resnet::new(&mut ops, cfg.clone()).unwrap();
    let alone = train(&mut ops, &mut m, &mut Solo, &mut Solo, &opts, &mut |_| {}).unwrap();
    let mut dp = Twice { buckets: 0 };
    let mut m = Resnet::new(&mut ops, cfg).unwrap();
    let pair = train(&mut ops, &mut m, &mut dp, &mut Solo, &opts, &mut |_| {}).unwrap();
    assert!(pair.dp_buckets > 10, "{} buckets", pair.dp_buckets);
    assert_eq!(dp.buckets, opts.steps * pair.dp_buckets);
    assert_eq!(pair.checksum_final, alone.checksum_final);
}

/// Shared between the spy model and its data-parallel group.
#[derive(Default)]
struct Seen {
    in_backward: std::cell::Cell<bool>,
    /// Per started bucket: its buffers' sums as they were when it started, and whether the
    /// backward was still running.
    started: std::cell::RefCell<Vec<(Vec<Vec<f32>>, bool)>>,
    finished: std::cell::Cell<usize>,
}

/// A GPT that says when its forward and backward run.
struct Spy<'a>(Gpt<Vec<f32>>, &'a Seen);

impl Model<CpuOps> for Spy<'_> {
    fn params_mut(&mut self) -> &mut [Param<Vec<f32>>] {
        Model::<CpuOps>::params_mut(&mut self.0)
    }
    fn load_batch(&mut self, ops: &mut CpuOps, step: usize) -> Result<()> {
        self.0.load_batch(ops, step)
    }
    fn forward_backward(
        &mut self,
        ops: &mut CpuOps,
        tp: &mut dyn Comm<Vec<f32>>,
        grads: &mut dyn GradsReady<Vec<f32>>,
    ) -> Result<()> {
        self.1.in_backward.set(true);
        let r = self.0.forward_backward(ops, tp, grads);
        self.1.in_backward.set(false);
        r
    }
    fn loss(&mut self, ops: &mut CpuOps) -> Result<f32> {
        self.0.loss(ops)
    }
    fn graph_key(&self) -> usize {
        0
    }
    fn flops_per_step(&self) -> f64 {
        Model::<CpuOps>::flops_per_step(&self.0)
    }
}

/// Two replicas with the same gradient, summed from the values the buffers held when the
/// bucket started (as a transport that sends them then would): a bucket started before
/// its gradients were final would sum stale values.
struct Later<'a>(&'a Seen);

impl Comm<Vec<f32>> for Later<'_> {
    fn size(&self) -> usize {
        2
    }
    fn rank(&self) -> usize {
        0
    }
    fn all_reduce_sum(&mut self, buf: &mut Vec<f32>) -> Result<()> {
        buf.iter_mut().for_each(|x| *x *= 2.0);
        Ok(())
    }
    fn start_bucket(&mut self, bufs: &mut [&mut Vec<f32>]) -> Result<()> {
        let sums = bufs.iter().map(|b| b.iter().map(|x| 2.0 * x).collect()).collect();
        self.0.started.borrow_mut().push((sums, self.0.in_backward.get()));
        Ok(())
    }
    fn finish_bucket(&mut self, bufs: &mut [&mut Vec<f32>]) -> Result<()> {
        let i = self.0.finished.get();
        let started = self.0.started.borrow();
        let sums = &started[i].0;
        let lens: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
        assert_eq!(sums.iter().map(Vec::len).collect::<Vec<_>>(), lens, "buckets finish in the order they started");
        for (b, s) in bufs.iter_mut().zip(sums) {
            b.copy_from_slice(s);
        }
        self.0.finished.set(i + 1);
        Ok(())
    }
}

/// With small buckets the sums start while the backward still runs, one bucket after
/// another from the LM head back; only the embeddings' bucket waits for its end. Every
/// bucket finishes once, in order, before the update, which sees every sum (the
/// parameters end as one replica's alone).
#[test]
fn buckets_start_during_the_backward_and_finish_before_the_update() {
    let shape = GptShape { vocab: 8, ctx: 4, layers: 3, heads: 2, dim: 8, batch: 2 };
    let cfg = GptConfig { shape, tp_size: 1, tp_rank: 0, seed: 1, data_seed: 1 };
    let opts = opts(2, 1024);
    let mut ops = CpuOps;
    let mut m = Gpt::new(&mut ops, cfg.clone()).unwrap();
    let alone = train(&mut ops, &mut m, &mut Solo, &mut Solo, &opts, &mut |_| {}).unwrap();
    let seen = Seen::default();
    let mut spy = Spy(Gpt::new(&mut ops, cfg).unwrap(), &seen);
    let pair = train(&mut ops, &mut spy, &mut Later(&seen), &mut Solo, &opts, &mut |_| {}).unwrap();
    assert_eq!(pair.checksum_final, alone.checksum_final);
    let started = seen.started.borrow();
    let per_step = pair.dp_buckets;
    assert!(per_step >= 4, "{per_step} buckets");
    assert_eq!(started.len(), opts.steps * per_step);
    assert_eq!(seen.finished.get(), started.len());
    for step in started.chunks(per_step) {
        let during = step.iter().filter(|s| s.1).count();
        assert!(during >= per_step - 1, "only {during} of {per_step} buckets started during the backward");
    }
}

#[test]
fn chunked_hashing_is_the_digest_of_the_same_bytes() {
    let values: Vec<f32> = (0..(2 * HASH_CHUNK + 17)).map(|i| i as f32 * 0.37 - 5.0).collect();
    let mut one_by_one = xxhash_rust::xxh3::Xxh3::new();
    for v in &values {
        one_by_one.update(&v.to_le_bytes());
    }
    let mut chunked = xxhash_rust::xxh3::Xxh3::new();
    hash_f32s(&mut chunked, &values, &mut Vec::new());
    assert_eq!(chunked.digest(), one_by_one.digest());
    let mut flipped = values.clone();
    flipped[HASH_CHUNK + 3] = f32::from_bits(flipped[HASH_CHUNK + 3].to_bits() ^ (1 << 20));
    let mut other = xxhash_rust::xxh3::Xxh3::new();
    hash_f32s(&mut other, &flipped, &mut Vec::new());
    assert_ne!(other.digest(), one_by_one.digest(), "one flipped bit changes the digest");
}

#[test]
fn loss_verdicts() {
    assert_eq!(judge_losses(&[4.0, 3.0, 2.0, 1.0, 0.5], 0.2), LossVerdict::Ok);
    assert!(matches!(judge_losses(&[4.0, 3.0, f32::NAN, 1.0], 0.2), LossVerdict::NotFinite { step: 2, .. }));
    assert!(matches!(judge_losses(&[4.0, f32::INFINITY], 0.2), LossVerdict::NotFinite { step: 1, .. }));
    assert!(matches!(judge_losses(&[4.0, 4.0, 4.01, 3.99, 4.0], 0.2), LossVerdict::NotFalling { rising: false, .. }));
    assert!(matches!(judge_losses(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.2), LossVerdict::NotFalling { rising: true, .. }));
}
