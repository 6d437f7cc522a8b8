//! The ResNet's gradient against finite differences and its loss falling on the image task.

use super::*;
use crate::comm::Solo;
use crate::cpu::CpuOps;
use crate::train::{judge_losses, train, LossVerdict, NotWatching, TrainOpts};

fn tiny() -> ResnetConfig {
    ResnetConfig { image: 12, batch: 3, width: 2, blocks: vec![1, 2], classes: 3, seed: 4, data_seed: 1 }
}

#[test]
fn gradients_match_finite_differences() {
    let mut ops = CpuOps;
    let mut m = Resnet::new(&mut ops, tiny()).unwrap();
    m.load_batch(&mut ops, 0).unwrap();
    m.forward_backward(&mut ops, &mut Solo, &mut NotWatching).unwrap();
    let grads: Vec<Vec<f32>> = m.params.iter().map(|p| p.g.clone()).collect();
    // Small steps: ReLU and max-pool kinks make wide differences unreliable.
    let h = 3e-4f32;
    let mut checked = 0;
    for (pi, g) in grads.iter().enumerate() {
        let big = (0..g.len()).max_by(|a, b| g[*a].abs().total_cmp(&g[*b].abs())).unwrap();
        let w0 = m.params[pi].w[big];
        let mut loss_at = |w: f32| {
            m.params[pi].w[big] = w;
            m.forward_backward(&mut ops, &mut Solo, &mut NotWatching).unwrap();
            m.loss(&mut ops).unwrap() as f64
        };
        let num = (loss_at(w0 + h) - loss_at(w0 - h)) / (2.0 * h as f64);
        m.params[pi].w[big] = w0;
        let err = (num - g[big] as f64).abs();
        assert!(err <= 3e-3 + 0.05 * num.abs(), "{}[{big}]: analytic {} numeric {num}", m.params[pi].name, g[big]);
        checked += 1;
    }
    assert_eq!(checked, m.params.len());
}

#[test]
fn loss_falls_on_the_image_task() {
    let mut ops = CpuOps;
    let cfg =
        ResnetConfig { image: 32, batch: 8, width: 8, blocks: vec![1, 1, 1, 1], classes: 4, seed: 1, data_seed: 2 };
    let mut m = Resnet::new(&mut ops, cfg).unwrap();
    let opts = TrainOpts {
        steps: 20,
        lr_warmup: 1,
        lr: 2e-3,
        weight_decay: 0.01,
        nan_at: None,
        repeat: 1,
        corrupt: false,
        graphs: false,
        bucket_bytes: crate::train::BUCKET_BYTES,
    };
    let out = train(&mut ops, &mut m, &mut Solo, &mut Solo, &opts, &mut |_| {}).unwrap();
    assert_eq!(judge_losses(&out.losses, 0.2), LossVerdict::Ok, "{:?}", out.losses);
    assert!(Model::<CpuOps>::flops_per_step(&m) > 0.0);
    // A NaN in the stem's weights reaches the loss (ReLU and max pooling pass NaN on).
    let mut m = Resnet::new(&mut ops, tiny()).unwrap();
    let nan = TrainOpts { nan_at: Some(2), steps: 4, ..opts };
    let out = train(&mut ops, &mut m, &mut Solo, &mut Solo, &nan, &mut |_| {}).unwrap();
    assert!(matches!(judge_losses(&out.losses, 0.2), LossVerdict::NotFinite { step: 2, .. }), "{:?}", out.losses);
    let bad = ResnetConfig { blocks: vec![], ..tiny() };
    assert!(Resnet::new(&mut ops, bad).is_err());
}
