//! The column reductions, the bias kernels and layer norm on the GPU against the CPU ops, on
//! sizes that cut every reduction into several chunks and rows that take each of layer norm's
//! two paths (float4 rows held in registers, element by element).

use super::{close, gpu, rnd};
use crate::cpu::CpuOps;
use crate::cuda::CudaOps;
use crate::ops::{NormBwd, NormFwd, Ops};

/// The two-pass reductions over many chunks (column sums, layer norm's dg and db, batch norm
/// both ways) and the bias kernels, on sizes that cut every reduction into several chunks.
#[test]
#[ignore = "needs a CUDA GPU"]
fn chunked_reductions_and_bias_match_cpu_ops() {
    let (mut c, mut g) = (CpuOps, gpu());
    let up = |g: &mut CudaOps, x: &[f32]| g.upload(x).unwrap();
    let (rows, cols) = (3001, 70);
    let (x, z, bias, dout) = (rnd(rows * cols, 30), rnd(rows * cols, 31), rnd(cols, 32), rnd(rows * cols, 33));
    let (gx, gz, gbias, gd) = (up(&mut g, &x), up(&mut g, &z), up(&mut g, &bias), up(&mut g, &dout));
    let (mut s, mut gs) = (vec![0.0; cols], g.zeros(cols).unwrap());
    c.col_sum(&x, &mut s, rows).unwrap();
    g.col_sum(&gx, &mut gs, rows).unwrap();
    close("col_sum over chunks", &s, &g.download(&gs).unwrap(), 1e-5);
    let (mut y, mut gy) = (z.clone(), up(&mut g, &z));
    c.add_bias(&mut y, &bias, rows).unwrap();
    g.add_bias(&mut gy, &gbias, rows).unwrap();
    close("add_bias", &y, &g.download(&gy).unwrap(), 0.0);
    let (mut o, mut go) = (vec![0.0; x.len()], g.zeros(x.len()).unwrap());
    c.add(&x, &z, &mut o).unwrap();
    g.add(&gx, &gz, &mut go).unwrap();
    close("add", &o, &g.download(&go).unwrap(), 0.0);
    c.add_relu(&x, &z, &mut o).unwrap();
    g.add_relu(&gx, &gz, &mut go).unwrap();
    close("add_relu", &o, &g.download(&go).unwrap(), 0.0);
    let (mut y, mut gy) = (z.clone(), up(&mut g, &z));
    c.add_bias_gelu(&mut y, &bias, &mut o, rows).unwrap();
    g.add_bias_gelu(&mut gy, &gbias, &mut go, rows).unwrap();
    close("add_bias_gelu pre-activation", &y, &g.download(&gy).unwrap(), 0.0);
    close("add_bias_gelu", &o, &g.download(&go).unwrap(), 1e-5);
    c.add_bias_residual(&z, &bias, &x, &mut o, rows).unwrap();
    g.add_bias_residual(&gz, &gbias, &gx, &mut go, rows).unwrap();
    close("add_bias_residual", &o, &g.download(&go).unwrap(), 1e-6);
    let gam = rnd(cols, 34);
    let gg = up(&mut g, &gam);
    let (mut mu, mut rs) = (vec![0.0; rows], vec![0.0; rows]);
    c.layernorm_fwd(NormFwd { x: &x, g: &gam, b: &bias, out: &mut o, mean: &mut mu, rstd: &mut rs }, cols).unwrap();
    let (mut gmu, mut grs) = (g.zeros(rows).unwrap(), g.zeros(rows).unwrap());
    g.layernorm_fwd(NormFwd { x: &gx, g: &gg, b: &gbias, out: &mut go, mean: &mut gmu, rstd: &mut grs }, cols).unwrap();
    let (mut dx, mut dg, mut db) = (vec![0.0; x.len()], vec![0.0; cols], vec![0.0; cols]);
    c.layernorm_bwd(
        NormBwd { x: &x, g: &gam, mean: &mu, rstd: &rs, dout: &dout, dx: &mut dx, dg: &mut dg, db: &mut db },
        cols,
    )
    .unwrap();
    let (mut gdx, mut gdg, mut gdb) = (g.zeros(x.len()).unwrap(), g.zeros(cols).unwrap(), g.zeros(cols).unwrap());
    g.layernorm_bwd(
        NormBwd { x: &gx, g: &gg, mean: &gmu, rstd: &grs, dout: &gd, dx: &mut gdx, dg: &mut gdg, db: &mut gdb },
        cols,
    )
    .unwrap();
    close("layernorm dg over chunks", &dg, &g.download(&gdg).unwrap(), 1e-4);
    close("layernorm db over chunks", &db, &g.download(&gdb).unwrap(), 1e-4);
    // Batch norm: 70 channels of 3001 elements, offset by 100 (the shifted sums' case).
    let xs: Vec<f32> = x.iter().map(|v| v + 100.0).collect();
    let gxs = up(&mut g, &xs);
    let (m, ch) = (rows, cols);
    let (gam, bet) = (rnd(ch, 35), rnd(ch, 36));
    let (gg, gb) = (up(&mut g, &gam), up(&mut g, &bet));
    let (mut mu, mut rs) = (vec![0.0; ch], vec![0.0; ch]);
    c.batchnorm_fwd(NormFwd { x: &xs, g: &gam, b: &bet, out: &mut o, mean: &mut mu, rstd: &mut rs }, m).unwrap();
    let (mut gmu, mut grs) = (g.zeros(ch).unwrap(), g.zeros(ch).unwrap());
    g.batchnorm_fwd(NormFwd { x: &gxs, g: &gg, b: &gb, out: &mut go, mean: &mut gmu, rstd: &mut grs }, m).unwrap();
    close("batchnorm over chunks", &o, &g.download(&go).unwrap(), 1e-3);
    close("batchnorm mean", &mu, &g.download(&gmu).unwrap(), 1e-5);
    let (mut dg, mut db) = (vec![0.0; ch], vec![0.0; ch]);
    c.batchnorm_bwd(
        NormBwd { x: &xs, g: &gam, mean: &mu, rstd: &rs, dout: &dout, dx: &mut dx, dg: &mut dg, db: &mut db },
        m,
    )
    .unwrap();
    let (mut gdg, mut gdb) = (g.zeros(ch).unwrap(), g.zeros(ch).unwrap());
    g.batchnorm_bwd(
        NormBwd { x: &gxs, g: &gg, mean: &gmu, rstd: &grs, dout: &gd, dx: &mut gdx, dg: &mut gdg, db: &mut gdb },
        m,
    )
    .unwrap();
    close("batchnorm dx over chunks", &dx, &g.download(&gdx).unwrap(), 1e-3);
    close("batchnorm dg over chunks", &dg, &g.download(&gdg).unwrap(), 1e-3);
    close("batchnorm db over chunks", &db, &g.download(&gdb).unwrap(), 1e-4);
}

