//! Each op's backward against central finite differences of its forward (the scalar
//! `L = sum(out * r)` for a random `r`), and the forwards against direct definitions.

use rand::{Rng, SeedableRng};

use super::*;

fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum()
}

/// Compares `grad` with finite differences of `L(x) = sum(f(x) * r)` at a spread of elements.
fn fd(name: &str, x: &[f32], r: &[f32], grad: &[f32], f: impl Fn(&[f32]) -> Vec<f32>) {
    let h = 1e-2f32;
    let step = (x.len() / 23).max(1);
    for i in (0..x.len()).step_by(step) {
        let (mut xp, mut xm) = (x.to_vec(), x.to_vec());
        xp[i] += h;
        xm[i] -= h;
        let num = (dot(&f(&xp), r) - dot(&f(&xm), r)) / (2.0 * h as f64);
        let err = (num - grad[i] as f64).abs();
        assert!(err <= 2e-2 * (1.0 + num.abs()), "{name}: d/dx[{i}] analytic {} numeric {num}", grad[i]);
    }
}

#[test]
fn matmul_backward_matches_finite_differences() {
    let mut o = CpuOps;
    let (m, n, k) = (5, 4, 3);
    for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
        let mut mm = Mm::new(m, n, k);
        if ta {
            mm = mm.ta();
        }
        if tb {
            mm = mm.tb();
        }
        let (a, b, r) = (rnd(m * k, 1), rnd(k * n, 2), rnd(m * n, 3));
        let fwd = |a: &[f32], b: &[f32]| {
            let mut c = vec![0.0; m * n];
            CpuOps.matmul(mm, &a.to_vec(), &b.to_vec(), &mut c).unwrap();
            c
        };
        // Forward against the definition.
        let c = fwd(&a, &b);
        let at = |i: usize, l: usize| if ta { a[l * m + i] } else { a[i * k + l] };
        let bt = |l: usize, j: usize| if tb { b[j * k + l] } else { b[l * n + j] };
        for i in 0..m {
            for j in 0..n {
                let e: f32 = (0..k).map(|l| at(i, l) * bt(l, j)).sum();
                assert!((c[i * n + j] - e).abs() < 1e-5);
            }
        }
        // dA = dC op(B)^T (stored like A), dB = op(A)^T dC (stored like B).
        let mut da = vec![0.0; m * k];
        let mut db = vec![0.0; k * n];
        if ta {
            o.matmul(Mm::new(k, m, n).tb(), &b_like(&b, tb, k, n), &r, &mut da).unwrap();
        } else {
            o.matmul(Mm::new(m, k, n).tb(), &r, &b_like(&b, tb, k, n), &mut da).unwrap();
        }
        let a_plain = if ta { transpose(&a, k, m) } else { a.clone() };
        if tb {
            o.matmul(Mm::new(n, k, m).ta(), &r, &a_plain, &mut db).unwrap();
        } else {
            o.matmul(Mm::new(k, n, m).ta(), &a_plain, &r, &mut db).unwrap();
        }
        fd("matmul A", &a, &r, &da, |a| fwd(a, &b));
        fd("matmul B", &b, &r, &db, |b| fwd(&a, b));
    }
}

/// B as a plain `k x n` matrix.
fn b_like(b: &[f32], tb: bool, k: usize, n: usize) -> Vec<f32> {
    if tb {
        transpose(b, n, k)
    } else {
        b.to_vec()
    }
}

/// The transpose of a `rows x cols` matrix.
fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; x.len()];
    for i in 0..rows {
        for j in 0..cols {
            t[j * rows + i] = x[i * cols + j];
        }
    }
    t
}

#[test]
fn batched_and_accumulating_matmul() {
    let (m, n, k, bt) = (3, 2, 4, 3);
    let (a, b) = (rnd(bt * m * k, 4), rnd(bt * k * n, 5));
    let mut c = vec![1.0; bt * m * n];
    CpuOps.matmul(Mm::new(m, n, k).batched(bt).acc().alpha(0.5), &a, &b, &mut c).unwrap();
    for i in 0..bt {
        let mut one = vec![0.0; m * n];
        CpuOps
            .matmul(
                Mm::new(m, n, k),
                &a[i * m * k..(i + 1) * m * k].to_vec(),
                &b[i * k * n..(i + 1) * k * n].to_vec(),
                &mut one,
            )
            .unwrap();
        for j in 0..m * n {
            assert!((c[i * m * n + j] - (1.0 + 0.5 * one[j])).abs() < 1e-5);
        }
    }
}

