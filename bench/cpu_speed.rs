//! This host's own GEMM speed over time (docs/fleet.md, "Tests"): every PERIOD seconds for
//! SECONDS seconds, one measurement of the fleet tests' GEMM (40 products of 256^3 fp32 on one
//! thread, the CPU backend's own `CpuGemm`), its rate per CPU-second. Prints the
//! median, 10th percentile and least, the share of measurements under 93% of the median, and
//! the medians over 5-second windows: how much a CPU test rig's "device" varies on its own.
//!
//! Usage: cpu_speed [SECONDS] [PERIOD]  (defaults 300 and 0.1)

use std::time::{Duration, Instant};

use gpusanity_common::bandwidth::gemm_tflops;
use gpusanity_common::stats::median;
use gpusanity_executor::backend::cpu::{thread_cpu_seconds, CpuGemm};

const N: usize = 256;
const PRODUCTS: usize = 40;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let seconds: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(300.0);
    let period: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(0.1);
    let mut gemm = CpuGemm::new(N, &vec![1.0f32; N * N], &vec![0.5f32; N * N])?;
    let start = Instant::now();
    let mut samples: Vec<(f64, f64)> = Vec::new();
    while start.elapsed().as_secs_f64() < seconds {
        let before = thread_cpu_seconds()?;
        for _ in 0..PRODUCTS {
            gemm.product();
        }
        let cpu = thread_cpu_seconds()? - before;
        if cpu > 0.0 {
            let gflops = gemm_tflops(N as u64, N as u64, (N * PRODUCTS) as u64, cpu) * 1e3;
            samples.push((start.elapsed().as_secs_f64(), gflops));
        }
        std::thread::sleep(Duration::from_secs_f64(period));
    }
    let mut rates: Vec<f64> = samples.iter().map(|s| s.1).collect();
    if rates.is_empty() {
        return Err("no measurement".into());
    }
    rates.sort_by(f64::total_cmp);
    let med = median(&rates);
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
    let medians: Vec<String> = windows.iter().filter(|w| !w.is_empty()).map(|w| format!("{:.0}", median(w))).collect();
    println!("medians over 5-second windows: {}", medians.join(" "));
    Ok(())
}
