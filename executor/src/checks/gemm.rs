//! `gemm`: square matrix products of random data (bf16 on GPU, fp32 on CPU). Finds a faulty
//! device (error, hang, wrong result) and a slow one (low TFLOP/s).
//!
//! Every rank multiplies the same inputs. The product is verified twice: a tile of C against an
//! f64 reference computed on the host from the same inputs (catches a wrong result on any
//! rank, even alone), and a hash of the whole of C, which the diagnosis compares between ranks
//! of the same device model (catches a difference anywhere in C).

use anyhow::{Context, Result};
use gpusanity_common::bandwidth::gemm_tflops;
use gpusanity_common::detail::CheckDetail;
use gpusanity_common::report::{CheckStatus, RankResult};
use rand::{Rng, SeedableRng};

use gpusanity_common::stats::median;

use super::CheckCtx;
use crate::backend::Dtype;

pub const NAME: gpusanity_common::CheckId = gpusanity_common::CheckId::Gemm;

/// The same on every rank, so that every rank computes the same C.
const INPUT_SEED: u64 = 0x6765_6d6d;

pub fn run(ctx: &mut CheckCtx<'_>) -> Result<RankResult> {
    let cfg = &ctx.configs.gemm;
    let (n, rank) = (cfg.size, ctx.place.rank);
    let dtype = ctx.backend.gemm_dtype();
    ctx.progress.phase(NAME, "load", 0);
    let started = std::time::Instant::now();
    let (a, b) = random_inputs(n, dtype);
    let inputs_ms = started.elapsed().as_millis() as u64;
    ctx.backend.gemm_load(n, &a, &b).context("loading GEMM inputs")?;
    let loaded = std::time::Instant::now();

    // Ranks start timing together, so that no rank's timed loop shares the host with another
    // rank's input generation.
    ctx.store.barrier_all("gemm/timed", super::BARRIER_WAIT)?;
    ctx.progress.phase(NAME, "warmup", 0);
    // The GPU's clocks and power are sampled for `gpu-health` from here to the last timed
    // product, when that check runs later in this worker.
    let sampling = super::gpu_health::sample_load(ctx);
    ctx.backend.gemm_run(cfg.warmup).context("GEMM warm-up")?;
    // Injected slowness: the device does the product eight times in one timed iteration. Eight,
    // not fewer: on CPU the faulty rank has the cores to itself once its peers have finished,
    // and where two CPUs are one core's hyperthreads it then runs up to twice as fast; at four
    // its figure came out near 40% of its peers', too close to the CPU's 50% band.
    let reps = if ctx.faults.has("gemm-slow", rank) { 8 } else { 1 };
    // All timed products back to back in one call, as a training step issues them: time the
    // GPU gives to another process meanwhile lands inside the timed window.
    ctx.progress.phase(NAME, "timed", 0);
    // Injected drift (`gemm-extra-PCT`): PCT% more products in the same timed call, their time
    // spread over the timed products, so the figure comes out PCT% lower for real work done.
    let extra =
        ctx.faults.percent("gemm-extra", rank).map_or(0, |p| cfg.iters.saturating_mul(p as usize).saturating_add(50) / 100);
    let timed = cfg.iters * reps;
    let cpu_before = ctx.backend.thread_cpu_seconds();
    let each = ctx.backend.gemm_run(timed.saturating_add(extra)).context("timed GEMM")?;
    let cpu = super::cpu_time::since(&*ctx.backend, cpu_before);
    let spread = each.get(timed..).map_or(0.0, |e| e.iter().sum::<f64>()) / cfg.iters.max(1) as f64;
    let times: Vec<f64> = each[..timed.min(each.len())].chunks(reps).map(|c| c.iter().sum::<f64>() + spread).collect();
    if let Some(s) = sampling {
        *ctx.load = Some(s.stop(format!("the gemm check's {} products {n}x{n}x{n}", cfg.warmup + cfg.iters * reps)));
    }

    ctx.progress.phase(NAME, "verify", 0);
    let multiplied = std::time::Instant::now();
    let mut c = ctx.backend.gemm_output().context("reading the product back")?;
    ctx.backend.gemm_free();
    let tile = Tile::pick(n, cfg.verify_tile, rank);
    if ctx.faults.has("gemm-wrong", rank) {
        corrupt(&mut c, dtype, tile.r0 * n + tile.c0);
    }
    let check = verify_tile(&a, &b, &c, n, dtype, &tile);
    let hash = xxhash_rust::xxh3::xxh3_64(&c);
    // Where the check's wall goes (a log line, for bench/gpu/cold_start.sh): the inputs, their
    // upload, the products (from the barrier before them), and reading back, verifying and
    // hashing C.
    tracing::info!(
        inputs_ms,
        load_ms = ((loaded - started).as_millis() as u64).saturating_sub(inputs_ms),
        products_ms = (multiplied - loaded).as_millis() as u64,
        verify_ms = multiplied.elapsed().as_millis() as u64,
        "gemm phases"
    );

    let tflops: Vec<f64> = times.iter().map(|t| gemm_tflops(n as u64, n as u64, n as u64, *t)).collect();
    let mut r = RankResult::new(rank, if check.bad == 0 { CheckStatus::Passed } else { CheckStatus::Failed });
    // The headline is sustained throughput over the whole timed window (a device shared with
    // another process loses whole time slices, which a median of single products can hide).
    let window: f64 = times.iter().sum();
    r.metrics.insert("tflops".into(), gemm_tflops(n as u64, n as u64, (n * times.len()) as u64, window));
    // On CPU workers also per CPU-second the thread got (what the peers are judged on there:
    // a rank descheduled by other processes on the host is not slow); `tflops` stays the
    // wall-clock figure a user reads.
    let flop_n = (n * times.len()) as u64;
    super::cpu_time::insert(&mut r, "tflops", window, cpu, |s| gemm_tflops(n as u64, n as u64, flop_n, s));
    r.metrics.insert("tflops_median".into(), median(&tflops));
    r.metrics.insert("tflops_best".into(), tflops.iter().copied().fold(0.0, f64::max));
    r.metrics.insert("time_ms_median".into(), median(&times) * 1e3);
    r.metrics.insert("wrong_elements".into(), check.bad as f64);
    r.metrics.insert("max_error".into(), check.max_err);
    r.notes.insert("dtype".into(), dtype.name().into());
    r.notes.insert("size".into(), format!("{n}x{n}x{n}"));
    r.detail = Some(CheckDetail::Gemm { result_hash: format!("{hash:016x}") });
    r.notes.insert("verified_tile".into(), format!("rows {}.., cols {}.. ({}x{})", tile.r0, tile.c0, tile.t, tile.t));
    if check.bad > 0 {
        r.error = Some(format!(
            "{} of {} verified elements of C are wrong (first at row {}, col {}: got {}, expected {})",
            check.bad,
            tile.t * tile.t,
            check.first.0,
            check.first.1,
            check.first.2,
            check.first.3
        ));
    }
    Ok(r)
}