#[test]
fn layernorm_backward_matches_finite_differences() {
    let (rows, c) = (3, 8);
    let (x, g, b, r) = (rnd(rows * c, 6), rnd(c, 7), rnd(c, 8), rnd(rows * c, 9));
    let fwd = |x: &[f32], g: &[f32], b: &[f32]| {
        let (mut out, mut mean, mut rstd) = (vec![0.0; rows * c], vec![0.0; rows], vec![0.0; rows]);
        CpuOps
            .layernorm_fwd(
                NormFwd {
                    x: &x.to_vec(),
                    g: &g.to_vec(),
                    b: &b.to_vec(),
                    out: &mut out,
                    mean: &mut mean,
                    rstd: &mut rstd,
                },
                c,
            )
            .unwrap();
        (out, mean, rstd)
    };
    let (_, mean, rstd) = fwd(&x, &g, &b);
    let (mut dx, mut dg, mut db) = (vec![0.0; rows * c], vec![0.0; c], vec![0.0; c]);
    CpuOps
        .layernorm_bwd(
            NormBwd { x: &x, g: &g, mean: &mean, rstd: &rstd, dout: &r, dx: &mut dx, dg: &mut dg, db: &mut db },
            c,
        )
        .unwrap();
    fd("layernorm x", &x, &r, &dx, |x| fwd(x, &g, &b).0);
    fd("layernorm g", &g, &r, &dg, |g| fwd(&x, g, &b).0);
    fd("layernorm b", &b, &r, &db, |b| fwd(&x, &g, b).0);
}

#[test]
fn pointwise_backwards_match_finite_differences() {
    let x: Vec<f32> = rnd(40, 10).iter().map(|v| 3.0 * v).collect();
    let r = rnd(40, 11);
    let mut d = vec![0.0; 40];
    CpuOps.gelu_bwd(&x, &r, &mut d).unwrap();
    fd("gelu", &x, &r, &d, |x| {
        let mut o = vec![0.0; x.len()];
        CpuOps.gelu_fwd(&x.to_vec(), &mut o).unwrap();
        o
    });
    // ReLU away from its kink.
    let x: Vec<f32> = x.iter().map(|v| if v.abs() < 0.1 { 0.5 } else { *v }).collect();
    let mut y = vec![0.0; 40];
    CpuOps.relu_fwd(&x, &mut y).unwrap();
    CpuOps.relu_bwd(&y, &r, &mut d).unwrap();
    fd("relu", &x, &r, &d, |x| x.iter().map(|v| v.max(0.0)).collect());
}

/// The fused attention against its definition (softmax of the causally masked scaled scores
/// times the values, one matrix per sequence and head), and its backward against finite
/// differences of the output.
#[test]
fn attention_matches_its_definition_and_finite_differences() {
    let hs = Heads { b: 2, t: 5, h: 3, d: 4 };
    let scale = 0.7;
    let n = hs.b * hs.t * hs.h * hs.d;
    let (qkv, r) = (rnd(3 * n, 12), rnd(n, 13));
    let fwd = |qkv: &[f32]| {
        let (mut y, mut lse) = (vec![0.0; n], vec![0.0; hs.b * hs.h * hs.t]);
        CpuOps.attention_fwd(&qkv.to_vec(), &mut y, &mut lse, hs, scale).unwrap();
        (y, lse)
    };
    let (y, lse) = fwd(&qkv);
    let at = |b: usize, i: usize, part: usize, hh: usize| ((b * hs.t + i) * 3 + part) * hs.h * hs.d + hh * hs.d;
    for (b, hh, i) in (0..hs.b).flat_map(|b| (0..hs.h).flat_map(move |hh| (0..hs.t).map(move |i| (b, hh, i)))) {
        let s: Vec<f32> = (0..=i)
            .map(|j| scale * dot(&qkv[at(b, i, 0, hh)..][..hs.d], &qkv[at(b, j, 1, hh)..][..hs.d]) as f32)
            .collect();
        let l = s.iter().map(|v| v.exp()).sum::<f32>().ln();
        assert!((lse[(b * hs.h + hh) * hs.t + i] - l).abs() < 1e-5);
        for e in 0..hs.d {
            let want: f32 = s.iter().enumerate().map(|(j, sj)| (sj - l).exp() * qkv[at(b, j, 2, hh) + e]).sum();
            let got = y[((b * hs.t + i) * hs.h + hh) * hs.d + e];
            assert!((got - want).abs() < 1e-5, "y[{b},{i},{hh},{e}] {got} {want}");
        }
    }
    let mut dqkv = vec![1.0; 3 * n];
    CpuOps.attention_bwd(&qkv, &y, &lse, &r, &mut dqkv, hs, scale).unwrap();
    fd("attention", &qkv, &r, &dqkv, |x| fwd(x).0);
    // A gradient buffer of another size is refused.
    let mut bad = vec![0.0; 3 * n + 1];
    assert!(CpuOps.attention_bwd(&qkv, &y, &lse, &r, &mut bad, hs, scale).is_err());
}