/// Layer norm forward and backward at a small width and the models' widths (float4 rows held
/// in registers, up to the largest such row, 2048), one past the largest (element by element)
/// and widths that are not a multiple of four.
#[test]
#[ignore = "needs a CUDA GPU"]
fn layer_norm_matches_cpu_ops_on_both_paths() {
    let (mut c, mut g) = (CpuOps, gpu());
    let up = |g: &mut CudaOps, x: &[f32]| g.upload(x).unwrap();
    for (rows, cols) in [(50, 96), (9, 768), (7, 2048), (5, 772), (6, 2052), (5, 2050), (4, 3)] {
        let (x, gam, bet, dout) = (rnd(rows * cols, 50), rnd(cols, 51), rnd(cols, 52), rnd(rows * cols, 53));
        let (mut o, mut mu, mut rs) = (vec![0.0; rows * cols], vec![0.0; rows], vec![0.0; rows]);
        c.layernorm_fwd(NormFwd { x: &x, g: &gam, b: &bet, out: &mut o, mean: &mut mu, rstd: &mut rs }, cols).unwrap();
        let (gx, gg, gb) = (up(&mut g, &x), up(&mut g, &gam), up(&mut g, &bet));
        let (mut go, mut gmu, mut grs) =
            (g.zeros(rows * cols).unwrap(), g.zeros(rows).unwrap(), g.zeros(rows).unwrap());
        g.layernorm_fwd(NormFwd { x: &gx, g: &gg, b: &gb, out: &mut go, mean: &mut gmu, rstd: &mut grs }, cols)
            .unwrap();
        let what = |w: &str| format!("layernorm {w} ({rows} x {cols})");
        close(&what("out"), &o, &g.download(&go).unwrap(), 1e-4);
        close(&what("rstd"), &rs, &g.download(&grs).unwrap(), 1e-4);
        // dx accumulates into what it holds.
        let (mut dx, mut dg, mut db) = (x.clone(), vec![0.0; cols], vec![0.0; cols]);
        c.layernorm_bwd(
            NormBwd { x: &x, g: &gam, mean: &mu, rstd: &rs, dout: &dout, dx: &mut dx, dg: &mut dg, db: &mut db },
            cols,
        )
        .unwrap();
        let gd = up(&mut g, &dout);
        let (mut gdx, mut gdg, mut gdb) = (up(&mut g, &x), g.zeros(cols).unwrap(), g.zeros(cols).unwrap());
        g.layernorm_bwd(
            NormBwd { x: &gx, g: &gg, mean: &gmu, rstd: &grs, dout: &gd, dx: &mut gdx, dg: &mut gdg, db: &mut gdb },
            cols,
        )
        .unwrap();
        close(&what("dx"), &dx, &g.download(&gdx).unwrap(), 1e-4);
        close(&what("dg"), &dg, &g.download(&gdg).unwrap(), 1e-4);
        close(&what("db"), &db, &g.download(&gdb).unwrap(), 1e-4);
    }
}
