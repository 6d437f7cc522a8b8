//! The test rigs' paced device (`GPUSANITY_TEST_PACE=MFLOPS`, passed to workers only with
//! `--test-faults`): a CPU worker whose GEMM products are paced to a fixed rate, with each
//! measurement's noise drawn from what H200s measured ([`H200_GEMM`]).
//!
//! A fleet test needs devices whose speed varies as a real fleet's does. A CPU does not: on a
//! shared 2-core VM the same GEMM measured 66 to 109 GFLOP/s per CPU-second from one 5-second
//! window to the next, with no other process running (the physical host's other tenants; docs/fleet.md,
//! Tests), where one H200's five measurements agreed within 0.5%. A paced device does the
//! products for real (the check verifies them) and then waits, product by product, for its
//! slot at the paced rate: while the host computes a product faster than its slot, which it
//! does by a wide margin at a pace well below the CPU's slowest, the host's own speed does not
//! reach the figure. Its figures are its pace's, per wall second, as a GPU's: the backend
//! reports no thread CPU time, and names the device apart (`... (paced)`), so that its figures
//! never share a fleet baseline with an unpaced CPU's.

use std::time::{Duration, Instant};

use gpusanity_common::envs::PACE_ENV;
use gpusanity_common::fleet::noise::H200_GEMM;
use rand::Rng;

/// The fastest pace accepted, MFLOP/s: far above any CPU worker's real rate.
const MAX_MFLOPS: u64 = 100_000_000;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    mflops: u64,
}

impl Pace {
    /// The pace of `GPUSANITY_TEST_PACE` (whole MFLOP/s, 1 to 10^8), if set, not empty and well formed;
    /// a malformed one is refused with a warning and the device runs unpaced.
    pub fn from_env() -> Option<Pace> {
        let v = std::env::var(PACE_ENV).ok().filter(|v| !v.is_empty())?;
        let pace = Pace::parse(&v);
        if pace.is_none() {
            tracing::warn!("{PACE_ENV}={v:?} is not a pace (whole MFLOP/s, 1 to {MAX_MFLOPS}): the GEMM runs unpaced");
        }
        pace
    }

    fn parse(v: &str) -> Option<Pace> {
        if v.is_empty() || v.len() > 12 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        v.parse().ok().filter(|m| (1..=MAX_MFLOPS).contains(m)).map(|mflops| Pace { mflops })
    }

    /// One measurement's slot per product of n x n x n: the pace times this measurement's noise.
    fn slot(&self, n: usize) -> Duration {
        let mut rng = rand::rng();
        let factor = H200_GEMM.measure(0.0, &mut || rng.random()) / H200_GEMM.centre;
        let flop = 2.0 * (n as f64).powi(3);
        Duration::from_secs_f64(flop / (self.mflops as f64 * 1e6 * factor.max(0.5)))
    }

    /// Runs `iters` products (`product`), one measurement: product k ends no sooner than k slots
    /// after the first began (deadlines from the start, so a late wake-up does not add up).
    /// Each product's time, from the end of the one before.
    pub fn run(&self, n: usize, iters: usize, mut product: impl FnMut()) -> Vec<f64> {
        let slot = self.slot(n);
        let start = Instant::now();
        let (mut last, mut times) = (start, Vec::with_capacity(iters));
        for k in 1..=iters {
            product();
            let due = start + slot.mul_f64(k as f64);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            let now = Instant::now();
            times.push((now - last).as_secs_f64());
            last = now;
        }
        times
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pace_is_whole_mflops_in_range() {
        assert_eq!(Pace::parse("10000"), Some(Pace { mflops: 10_000 }));
        assert_eq!(Pace::parse("100000000"), Some(Pace { mflops: MAX_MFLOPS }));
        for bad in ["", "0", "-5", "+5", "1.5", "1e4", "100000001", "99999999999999999999", "10 000", "x"] {
            assert_eq!(Pace::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn paced_products_take_their_slots_and_the_figure_follows_the_pace() {
        // 2 x 64^3 = 524,288 FLOP a product at 262 MFLOP/s: about 2 ms a slot, 20 slots.
        let pace = Pace { mflops: 262 };
        let mut done = 0;
        let started = Instant::now();
        let times = pace.run(64, 20, || done += 1);
        let took = started.elapsed().as_secs_f64();
        assert_eq!((done, times.len()), (20, 20));
        let window: f64 = times.iter().sum();
        let rate = 20.0 * 2.0 * 64f64.powi(3) / window / 1e6;
        // The noise model's draws lie within -3.4% and +7.1% of the centre but for a normal's
        // far tail; a late wake-up after the last product adds a little time.
        assert!((230.0..290.0).contains(&rate), "{rate} MFLOP/s");
        assert!((window - took).abs() < 0.005, "the products' times cover the measurement");
    }
}