#[test]
fn cross_entropy_gradient_matches_finite_differences() {
    let (rows, v) = (4, 6);
    let logits = rnd(rows * v, 14);
    let targets = vec![0.0, 5.0, 2.0, 2.0];
    let mut dl = vec![0.0; rows * v];
    let mut losses = vec![0.0; rows];
    CpuOps.cross_entropy(&logits, &targets, &mut dl, &mut losses, v).unwrap();
    // L = mean loss: r = 1/rows on the per-row losses.
    let r = vec![1.0 / rows as f32; rows];
    fd("cross_entropy", &logits, &r, &dl, |l| {
        let (mut d, mut ls) = (vec![0.0; rows * v], vec![0.0; rows]);
        CpuOps.cross_entropy(&l.to_vec(), &targets, &mut d, &mut ls, v).unwrap();
        ls
    });
    // Uniform logits: the loss is ln v.
    let mut ls = vec![0.0; rows];
    CpuOps.cross_entropy(&vec![0.0; rows * v], &targets, &mut dl, &mut ls, v).unwrap();
    assert!((ls[0] - (v as f32).ln()).abs() < 1e-5);
}

#[test]
fn embedding_backward_matches_finite_differences() {
    let (b, t, c, vocab) = (2, 3, 4, 5);
    let tok = vec![1.0, 4.0, 1.0, 0.0, 2.0, 3.0];
    let (wte, wpe, r) = (rnd(vocab * c, 15), rnd(t * c, 16), rnd(b * t * c, 17));
    let (mut dwte, mut dwpe) = (vec![0.0; vocab * c], vec![0.0; t * c]);
    let (rows, starts) = crate::data::group_by_token(&tok, vocab).unwrap();
    let by = crate::data::TokenRows { rows, starts };
    CpuOps.embed_bwd(&tok, &by, &r, &mut dwte, &mut dwpe, t, c).unwrap();
    let fwd = |wte: &[f32], wpe: &[f32]| {
        let mut o = vec![0.0; b * t * c];
        CpuOps.embed_fwd(&tok, &wte.to_vec(), &wpe.to_vec(), &mut o, t, c).unwrap();
        o
    };
    fd("embedding wte", &wte, &r, &dwte, |w| fwd(w, &wpe));
    fd("embedding wpe", &wpe, &r, &dwpe, |w| fwd(&wte, w));
}

/// A product on matrices inside larger buffers (row strides, offsets, batch strides: the
/// attention's heads read in place) computes what the same product of the matrices copied out
/// densely computes, and sizes that do not fit are refused.
#[test]
fn strided_products_read_and_write_in_place() {
    let (m, n, k, batch) = (4, 3, 5, 2);
    let mm = Mm::new(m, n, k).tb().batched(batch).ld(9, 7, 6).strides(2, 3, 30).at(1, 2, 4);
    let (ea, eb, ec) = mm.extents();
    let (a, b) = (rnd(ea, 30), rnd(eb, 31));
    let c0 = rnd(ec, 32);
    let mut c = c0.clone();
    CpuOps.matmul(mm, &a, &b, &mut c).unwrap();
    let mut touched = vec![false; ec];
    for i in 0..batch {
        let (oa, ob, oc) = (1 + 2 * i, 2 + 3 * i, 4 + 30 * i);
        let da: Vec<f32> = (0..m * k).map(|e| a[oa + e / k * 9 + e % k]).collect();
        let db: Vec<f32> = (0..n * k).map(|e| b[ob + e / k * 7 + e % k]).collect();
        let mut dc = vec![0.0; m * n];
        CpuOps.matmul(Mm::new(m, n, k).tb(), &da, &db, &mut dc).unwrap();
        for (e, want) in dc.iter().enumerate() {
            let at = oc + e / n * 6 + e % n;
            assert!((c[at] - want).abs() < 1e-5, "batch {i} element {e}");
            touched[at] = true;
        }
    }
    // Nothing outside the matrices of C was written.
    for (e, t) in touched.iter().enumerate() {
        if !t {
            assert_eq!(c[e], c0[e], "element {e} outside C was written");
        }
    }
    assert!(CpuOps.matmul(mm, &a, &b, &mut vec![0.0; ec - 1]).is_err());
    assert!(CpuOps.matmul(mm.ld(9, 4, 6), &a, &b, &mut c).is_err(), "a row stride below the row");
}

