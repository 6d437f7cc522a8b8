//! The whole model's gradient against finite differences, tensor parallelism against the
//! single-rank model, and the loss falling on the synthetic task.

use std::sync::{Arc, Barrier, Mutex};

use super::*;
use crate::comm::Solo;
use crate::cpu::CpuOps;
use crate::train::{judge_losses, train, LossVerdict, NotWatching, TrainOpts};

fn tiny(tp_size: usize, tp_rank: usize) -> GptConfig {
    GptConfig {
        shape: GptShape { vocab: 11, ctx: 6, layers: 2, heads: 4, dim: 16, batch: 3 },
        tp_size,
        tp_rank,
        seed: 7,
        data_seed: 3,
    }
}

#[test]
fn gradients_match_finite_differences() {
    let mut ops = CpuOps;
    let mut m = Gpt::new(&mut ops, tiny(1, 0)).unwrap();
    m.load_batch(&mut ops, 0).unwrap();
    m.forward_backward(&mut ops, &mut Solo, &mut NotWatching).unwrap();
    let grads: Vec<Vec<f32>> = m.params.iter().map(|p| p.g.clone()).collect();
    let h = 1e-2f32;
    for (pi, g) in grads.iter().enumerate() {
        // The element with the largest gradient, and one in the middle.
        let big = (0..g.len()).max_by(|a, b| g[*a].abs().total_cmp(&g[*b].abs())).unwrap();
        for i in [big, g.len() / 2] {
            let w0 = m.params[pi].w[i];
            let mut loss_at = |w: f32| {
                m.params[pi].w[i] = w;
                m.forward_backward(&mut ops, &mut Solo, &mut NotWatching).unwrap();
                m.loss(&mut ops).unwrap() as f64
            };
            let num = (loss_at(w0 + h) - loss_at(w0 - h)) / (2.0 * h as f64);
            m.params[pi].w[i] = w0;
            let err = (num - g[i] as f64).abs();
            assert!(err <= 2e-4 + 0.05 * num.abs(), "{}[{i}]: analytic {} numeric {num}", m.params[pi].name, g[i]);
        }
    }
}

/// The running sum and the number of ranks that added to it, and the group's barrier.
type Shared = Arc<(Mutex<(Vec<f32>, usize)>, Barrier)>;

/// Sum all-reduce between threads of one process.
struct ThreadComm {
    rank: usize,
    size: usize,
    shared: Shared,
}

impl Comm<Vec<f32>> for ThreadComm {
    fn size(&self) -> usize {
        self.size
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_reduce_sum(&mut self, buf: &mut Vec<f32>) -> crate::Result<()> {
        let (state, barrier) = &*self.shared;
        {
            let mut s = state.lock().unwrap();
            if s.1 == 0 {
                s.0 = buf.clone();
            } else {
                s.0.iter_mut().zip(buf.iter()).for_each(|(a, b)| *a += b);
            }
            s.1 += 1;
        }
        barrier.wait();
        buf.copy_from_slice(&state.lock().unwrap().0);
        barrier.wait();
        if self.rank == 0 {
            state.lock().unwrap().1 = 0;
        }
        barrier.wait();
        Ok(())
    }
}

fn opts(steps: usize) -> TrainOpts {
    TrainOpts {
        steps,
        lr_warmup: 1,
        lr: 3e-3,
        weight_decay: 0.01,
        nan_at: None,
        repeat: 1,
        corrupt: false,
        graphs: false,
        bucket_bytes: crate::train::BUCKET_BYTES,
    }
}

#[test]
fn tensor_parallel_model_matches_the_single_rank_model() {
    let single = {
        let mut ops = CpuOps;
        let mut m = Gpt::new(&mut ops, tiny(1, 0)).unwrap();
        train(&mut ops, &mut m, &mut Solo, &mut Solo, &opts(4), &mut |_| {}).unwrap().losses
    };
    for tp in [2, 4] {
        let shared: Shared = Arc::new((Mutex::new((Vec::new(), 0)), Barrier::new(tp)));
        let handles: Vec<_> = (0..tp)
            .map(|r| {
                let shared = shared.clone();
                std::thread::spawn(move || {
                    let mut ops = CpuOps;
                    let mut m = Gpt::new(&mut ops, tiny(tp, r)).unwrap();
                    let mut comm = ThreadComm { rank: r, size: tp, shared };
                    train(&mut ops, &mut m, &mut Solo, &mut comm, &opts(4), &mut |_| {}).unwrap().losses
                })
            })
            .collect();
        for h in handles {
            let losses = h.join().unwrap();
            for (a, b) in losses.iter().zip(&single) {
                assert!((a - b).abs() <= 1e-4 * b.abs(), "tp {tp}: {losses:?} vs {single:?}");
            }
        }
    }
    // A wrong layout is refused, not run.
    let mut bad = tiny(3, 0);
    bad.shape.heads = 4;
    assert!(Gpt::new(&mut CpuOps, bad).is_err());
}

#[test]
fn loss_falls_on_the_synthetic_task_and_nan_is_caught() {
    let mut ops = CpuOps;
    let cfg = GptConfig {
        shape: GptShape { vocab: 32, ctx: 16, layers: 2, heads: 2, dim: 32, batch: 4 },
        tp_size: 1,
        tp_rank: 0,
        seed: 1,
        data_seed: 2,
    };
    let mut m = Gpt::new(&mut ops, cfg.clone()).unwrap();
    let out = train(&mut ops, &mut m, &mut Solo, &mut Solo, &opts(30), &mut |_| {}).unwrap();
    assert_eq!(judge_losses(&out.losses, 0.3), LossVerdict::Ok, "{:?}", out.losses);
    assert_eq!(out.checksum_after_update, out.checksum_final);
    let mut m = Gpt::new(&mut ops, cfg).unwrap();
    let o = TrainOpts { nan_at: Some(5), corrupt: true, ..opts(8) };
    let out = train(&mut ops, &mut m, &mut Solo, &mut Solo, &o, &mut |_| {}).unwrap();
    assert!(matches!(judge_losses(&out.losses, 0.3), LossVerdict::NotFinite { step: 5, .. }), "{:?}", out.losses);
    assert_ne!(out.checksum_after_update, out.checksum_final);
}
