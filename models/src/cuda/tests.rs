//! The CUDA ops against the CPU ops on the same random data (run on a GPU machine:
//! bench/gpu/models.sh), and the kernels' compilation by NVRTC alone (any machine with
//! libnvrtc on its library path).

use rand::{Rng, SeedableRng};

use super::*;
use crate::comm::Solo;
use crate::cpu::CpuOps;
use crate::data::TokenRows;
use crate::gpt::{Gpt, GptConfig, GptShape};
use crate::ops::{Adam, Conv, Mm, NormBwd, NormFwd, Ops};
use crate::resnet::{Resnet, ResnetConfig};
use crate::train::{train, TrainOpts};

mod fused;
mod reductions;

#[test]
#[ignore = "needs libnvrtc (NVIDIA's pip package nvidia-cuda-nvrtc) on the library path"]
fn kernels_compile_with_nvrtc() {
    for (major, minor) in [(8, 0), (9, 0)] {
        let ptx = compile_kernels(major, minor).unwrap();
        let text = ptx.to_src();
        for n in NAMES {
            assert!(text.contains(&format!(".entry {n}(")), "{n} missing from the PTX");
        }
    }
}

fn rnd(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn close(name: &str, cpu: &[f32], gpu: &[f32], tol: f32) {
    assert_eq!(cpu.len(), gpu.len(), "{name}");
    let scale = cpu.iter().fold(1f32, |m, v| m.max(v.abs()));
    for (i, (a, b)) in cpu.iter().zip(gpu).enumerate() {
        assert!((a - b).abs() <= tol * scale, "{name}[{i}]: cpu {a} gpu {b} (scale {scale})");
    }
}

pub(super) fn gpu() -> CudaOps {
    CudaOps::new(CudaDevice::open(0).expect("a CUDA device")).expect("the model kernels")
}

/// Two sets of ops over one device, one after the other as a worker's model checks run: the
/// same context, stream and cuBLAS handle, and the same products.
#[test]
#[ignore = "needs a CUDA GPU"]
fn ops_share_one_device() {
    let dev = CudaDevice::open(0).expect("a CUDA device");
    let mm = Mm::new(37, 29, 64).tb();
    let (ea, eb, ec) = mm.extents();
    let (a, b) = (rnd(ea, 1), rnd(eb, 2));
    let product = || {
        let mut g = CudaOps::new(Arc::clone(&dev)).unwrap();
        assert!(Arc::ptr_eq(g.stream(), dev.stream()));
        assert!(Arc::ptr_eq(g.device(), &dev));
        let (ga, gb, mut gc) = (g.upload(&a).unwrap(), g.upload(&b).unwrap(), g.zeros(ec).unwrap());
        g.matmul(mm, &ga, &gb, &mut gc).unwrap();
        g.download(&gc).unwrap()
    };
    let first = product();
    let second = product();
    assert_eq!(first, second);
    assert_eq!(Arc::strong_count(&dev), 1, "the ops hold the device only while they live");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_ops_match_cpu_ops() {
    let (mut c, mut g) = (CpuOps, gpu());
    let up = |g: &mut CudaOps, x: &[f32]| g.upload(x).unwrap();
    // Products (bf16 inputs on the GPU: a relative tolerance of a few bf16 units).
    for mm in [
        Mm::new(37, 29, 64),
        Mm::new(37, 29, 64).ta(),
        Mm::new(37, 29, 64).tb().acc(),
        Mm::new(16, 8, 32).ta().tb().batched(3),
        // Matrices inside larger buffers.
        Mm::new(16, 8, 32).tb().batched(3).ld(40, 50, 20).strides(7, 9, 320).at(5, 3, 11),
        Mm::new(12, 8, 16).ta().batched(2).ld(30, 24, 10).strides(12, 8, 120).at(2, 0, 6).acc(),
        // One operand shared by every batch (stride 0), on the bf16 path.
        Mm::new(300, 256, 260).tb().batched(2).strides(0, 256 * 260, 300 * 256),
        // Every side at least BF16_MIN_SIDE: the bf16 copies of the operands.
        Mm::new(300, 257, 256).tb(),
        Mm::new(256, 320, 260).ta().acc().batched(2),
    ] {
        let (ea, eb, ec) = mm.extents();
        let (a, b, c0) = (rnd(ea, 1), rnd(eb, 2), rnd(ec, 3));
        let mut cc = c0.clone();
        c.matmul(mm, &a, &b, &mut cc).unwrap();
        let mut gc = up(&mut g, &c0);
        let (ga, gb) = (up(&mut g, &a), up(&mut g, &b));
        g.matmul(mm, &ga, &gb, &mut gc).unwrap();
        close(&format!("matmul {mm:?}"), &cc, &g.download(&gc).unwrap(), 2e-2);
    }
    let (rows, cols) = (50, 96);
    // Layer norm: tests/reductions.rs, at this size among others.
    let (x, dout) = (rnd(rows * cols, 4), rnd(rows * cols, 7));
    let (gx, gd) = (up(&mut g, &x), up(&mut g, &dout));
    // Pointwise, bias, column sums, AdamW.
    let mut o2 = vec![0.0; x.len()];
    let mut go2 = g.zeros(x.len()).unwrap();
    c.gelu_fwd(&x, &mut o2).unwrap();
    g.gelu_fwd(&gx, &mut go2).unwrap();
    close("gelu", &o2, &g.download(&go2).unwrap(), 1e-5);
    c.gelu_bwd(&x, &dout, &mut o2).unwrap();
    g.gelu_bwd(&gx, &gd, &mut go2).unwrap();
    close("gelu bwd", &o2, &g.download(&go2).unwrap(), 1e-5);
    c.relu_fwd(&x, &mut o2).unwrap();
    g.relu_fwd(&gx, &mut go2).unwrap();
    close("relu", &o2, &g.download(&go2).unwrap(), 0.0);
    let mut bsum = vec![0.0; cols];
    let mut gbsum = g.zeros(cols).unwrap();
    c.col_sum(&x, &mut bsum, rows).unwrap();
    g.col_sum(&gx, &mut gbsum, rows).unwrap();
    close("col_sum", &bsum, &g.download(&gbsum).unwrap(), 1e-5);
    let (mut p, mut m, mut v) = (x.clone(), dout.clone(), vec![0.5; x.len()]);
    let (mut gp, mut gm, mut gv) = (up(&mut g, &x), up(&mut g, &dout), up(&mut g, &vec![0.5; x.len()]));
    let a = Adam { lr: 0.01, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, step: 3, grad_scale: 0.5 };
    let grad = rnd(x.len(), 5);
    let ggrad = up(&mut g, &grad);
    c.adamw(&mut p, &grad, &mut m, &mut v, a).unwrap();
    g.adamw(&mut gp, &ggrad, &mut gm, &mut gv, a).unwrap();
    close("adamw", &p, &g.download(&gp).unwrap(), 1e-5);
    // Cross-entropy and embeddings.
    let (r, vocab) = (33, 70);
    let logits = rnd(r * vocab, 10);
    let tgt: Vec<f32> = (0..r).map(|i| ((i * 7) % vocab) as f32).collect();
    let (mut dl, mut ls) = (vec![0.0; r * vocab], vec![0.0; r]);
    c.cross_entropy(&logits, &tgt, &mut dl, &mut ls, vocab).unwrap();
    let (gl, gt) = (up(&mut g, &logits), up(&mut g, &tgt));
    let (mut gdl, mut gls) = (g.zeros(r * vocab).unwrap(), g.zeros(r).unwrap());
    g.cross_entropy(&gl, &gt, &mut gdl, &mut gls, vocab).unwrap();
    close("xent loss", &ls, &g.download(&gls).unwrap(), 1e-5);
    close("xent grad", &dl, &g.download(&gdl).unwrap(), 1e-5);
    let (tt, cc) = (11, 8);
    let (wte, wpe) = (rnd(vocab * cc, 11), rnd(tt * cc, 12));
    let tok: Vec<f32> = tgt.iter().take(22).copied().collect();
    let (mut eo, mut geo) = (vec![0.0; 22 * cc], g.zeros(22 * cc).unwrap());
    c.embed_fwd(&tok, &wte, &wpe, &mut eo, tt, cc).unwrap();
    let (gtok, gwte, gwpe) = (up(&mut g, &tok), up(&mut g, &wte), up(&mut g, &wpe));
    g.embed_fwd(&gtok, &gwte, &gwpe, &mut geo, tt, cc).unwrap();
    close("embed", &eo, &g.download(&geo).unwrap(), 0.0);
    // The gradients accumulate (into ones here), each element's rows in row order on both: the
    // same bits.
    let (rows, starts) = crate::data::group_by_token(&tok, vocab).unwrap();
    let by = TokenRows { rows: rows.clone(), starts: starts.clone() };
    let (mut dwte, mut dwpe) = (vec![1.0; wte.len()], vec![1.0; wpe.len()]);
    c.embed_bwd(&tok, &by, &eo, &mut dwte, &mut dwpe, tt, cc).unwrap();
    let gby = TokenRows { rows: up(&mut g, &rows), starts: up(&mut g, &starts) };
    let (mut gdwte, mut gdwpe) = (up(&mut g, &vec![1.0; wte.len()]), up(&mut g, &vec![1.0; wpe.len()]));
    g.embed_bwd(&gtok, &gby, &geo, &mut gdwte, &mut gdwpe, tt, cc).unwrap();
    close("embed dwte", &dwte, &g.download(&gdwte).unwrap(), 0.0);
    close("embed dwpe", &dwpe, &g.download(&gdwpe).unwrap(), 0.0);
}

/// The fused attention (bf16 tensor cores, fp32 softmax and accumulation) against the CPU's
/// fp32 definition: the output, the log-sum-exps and every gradient, on head dimensions that
/// need no padding (64, 128), that pad (24, 100) and sequence lengths that are not a whole
/// number of tiles.
#[test]
#[ignore = "needs a CUDA GPU"]
fn fused_attention_matches_cpu() {
    use crate::ops::Heads;
    let (mut c, mut g) = (CpuOps, gpu());
    for (i, hs) in [
        Heads { b: 2, t: 100, h: 3, d: 64 },
        Heads { b: 1, t: 200, h: 2, d: 128 },
        Heads { b: 2, t: 40, h: 2, d: 24 },
        Heads { b: 1, t: 129, h: 1, d: 100 },
        Heads { b: 1, t: 64, h: 4, d: 16 },
        // Three query blocks of 128, the last cut short; key stages of 64 across them.
        Heads { b: 1, t: 300, h: 1, d: 64 },
    ]
    .into_iter()
    .enumerate()
    {
        let scale = 1.0 / (hs.d as f32).sqrt();
        let n = hs.b * hs.t * hs.h * hs.d;
        let (qkv, dy) = (rnd(3 * n, 40 + i as u64), rnd(n, 50 + i as u64));
        let (mut y, mut lse) = (vec![0.0; n], vec![0.0; hs.b * hs.h * hs.t]);
        c.attention_fwd(&qkv, &mut y, &mut lse, hs, scale).unwrap();
        let mut dqkv = vec![0.0; 3 * n];
        c.attention_bwd(&qkv, &y, &lse, &dy, &mut dqkv, hs, scale).unwrap();
        let (gq, gdy) = (g.upload(&qkv).unwrap(), g.upload(&dy).unwrap());
        let (mut gy, mut glse) = (g.zeros(n).unwrap(), g.zeros(lse.len()).unwrap());
        g.attention_fwd(&gq, &mut gy, &mut glse, hs, scale).unwrap();
        // Gradients are overwritten: start from garbage.
        let mut gd = g.upload(&vec![7.0; 3 * n]).unwrap();
        g.attention_bwd(&gq, &gy, &glse, &gdy, &mut gd, hs, scale).unwrap();
        let what = |x: &str| format!("{x} {hs:?}");
        close(&what("attention y"), &y, &g.download(&gy).unwrap(), 2e-2);
        close(&what("attention lse"), &lse, &g.download(&glse).unwrap(), 2e-2);
        let gdq = g.download(&gd).unwrap();
        // Each part of the gradient against its own scale (dv is larger than dq and dk).
        let part =
            |x: &[f32], p: usize| -> Vec<f32> { x.chunks(hs.h * hs.d).skip(p).step_by(3).flatten().copied().collect() };
        for (p, name) in ["dq", "dk", "dv"].iter().enumerate() {
            close(&what(name), &part(&dqkv, p), &part(&gdq, p), 3e-2);
        }
    }
    // A head too wide for the kernels is refused with a clear error, not launched.
    let hs = Heads { b: 1, t: 8, h: 1, d: 160 };
    let q = g.zeros(3 * 8 * 160).unwrap();
    let (mut y, mut l) = (g.zeros(8 * 160).unwrap(), g.zeros(8).unwrap());
    assert!(g.attention_fwd(&q, &mut y, &mut l, hs, 0.1).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn cuda_conv_ops_match_cpu_ops() {
    let (mut c, mut g) = (CpuOps, gpu());
    let cv = Conv { c: 3, n: 2, h: 13, w: 11, k: 3, stride: 2, pad: 1 };
    let x = rnd(cv.c * cv.n * cv.h * cv.w, 20);
    let gx = g.upload(&x).unwrap();
    let (mut cols, mut gcols) =
        (vec![0.0; cv.col_rows() * cv.col_cols()], g.zeros(cv.col_rows() * cv.col_cols()).unwrap());
    c.im2col(&x, &mut cols, cv).unwrap();
    g.im2col(&gx, &mut gcols, cv).unwrap();
    close("im2col", &cols, &g.download(&gcols).unwrap(), 0.0);
    let (mut dx, mut gdx) = (vec![0.0; x.len()], g.zeros(x.len()).unwrap());
    c.col2im(&cols, &mut dx, cv).unwrap();
    g.col2im(&gcols, &mut gdx, cv).unwrap();
    close("col2im", &dx, &g.download(&gdx).unwrap(), 1e-5);
    let m = cv.n * cv.h * cv.w;
    let (gam, bet) = (rnd(cv.c, 21), rnd(cv.c, 22));
    let (gg, gb) = (g.upload(&gam).unwrap(), g.upload(&bet).unwrap());
    let (mut o, mut mu, mut rs) = (vec![0.0; x.len()], vec![0.0; cv.c], vec![0.0; cv.c]);
    c.batchnorm_fwd(NormFwd { x: &x, g: &gam, b: &bet, out: &mut o, mean: &mut mu, rstd: &mut rs }, m).unwrap();
    let (mut go, mut gmu, mut grs) = (g.zeros(x.len()).unwrap(), g.zeros(cv.c).unwrap(), g.zeros(cv.c).unwrap());
    g.batchnorm_fwd(NormFwd { x: &gx, g: &gg, b: &gb, out: &mut go, mean: &mut gmu, rstd: &mut grs }, m).unwrap();
    close("batchnorm", &o, &g.download(&go).unwrap(), 1e-4);
    let (mut dg, mut db) = (vec![0.0; cv.c], vec![0.0; cv.c]);
    c.batchnorm_bwd(
        NormBwd { x: &x, g: &gam, mean: &mu, rstd: &rs, dout: &dx, dx: &mut o, dg: &mut dg, db: &mut db },
        m,
    )
    .unwrap();
    let (mut gdg, mut gdb) = (g.zeros(cv.c).unwrap(), g.zeros(cv.c).unwrap());
    g.batchnorm_bwd(
        NormBwd { x: &gx, g: &gg, mean: &gmu, rstd: &grs, dout: &gdx, dx: &mut go, dg: &mut gdg, db: &mut gdb },
        m,
    )
    .unwrap();
    close("batchnorm dx", &o, &g.download(&go).unwrap(), 1e-4);
    close("batchnorm dg", &dg, &g.download(&gdg).unwrap(), 1e-4);
    let out_len = cv.c * cv.col_cols();
    let (mut po, mut pa, mut gpo, mut gpa) =
        (vec![0.0; out_len], vec![0.0; out_len], g.zeros(out_len).unwrap(), g.zeros(out_len).unwrap());
    c.maxpool_fwd(&x, &mut po, &mut pa, cv).unwrap();
    g.maxpool_fwd(&gx, &mut gpo, &mut gpa, cv).unwrap();
    close("maxpool", &po, &g.download(&gpo).unwrap(), 0.0);
    c.maxpool_bwd(&po, &pa, &mut dx, cv).unwrap();
    g.maxpool_bwd(&gpo, &gpa, &mut gdx, cv).unwrap();
    // Gathered in the windows' order, as the CPU sums them: the same bits.
    close("maxpool bwd", &dx, &g.download(&gdx).unwrap(), 0.0);
    let (mut ap, mut gap) = (vec![0.0; cv.c * cv.n], g.zeros(cv.c * cv.n).unwrap());
    c.avgpool_fwd(&x, &mut ap, cv.c, cv.n).unwrap();
    g.avgpool_fwd(&gx, &mut gap, cv.c, cv.n).unwrap();
    close("avgpool", &ap, &g.download(&gap).unwrap(), 1e-5);
    c.avgpool_bwd(&ap, &mut dx, cv.c, cv.n).unwrap();
    g.avgpool_bwd(&gap, &mut gdx, cv.c, cv.n).unwrap();
    close("avgpool bwd", &dx, &g.download(&gdx).unwrap(), 1e-5);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpt_trains_alike_on_cuda_and_cpu() {
    // Products too thin for bf16 (f32 ops throughout), then one wide enough that the
    // projections run fused with their bias and GELU, their results held in bf16 alone.
    for (shape, fused) in [
        (GptShape { vocab: 64, ctx: 32, layers: 2, heads: 4, dim: 64, batch: 8 }, false),
        (GptShape { vocab: 256, ctx: 128, layers: 1, heads: 4, dim: 256, batch: 4 }, true),
    ] {
        let cfg = GptConfig { shape, tp_size: 1, tp_rank: 0, seed: 5, data_seed: 1 };
        let opts = train_opts(20, 3e-3, false);
        let mut c = CpuOps;
        let mut m = Gpt::new(&mut c, cfg.clone()).unwrap();
        let cpu = train(&mut c, &mut m, &mut Solo, &mut Solo, &opts, &mut |_| {}).unwrap();
        let mut g = gpu();
        let mut m = Gpt::new(&mut g, cfg).unwrap();
        let cuda = train(&mut g, &mut m, &mut Solo, &mut Solo, &opts, &mut |_| {}).unwrap();
        let held_in_bf16 = g.twins.state().iter().filter(|t| t.4).count();
        assert_eq!(held_in_bf16 > 0, fused, "{held_in_bf16} buffers held in bf16 alone");
        // The first loss agrees closely; the curves (bf16 products) stay near each other.
        assert!((cpu.losses[0] - cuda.losses[0]).abs() < 1e-2, "{:?} {:?}", cpu.losses, cuda.losses);
        for (a, b) in cpu.losses.iter().zip(&cuda.losses) {
            assert!((a - b).abs() < 0.1 * a.abs().max(0.5), "{:?} {:?}", cpu.losses, cuda.losses);
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn resnet_trains_alike_on_cuda_and_cpu() {
    let cfg =
        ResnetConfig { image: 32, batch: 8, width: 8, blocks: vec![1, 1, 1, 1], classes: 4, seed: 1, data_seed: 2 };
    let opts = train_opts(10, 2e-3, false);
    let mut c = CpuOps;
    let mut m = Resnet::new(&mut c, cfg.clone()).unwrap();
    let cpu = train(&mut c, &mut m, &mut Solo, &mut Solo, &opts, &mut |_| {}).unwrap();
    let mut g = gpu();
    let mut m = Resnet::new(&mut g, cfg).unwrap();
    let cuda = train(&mut g, &mut m, &mut Solo, &mut Solo, &opts, &mut |_| {}).unwrap();
    assert!((cpu.losses[0] - cuda.losses[0]).abs() < 2e-2, "{:?} {:?}", cpu.losses, cuda.losses);
    for (a, b) in cpu.losses.iter().zip(&cuda.losses) {
        assert!((a - b).abs() < 0.15 * a.abs().max(0.5), "{:?} {:?}", cpu.losses, cuda.losses);
    }
}

/// A product on bf16 twins keeps them for the next product of the same buffers, and a write
/// to a buffer (an op, or a writer outside the ops through the handle) makes its twin stale:
/// the next product sees the new values.
#[test]
#[ignore = "needs a CUDA GPU"]
fn bf16_twins_are_reused_and_never_stale() {
    let (mut c, mut g) = (CpuOps, gpu());
    let mm = Mm::new(256, 300, 288);
    let (ea, eb, ec) = mm.extents();
    let (a, b) = (rnd(ea, 40), rnd(eb, 41));
    let (ga, gb) = (g.upload(&a).unwrap(), g.upload(&b).unwrap());
    let mut gc = g.zeros(ec).unwrap();
    let mut cc = vec![0.0; ec];
    c.matmul(mm, &a, &b, &mut cc).unwrap();
    g.matmul(mm, &ga, &gb, &mut gc).unwrap();
    close("first product", &cc, &g.download(&gc).unwrap(), 2e-2);
    assert_eq!(g.twins().count(), (2, 2), "a twin each for a and b");
    g.matmul(mm, &ga, &gb, &mut gc).unwrap();
    assert_eq!(g.twins().count(), (2, 2), "the same twins reused");
    // An op writes a: its twin is stale, and the product sees the new a.
    let mut ga = ga;
    g.fill(&mut ga, 0.5).unwrap();
    assert_eq!(g.twins().count(), (2, 1));
    let a2 = vec![0.5; ea];
    c.matmul(mm, &a2, &b, &mut cc).unwrap();
    g.matmul(mm, &ga, &gb, &mut gc).unwrap();
    close("after a fill", &cc, &g.download(&gc).unwrap(), 2e-2);
    // A writer outside the ops (as the NCCL all-reduce) marks b through the handle.
    let b2: Vec<f32> = b.iter().map(|v| -v).collect();
    let mut gb = gb;
    g.stream().memcpy_htod(&b2, &mut gb).unwrap();
    g.twins().wrote(&gb);
    c.matmul(mm, &a2, &b2, &mut cc).unwrap();
    g.matmul(mm, &ga, &gb, &mut gc).unwrap();
    close("after an outside write", &cc, &g.download(&gc).unwrap(), 2e-2);
    // An op that writes its output's twin beside it (GELU's backward here): the twin is valid
    // at once, and the product reads it and sees the new values.
    let (x, dout) = (rnd(ea, 42), rnd(ea, 43));
    let (gx, gd) = (g.upload(&x).unwrap(), g.upload(&dout).unwrap());
    let mut gdx = g.zeros(ea).unwrap();
    let (held, valid) = g.twins().count();
    g.gelu_bwd(&gx, &gd, &mut gdx).unwrap();
    assert_eq!(g.twins().count(), (held + 1, valid + 1), "gelu_bwd wrote a valid twin");
    let mut dx = vec![0.0; ea];
    c.gelu_bwd(&x, &dout, &mut dx).unwrap();
    c.matmul(mm, &dx, &b2, &mut cc).unwrap();
    g.matmul(mm, &gdx, &gb, &mut gc).unwrap();
    close("from a written twin", &cc, &g.download(&gc).unwrap(), 2e-2);
    assert_eq!(g.twins().count(), (held + 1, valid + 1), "no new twin for the product");
}

/// AdamW training options of the GPU tests: `steps` at learning rate `lr`, no fault.
pub(super) fn train_opts(steps: usize, lr: f32, graphs: bool) -> TrainOpts {
    TrainOpts {
        steps,
        lr_warmup: 1,
        lr,
        weight_decay: 0.01,
        nan_at: None,
        repeat: 1,
        corrupt: false,
        graphs,
        bucket_bytes: crate::train::BUCKET_BYTES,
    }
}