#[test]
fn im2col_and_col2im_are_adjoint_and_convolve() {
    let cv = Conv { c: 2, n: 2, h: 5, w: 4, k: 3, stride: 2, pad: 1 };
    let x = rnd(cv.c * cv.n * cv.h * cv.w, 19);
    let y = rnd(cv.col_rows() * cv.col_cols(), 20);
    let mut cols = vec![0.0; y.len()];
    CpuOps.im2col(&x, &mut cols, cv).unwrap();
    let mut dx = vec![0.0; x.len()];
    CpuOps.col2im(&y, &mut dx, cv).unwrap();
    assert!((dot(&cols, &y) - dot(&x, &dx)).abs() < 1e-4);
    // One output of a convolution by definition: channel-summed 3x3 window at (oy, ox) = (1, 1).
    let w = rnd(cv.col_rows(), 21);
    let mut out = vec![0.0; cv.col_cols()];
    CpuOps.matmul(Mm::new(1, cv.col_cols(), cv.col_rows()), &w, &cols, &mut out).unwrap();
    let (n, oy, ox) = (1, 1, 1);
    let mut e = 0.0;
    for c in 0..cv.c {
        for ky in 0..3 {
            for kx in 0..3 {
                let (iy, ix) = (oy * 2 + ky - 1, ox * 2 + kx - 1);
                if iy < cv.h && ix < cv.w {
                    e += w[(c * 3 + ky) * 3 + kx] * x[(c * cv.n + n) * cv.h * cv.w + iy * cv.w + ix];
                }
            }
        }
    }
    assert!((out[(n * cv.oh() + oy) * cv.ow() + ox] - e).abs() < 1e-5);
}

#[test]
fn batchnorm_and_pool_backwards_match_finite_differences() {
    let (c, m) = (3, 10);
    let (x, g, b, r) = (rnd(c * m, 22), rnd(c, 23), rnd(c, 24), rnd(c * m, 25));
    let fwd = |x: &[f32], g: &[f32]| {
        let (mut o, mut mu, mut rs) = (vec![0.0; c * m], vec![0.0; c], vec![0.0; c]);
        CpuOps
            .batchnorm_fwd(
                NormFwd { x: &x.to_vec(), g: &g.to_vec(), b: &b, out: &mut o, mean: &mut mu, rstd: &mut rs },
                m,
            )
            .unwrap();
        (o, mu, rs)
    };
    let (_, mu, rs) = fwd(&x, &g);
    let (mut dx, mut dg, mut db) = (vec![0.0; c * m], vec![0.0; c], vec![0.0; c]);
    CpuOps
        .batchnorm_bwd(
            NormBwd { x: &x, g: &g, mean: &mu, rstd: &rs, dout: &r, dx: &mut dx, dg: &mut dg, db: &mut db },
            m,
        )
        .unwrap();
    fd("batchnorm x", &x, &r, &dx, |x| fwd(x, &g).0);
    fd("batchnorm g", &g, &r, &dg, |g| fwd(&x, g).0);

    let cv = Conv { c: 2, n: 2, h: 6, w: 6, k: 3, stride: 2, pad: 1 };
    let x = rnd(cv.c * cv.n * 36, 26);
    let r = rnd(cv.c * cv.col_cols(), 27);
    let mp = |x: &[f32]| {
        let (mut o, mut a) = (vec![0.0; r.len()], vec![0.0; r.len()]);
        CpuOps.maxpool_fwd(&x.to_vec(), &mut o, &mut a, cv).unwrap();
        (o, a)
    };
    let (_, arg) = mp(&x);
    let mut dx = vec![0.0; x.len()];
    CpuOps.maxpool_bwd(&r, &arg, &mut dx, cv).unwrap();
    fd("maxpool", &x, &r, &dx, |x| mp(x).0);

    let r = rnd(cv.n * cv.c, 28);
    let mut dx = vec![0.0; x.len()];
    CpuOps.avgpool_bwd(&r, &mut dx, cv.c, cv.n).unwrap();
    fd("avgpool", &x, &r, &dx, |x| {
        let mut o = vec![0.0; cv.n * cv.c];
        CpuOps.avgpool_fwd(&x.to_vec(), &mut o, cv.c, cv.n).unwrap();
        o
    });
}

#[test]
fn bias_and_adamw() {
    let (rows, n) = (3, 4);
    let (b, r) = (rnd(n, 29), rnd(rows * n, 30));
    let mut db = vec![0.0; n];
    CpuOps.col_sum(&r, &mut db, rows).unwrap();
    fd("bias", &b, &r, &db, |b| {
        let mut y = vec![0.0; rows * n];
        CpuOps.add_bias(&mut y, &b.to_vec(), rows).unwrap();
        y
    });
    // AdamW walks a quadratic (x - 3)^2 to its minimum.
    let (mut p, mut m, mut v) = (vec![0.0f32], vec![0.0], vec![0.0]);
    for step in 1..=300 {
        let g = vec![2.0 * (p[0] - 3.0)];
        let a = Adam { lr: 0.05, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, step, grad_scale: 1.0 };
        CpuOps.adamw(&mut p, &g, &mut m, &mut v, a).unwrap();
    }
    assert!((p[0] - 3.0).abs() < 0.05, "{}", p[0]);
}