/// Uniform random values in [-1, 1), rounded to what `dtype` holds. Generated in fixed blocks,
/// each from its own seed, on several threads: the values depend only on `n`, never on the
/// number of threads.
pub fn random_inputs(n: usize, dtype: Dtype) -> (Vec<f32>, Vec<f32>) {
    const BLOCK: usize = 1 << 20;
    let fill = |v: &mut [f32], salt: u64| {
        let threads = std::thread::available_parallelism().map_or(1, |t| t.get()).min(16);
        let blocks: Vec<(usize, &mut [f32])> = v.chunks_mut(BLOCK).enumerate().collect();
        let per = blocks.len().div_ceil(threads).max(1);
        let mut groups: Vec<Vec<(usize, &mut [f32])>> = Vec::new();
        let mut it = blocks.into_iter().peekable();
        while it.peek().is_some() {
            groups.push(it.by_ref().take(per).collect());
        }
        std::thread::scope(|s| {
            for group in groups {
                s.spawn(move || {
                    for (i, block) in group {
                        let seed = INPUT_SEED ^ (n as u64) << 32 ^ salt << 60 ^ i as u64;
                        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
                        for x in block.iter_mut() {
                            *x = dtype.round(rng.random_range(-1.0f32..1.0));
                        }
                    }
                });
            }
        });
    };
    let mut a = vec![0f32; n * n];
    let mut b = vec![0f32; n * n];
    fill(&mut a, 1);
    fill(&mut b, 2);
    (a, b)
}

/// A square tile of C, placed differently on every rank so that ranks cover different parts.
#[derive(Debug, Clone)]
pub struct Tile {
    pub r0: usize,
    pub c0: usize,
    pub t: usize,
}

impl Tile {
    pub fn pick(n: usize, t: usize, rank: usize) -> Tile {
        let t = t.min(n).max(1);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(0x7113 + rank as u64);
        Tile { r0: rng.random_range(0..=n - t), c0: rng.random_range(0..=n - t), t }
    }
}

