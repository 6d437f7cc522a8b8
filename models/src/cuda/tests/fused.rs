//! The fused products (cuBLASLt epilogues) against the separate ops on the same GPU, at a shape
//! they fuse: the same bf16 operands and f32 accumulation, so they differ by the results'
//! rounding to bf16 alone.

use super::{gpu, rnd};
use crate::cuda::CudaOps;
use crate::ops::{Mm, Ops};

/// The bf16 value of `b` (held only in its twin) as f32s.
fn half_value(g: &mut CudaOps, b: &cudarc::driver::CudaSlice<f32>) -> Vec<f32> {
    let at = crate::cuda::twins::address(b);
    let t = g.twins.take(at).expect("a twin");
    assert!(t.valid && t.only, "the fused result lives in the twin alone");
    let bits = g.stream().clone_dtoh(&t.half).unwrap();
    g.twins.put(at, t);
    bits[..b.len()].iter().map(|&h| f32::from_bits((h as u32) << 16)).collect()
}

/// `got` within `rel` of `want` per element, relative to the largest magnitude of `want`.
fn near(name: &str, want: &[f32], got: &[f32], rel: f32) {
    assert_eq!(want.len(), got.len(), "{name}");
    let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
    let worst = want.iter().zip(got).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= rel * scale, "{name}: worst difference {worst} (scale {scale})");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_products_match_the_separate_ops() {
    let mut g = gpu();
    assert!(g.lt.is_some(), "cuBLASLt epilogues missing: {:?}", g.lt_missing);
    assert!(g.describe().contains("fused into cuBLASLt epilogues"), "{}", g.describe());
    // A layer's MLP: n rows of c features, f hidden ones.
    let (n, c, f) = (512, 256, 1024);
    let up = |g: &mut CudaOps, len: usize, seed: u64, s: f32| {
        let x: Vec<f32> = rnd(len, seed).iter().map(|v| v * s).collect();
        g.upload(&x).unwrap()
    };
    let (a, w) = (up(&mut g, n * c, 40, 1.0), up(&mut g, c * f, 41, 0.1));
    let (bias, w2, dout) = (up(&mut g, f, 42, 0.5), up(&mut g, f * c, 43, 0.05), up(&mut g, n * c, 44, 1.0));
    let z = |g: &mut CudaOps, len: usize| g.zeros(len).unwrap();
    let mm = Mm::new(n, f, c);

    // out = a w + bias.
    let (mut want, mut got) = (z(&mut g, n * f), z(&mut g, n * f));
    g.matmul(mm, &a, &w, &mut want).unwrap();
    g.add_bias(&mut want, &bias, n).unwrap();
    g.matmul_bias(mm, &a, &w, &bias, &mut got).unwrap();
    let want = g.download(&want).unwrap();
    near("matmul_bias", &want, &half_value(&mut g, &got), 1.0 / 128.0);
    // Held only in bf16: its f32 is refused, to a download and to a kernel alike.
    assert!(g.download(&got).is_err());
    let mut sink = z(&mut g, n * f);
    assert!(g.gelu_fwd(&got, &mut sink).is_err());

    // The residual projection: out = x + h w3 + bias3, written in f32.
    let (w3, bias3, x) = (up(&mut g, f * c, 45, 0.05), up(&mut g, c, 46, 0.5), up(&mut g, n * c, 47, 1.0));
    let h = up(&mut g, n * f, 48, 1.0);
    let mmr = Mm::new(n, c, f);
    let (mut zr, mut want_r, mut zt, mut got_r) =
        (z(&mut g, n * c), z(&mut g, n * c), z(&mut g, n * c), z(&mut g, n * c));
    g.matmul(mmr, &h, &w3, &mut zr).unwrap();
    g.add_bias_residual(&zr, &bias3, &x, &mut want_r, n).unwrap();
    g.matmul_bias_residual(mmr, &h, &w3, &bias3, &x, &mut zt, &mut got_r).unwrap();
    let (want_r, got_r) = (g.download(&want_r).unwrap(), g.download(&got_r).unwrap());
    near("matmul_bias_residual", &want_r, &got_r, 1e-4);

    // pre = a w + bias, out = GELU(pre).
    let (mut pre_r, mut out_r, mut pre, mut out) =
        (z(&mut g, n * f), z(&mut g, n * f), z(&mut g, n * f), z(&mut g, n * f));
    g.matmul(mm, &a, &w, &mut pre_r).unwrap();
    g.add_bias_gelu(&mut pre_r, &bias, &mut out_r, n).unwrap();
    g.matmul_bias_gelu(mm, &a, &w, &bias, &mut pre, &mut out).unwrap();
    let (pre_want, out_want) = (g.download(&pre_r).unwrap(), g.download(&out_r).unwrap());
    near("matmul_bias_gelu pre-activation", &pre_want, &half_value(&mut g, &pre), 1.0 / 128.0);
    near("matmul_bias_gelu", &out_want, &half_value(&mut g, &out), 1.0 / 128.0);

    // dpre = GELU'(pre) (dout w2^T), dbias = its column sums: from the fused forward's pre
    // against the separate ops from the f32 one.
    let mmb = Mm::new(n, f, c).tb();
    let (mut tmp, mut dpre_r, mut db_r) = (z(&mut g, n * f), z(&mut g, n * f), z(&mut g, f));
    g.matmul(mmb, &dout, &w2, &mut tmp).unwrap();
    g.gelu_bwd(&pre_r, &tmp, &mut dpre_r).unwrap();
    g.col_sum(&dpre_r, &mut db_r, n).unwrap();
    let (mut dpre, mut db) = (z(&mut g, n * f), z(&mut g, f));
    g.matmul_dgelu(mmb, &dout, &w2, &pre, &mut tmp, &mut dpre, &mut db).unwrap();
    let (dpre_want, db_want) = (g.download(&dpre_r).unwrap(), g.download(&db_r).unwrap());
    near("matmul_dgelu", &dpre_want, &half_value(&mut g, &dpre), 1.0 / 64.0);
    near("matmul_dgelu bias gradient", &db_want, &g.download(&db).unwrap(), 1.0 / 64.0);
    // A write through the f32 makes it the value again.
    g.fill(&mut got, 2.0).unwrap();
    assert_eq!(g.download(&got).unwrap()[..3], [2.0; 3]);
}
