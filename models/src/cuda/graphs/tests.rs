//! The step graphs on a GPU: training with graphs against the same training op by op, and a
//! write between graph steps that the next step must see.

use cudarc::driver::CudaSlice;

use crate::comm::Solo;
use crate::cuda::tests::{gpu, train_opts};
use crate::cuda::CudaOps;
use crate::gpt::{Gpt, GptConfig, GptShape};
use crate::ops::Ops;
use crate::resnet::{Resnet, ResnetConfig};
use crate::train::{train, Model, TrainOpts, GRAPH_FROM};

/// A GPT whose products all run on bf16 twins (every side at least 256) and whose attention
/// is the fused one.
fn twin_gpt() -> GptConfig {
    GptConfig {
        shape: GptShape { vocab: 512, ctx: 256, layers: 2, heads: 4, dim: 256, batch: 2 },
        tp_size: 1,
        tp_rank: 0,
        seed: 3,
        data_seed: 4,
    }
}

fn graph_opts(steps: usize, graphs: bool) -> TrainOpts {
    train_opts(steps, 1e-3, graphs)
}

/// Steps replayed from CUDA graphs compute what the same steps op by op compute: the GPT (bf16
/// twins, fused attention) and the ResNet (one graph per batch of its pool).
#[test]
#[ignore = "needs a CUDA GPU"]
fn step_graphs_train_as_op_by_op() {
    let steps = 8;
    let mut g = gpu();
    let weights = |g: &mut CudaOps, m: &mut Gpt<CudaSlice<f32>>| -> Vec<f32> {
        Model::<CudaOps>::params_mut(m).iter().flat_map(|p| g.download(&p.w).unwrap()).collect()
    };
    let (mut runs, mut w0) = (Vec::new(), Vec::new());
    for graphs in [false, true] {
        let mut m = Gpt::new(&mut g, twin_gpt()).unwrap();
        w0 = weights(&mut g, &mut m);
        let out = train(&mut g, &mut m, &mut Solo, &mut Solo, &graph_opts(steps, graphs), &mut |_| {}).unwrap();
        runs.push((out, weights(&mut g, &mut m)));
    }
    let ((eager, w_eager), (graphed, w_graphed)) = (&runs[0], &runs[1]);
    assert_eq!(eager.graph_steps, 0);
    assert_eq!(graphed.graph_error, None);
    assert_eq!(graphed.graph_steps, steps - GRAPH_FROM, "steps from a graph");
    for (a, b) in eager.losses.iter().zip(&graphed.losses) {
        assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{:?} {:?}", eager.losses, graphed.losses);
    }
    // Not bit for bit: cuBLAS may pick other kernels (another workspace) inside a graph, and
    // AdamW turns the last bits of a near-zero gradient into a whole step of either sign. But
    // the two runs end far closer to each other than to where they started: a replay on a
    // stale twin or a wrong buffer would differ by as much as the updates themselves.
    let mean_abs =
        |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).sum::<f64>() / a.len() as f64;
    let (moved, apart) = (mean_abs(&w0, w_eager), mean_abs(w_eager, w_graphed));
    assert!(apart < 0.05 * moved, "the runs end {apart:e} apart per parameter; training moved them {moved:e}");

    let cfg =
        ResnetConfig { image: 32, batch: 8, width: 8, blocks: vec![1, 1, 1, 1], classes: 4, seed: 1, data_seed: 2 };
    let mut losses = Vec::new();
    for graphs in [false, true] {
        let mut m = Resnet::new(&mut g, cfg.clone()).unwrap();
        let out = train(&mut g, &mut m, &mut Solo, &mut Solo, &graph_opts(12, graphs), &mut |_| {}).unwrap();
        assert_eq!(out.graph_error, None);
        assert_eq!(out.graph_steps, if graphs { 12 - GRAPH_FROM } else { 0 });
        losses.push(out.losses);
    }
    for (a, b) in losses[0].iter().zip(&losses[1]) {
        assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{:?} {:?}", losses[0], losses[1]);
    }
}

/// A NaN written into a weight between graph steps (its bf16 twin now stale) still reaches the
/// loss: the step does not replay a graph that skips the twin's conversion.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_weight_poisoned_between_graph_steps_reaches_the_loss() {
    let mut g = gpu();
    let mut m = Gpt::new(&mut g, twin_gpt()).unwrap();
    let opts = TrainOpts { nan_at: Some(5), ..graph_opts(7, true) };
    let out = train(&mut g, &mut m, &mut Solo, &mut Solo, &opts, &mut |_| {}).unwrap();
    assert!(out.losses[..5].iter().all(|l| l.is_finite()), "{:?}", out.losses);
    assert!(!out.losses[5].is_finite(), "{:?}", out.losses);
    assert!(out.graph_steps >= 3, "{out:?}");
}
