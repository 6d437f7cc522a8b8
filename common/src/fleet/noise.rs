//! How a healthy device's GEMM figure varies, as measured on H200s: the model that the fleet
//! simulation (`bench/fleet_sim.rs`, the false-positive and recall figures of docs/fleet.md)
//! and the paced CPU device of the test rigs (`GPUSANITY_TEST_PACE`) both draw from.
//!
//! gpusanity's GEMM check measured 676.7-695 TFLOP/s across runs and days (median about 686);
//! PyTorch's sustained loop on the same device 662.7-735.0. The model: the centre, plus a device
//! offset per node, a day offset shared by every node, and a run's own noise, each normal; and
//! in a small share of runs a draw uniform over PyTorch's wider range instead (real runs have
//! heavier tails than a normal).

/// The spread of one device model's GEMM figure, in its unit (TFLOP/s).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub centre: f64,
    /// Standard deviation of a device's own offset (one per node).
    pub node_sd: f64,
    /// Standard deviation of an offset shared by every node for a day.
    pub day_sd: f64,
    /// Standard deviation of one measurement's own noise.
    pub run_sd: f64,
    /// The range of the heavier tail's draws, and the share of measurements drawn from it.
    pub wide: (f64, f64),
    pub wide_share: f64,
}

/// gpusanity's GEMM on H200s (docs/benchmarks/fleet.md): ten runs of the model span about the
/// range measured.
pub const H200_GEMM: Spread =
    Spread { centre: 686.0, node_sd: 2.5, day_sd: 3.0, run_sd: 3.5, wide: (662.7, 735.0), wide_share: 0.02 };

impl Spread {
    /// One measurement of a device `offset` from the centre (its node's and the day's offsets),
    /// drawing from `uniform` (numbers in [0, 1): the caller's random number generator, this
    /// crate has none).
    pub fn measure(&self, offset: f64, uniform: &mut impl FnMut() -> f64) -> f64 {
        if uniform() < self.wide_share {
            self.wide.0 + (self.wide.1 - self.wide.0) * uniform()
        } else {
            self.centre + offset + self.run_sd * standard_normal(uniform)
        }
    }
}

/// A standard normal draw from two uniform ones (Box-Muller).
pub fn standard_normal(uniform: &mut impl FnMut() -> f64) -> f64 {
    // 1 - u is in (0, 1]: its logarithm is finite.
    let (u1, u2) = (1.0 - uniform(), uniform());
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed sequence of uniform numbers (a linear congruential generator).
    fn lcg(mut s: u64) -> impl FnMut() -> f64 {
        move || {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (s >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    #[test]
    fn measurements_centre_on_the_model_and_keep_its_spread_and_tail() {
        let mut u = lcg(7);
        let n = 100_000;
        let draws: Vec<f64> = (0..n).map(|_| H200_GEMM.measure(0.0, &mut u)).collect();
        let mut sorted = draws.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[n / 2];
        assert!((median - H200_GEMM.centre).abs() < 0.2, "median {median}");
        // The middle half of a normal of sd 3.5 spans 4.7; the tail barely moves it.
        let iqr = sorted[3 * n / 4] - sorted[n / 4];
        assert!((4.4..5.1).contains(&iqr), "interquartile range {iqr}");
        let wide = draws.iter().filter(|d| **d > H200_GEMM.centre + 6.0 * H200_GEMM.run_sd).count();
        // Above 707: (735 - 707) / (735 - 662.7) of the 2% tail, about 0.77%.
        assert!((0.006..0.0095).contains(&(wide as f64 / n as f64)), "{wide} of {n} in the upper tail");
        assert!(draws.iter().all(|d| d.is_finite()));
    }

    #[test]
    fn a_uniform_source_at_its_ends_gives_finite_normals() {
        for (a, b) in [(0.0, 0.0), (0.0, 0.999_999), (0.999_999, 0.5)] {
            let mut seq = [a, b].into_iter().cycle();
            assert!(standard_normal(&mut || seq.next().unwrap_or(0.5)).is_finite());
        }
    }
}
