//! This host's own GEMM speed over time (docs/fleet.md, "Tests"): every PERIOD seconds for
//! SECONDS seconds, one measurement of the fleet tests' GEMM (40 products of 256^3 fp32 on one
//! thread, the `gemm` crate as the CPU backend runs it), its rate per CPU-second. Prints the
//! median, 10th percentile and least, the share of measurements under 93% of the median, and
//! the medians over 5-second windows: how much a CPU test rig's "device" varies on its own.
//!
//! Usage: cpu_speed [SECONDS] [PERIOD]  (defaults 300 and 0.1)

use std::time::{Duration, Instant};

use nix::time::{clock_gettime, ClockId};

const N: usize = 256;
const PRODUCTS: usize = 40;

fn thread_cpu_s() -> Result<f64, nix::Error> {
    let t = clock_gettime(ClockId::CLOCK_THREAD_CPUTIME_ID)?;
    Ok(t.tv_sec() as f64 + t.tv_nsec() as f64 * 1e-9)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(300.0);
    let period: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(0.1);
    let (a, b, mut c) = (vec![1.0f32; N * N], vec![0.5f32; N * N], vec![0.0f32; N * N]);
    let flop = 2.0 * (N as f64).powi(3) * PRODUCTS as f64;
    let start = Instant::now();
    let mut samples: Vec<(f64, f64)> = Vec::new();
    while start.elapsed().as_secs_f64() < seconds {
        let before = thread_cpu_s()?;
        for _ in 0..PRODUCTS {
            // SAFETY: a, b and c are N x N row-major buffers owned here; the strides (column 1,
            // row N) keep every access inside them, and c aliases neither a nor b.
            unsafe {
                gemm::gemm(
                    N,
                    N,
                    N,
                    c.as_mut_ptr(),
                    1,
                    N as isize,
                    false,
                    a.as_ptr(),
                    1,
                    N as isize,
                    b.as_ptr(),
                    1,
                    N as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
        }
        let cpu = thread_cpu_s()? - before;
        if cpu > 0.0 {
            samples.push((start.elapsed().as_secs_f64(), flop / cpu / 1e9));
        }
        std::thread::sleep(Duration::from_secs_f64(period));
    }
    let mut rates: Vec<f64> = samples.iter().map(|s| s.1).collect();
    if rates.is_empty() {
        return Err("no measurement".into());
    }
    let med = median(&mut rates);
    let slow = rates.iter().filter(|r| **r < 0.93 * med).count();
    println!(
        "{} measurements over {seconds} s: median {med:.1} GFLOP/s per CPU-second, 10th percentile {:.1}, least {:.1}; \
         {:.1}% under 93% of the median",
        rates.len(),
        rates[rates.len() / 10],
        rates[0],
        100.0 * slow as f64 / rates.len() as f64
    );
    let mut windows: Vec<Vec<f64>> = Vec::new();
    for (t, r) in samples {
        let w = (t / 5.0) as usize;
        windows.resize_with(windows.len().max(w + 1), Vec::new);
        windows[w].push(r);
    }
    let medians: Vec<String> =
        windows.iter_mut().filter(|w| !w.is_empty()).map(|w| format!("{:.0}", median(w))).collect();
    println!("medians over 5-second windows: {}", medians.join(" "));
    Ok(())
}