#[derive(Debug, Default)]
pub struct TileCheck {
    pub bad: usize,
    pub max_err: f64,
    /// Row, column, got, expected of the first wrong element.
    pub first: (usize, usize, f64, f64),
}

/// Compares a tile of `c` (raw bytes of `dtype`) with an f64 reference of A B.
///
/// Tolerance per element: the output's rounding (2 units of its last place) plus 2^-16 of the
/// sum of |a_ik b_kj| for the fp32 accumulation, orders of magnitude above what a healthy
/// device's accumulation error reaches for these sizes and far below a corrupted element.
pub fn verify_tile(a: &[f32], b: &[f32], c: &[u8], n: usize, dtype: Dtype, tile: &Tile) -> TileCheck {
    let out_eps = match dtype {
        Dtype::Bf16 => 2f64.powi(-8),
        Dtype::F32 => 2f64.powi(-23),
    };
    let mut res = TileCheck::default();
    for i in tile.r0..tile.r0 + tile.t {
        for j in tile.c0..tile.c0 + tile.t {
            let (mut exact, mut abs) = (0f64, 0f64);
            for k in 0..n {
                let p = a[i * n + k] as f64 * b[k * n + j] as f64;
                exact += p;
                abs += p.abs();
            }
            let got = dtype.decode(c, i * n + j) as f64;
            let err = (got - exact).abs();
            let tol = 2.0 * out_eps * exact.abs() + abs * 2f64.powi(-16);
            if err.is_nan() || err > tol {
                if res.bad == 0 {
                    res.first = (i, j, got, exact);
                }
                res.bad += 1;
            }
            if err.is_finite() {
                res.max_err = res.max_err.max(err);
            }
        }
    }
    res
}

fn corrupt(c: &mut [u8], dtype: Dtype, idx: usize) {
    let v = dtype.decode(c, idx);
    let mut enc = Vec::new();
    dtype.encode(-v - 1.0, &mut enc);
    c[idx * dtype.size()..(idx + 1) * dtype.size()].copy_from_slice(&enc);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn product(a: &[f32], b: &[f32], n: usize, dtype: Dtype) -> Vec<u8> {
        let mut c = Vec::new();
        for i in 0..n {
            for j in 0..n {
                let s: f32 = (0..n).map(|k| a[i * n + k] * b[k * n + j]).sum();
                dtype.encode(s, &mut c);
            }
        }
        c
    }

    #[test]
    fn verifier_accepts_a_right_product_and_rejects_a_wrong_one() {
        for dtype in [Dtype::F32, Dtype::Bf16] {
            let n = 48;
            let (a, b) = random_inputs(n, dtype);
            let mut c = product(&a, &b, n, dtype);
            let tile = Tile { r0: 8, c0: 16, t: 16 };
            let ok = verify_tile(&a, &b, &c, n, dtype, &tile);
            assert_eq!(ok.bad, 0, "{dtype:?} {ok:?}");
            corrupt(&mut c, dtype, 10 * n + 20);
            let bad = verify_tile(&a, &b, &c, n, dtype, &tile);
            assert_eq!(bad.bad, 1, "{dtype:?}");
            assert_eq!((bad.first.0, bad.first.1), (10, 20));
            // A small error, within the output's rounding, is not a fault...
            let mut c2 = product(&a, &b, n, dtype);
            let v = dtype.decode(&c2, 9 * n + 17);
            let mut enc = Vec::new();
            dtype.encode(v * (1.0 + 1e-9), &mut enc);
            c2[(9 * n + 17) * dtype.size()..(9 * n + 18) * dtype.size()].copy_from_slice(&enc);
            assert_eq!(verify_tile(&a, &b, &c2, n, dtype, &tile).bad, 0);
            // ...a NaN is.
            let mut c3 = product(&a, &b, n, dtype);
            let mut nan = Vec::new();
            dtype.encode(f32::NAN, &mut nan);
            c3[(12 * n + 18) * dtype.size()..(12 * n + 19) * dtype.size()].copy_from_slice(&nan);
            assert_eq!(verify_tile(&a, &b, &c3, n, dtype, &tile).bad, 1);
        }
    }

    #[test]
    fn inputs_are_identical_across_calls_and_exact_in_dtype() {
        let (a1, _) = random_inputs(16, Dtype::Bf16);
        let (a2, _) = random_inputs(16, Dtype::Bf16);
        assert_eq!(a1, a2);
        assert!(a1.iter().all(|x| Dtype::Bf16.round(*x) == *x && (-1.0..1.0).contains(x)));
    }
}
