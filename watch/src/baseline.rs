//! The rule against the GPU's own past: each GPU's SM clock as a ratio to the job's median at
//! the same instant, against the ratio usual for that GPU (its baseline).
//!
//! At their power cap the GPUs of one job settle at clocks a few percent apart (silicon spread),
//! so the spread across GPUs at one instant holds these static offsets as well as each sample's
//! noise, and the rule against the peers' median ([`crate::peers`]) needs a floor wide enough
//! for both: a GPU that turns 10 % slow from a few percent above the median can stay above it.
//! Divided by the GPU's usual ratio, the offset leaves: the residual `ratio / usual - 1` spreads
//! across the job's GPUs by the sample noise alone, and a GPU whose clock fell against its own
//! past stands out of the others' residuals. The residual is relative to the GPU's own usual
//! clock, so `clock_gap` means the same fraction of it as in the rule against the peers.
//!
//! What it cannot see: a GPU that turns slow before it has learned `baseline_ticks` busy
//! instants learns the slow ratio as its usual one (the rule against the peers remains); a
//! change slower than about `clock_gap` per `baseline_ticks` instants is followed, not judged.
//! A phase of the job that moves the GPUs' offsets (off the power cap they narrow) moves every
//! residual at once: their spread widens with it, and only a GPU whose offset alone moves by
//! more than the gap stands out.
//!
//! The state is one [`Usual`] per GPU, and two scratch buffers reused from tick to tick.

use crate::stats::median_mad_mut;
use crate::tick::{Judged, Own, Reading};
use crate::JudgeConfig;

/// One GPU's usual ratio of its SM clock to the job's median at the same instant.
#[derive(Debug, Clone, Copy, Default)]
struct Usual {
    /// The mean ratio over the busy instants learned (weighted as [`Usual::learn`] says).
    mean: f64,
    /// The busy instants learned, counted up to `baseline_ticks`.
    learned: u32,
}

impl Usual {
    /// Learns one instant's ratio. The first `n` instants are averaged plainly (the newest
    /// weighs 1/learned); every later one weighs 1/n, as the n-th did, which makes the baseline
    /// an exponentially weighted mean continuing the running mean without a jump. Its memory
    /// is about n instants: its own noise is a fraction 1/sqrt(2n - 1) of one sample's (0.13
    /// at n = 30), a drift of the GPU's ratio by d per instant is followed with a lag of about
    /// n·d (0.02 % for 2 % over an hour at n = 30), and a GPU turning slow from one instant to
    /// the next is low against it at once; its low instants are never learned.
    fn learn(&mut self, ratio: f64, n: u32) {
        if self.learned < n {
            self.learned += 1;
        }
        self.mean += (ratio - self.mean) / f64::from(self.learned);
    }
}

#[derive(Debug, Default)]
pub(crate) struct Baselines {
    /// Each GPU's usual ratio, by key.
    by_key: Vec<Usual>,
    /// The residual of each busy reading of the tick judged, NaN where it has none.
    residuals: Vec<f64>,
    /// The residuals that exist, reordered to take their median and deviation.
    work: Vec<f64>,
}

impl Baselines {
    /// Judges the clocks of one tick (`clocks[i]` is `busy[i]`'s, as the peers' rule judged
    /// it) against each GPU's usual ratio: once `min_peers` of them have learned
    /// `baseline_ticks` instants, a GPU whose residual is below the residuals' median by more
    /// than both `clock_gap` and `mad_k` scaled deviations is low by this rule too. Then learns
    /// the ratio of each GPU low by neither rule at this tick.
    pub fn judge(&mut self, cfg: &JudgeConfig, busy: &[&Reading], clocks: &mut [Option<Judged>]) {
        let n = cfg.baseline_ticks;
        if n == 0 {
            return;
        }
        if let Some(top) = busy.iter().map(|r| r.key).max() {
            if self.by_key.len() <= top {
                self.by_key.resize(top + 1, Usual::default());
            }
        }
        self.residuals.clear();
        self.work.clear();
        for (r, j) in busy.iter().zip(clocks.iter()) {
            let u = self.by_key[r.key];
            let residual = match j {
                Some(j) if u.learned >= n && u.mean > 0.0 && j.median > 0.0 => j.value / j.median / u.mean - 1.0,
                _ => f64::NAN,
            };
            self.residuals.push(residual);
            if residual.is_finite() {
                self.work.push(residual);
            }
        }
        let floor = (self.work.len() >= cfg.min_peers)
            .then(|| median_mad_mut(&mut self.work))
            .flatten()
            .map(|(median, spread)| (median - (cfg.mad_k * spread).max(cfg.clock_gap), spread));
        for ((r, j), residual) in busy.iter().zip(clocks.iter_mut()).zip(&self.residuals) {
            let Some(j) = j.as_mut() else { continue };
            let usual = &mut self.by_key[r.key];
            if let Some((floor, spread)) = floor.filter(|_| residual.is_finite()) {
                j.own = Some(Own { usual: usual.mean as f32, spread: spread as f32, low: *residual < floor });
            }
            if !j.is_low() && j.median > 0.0 {
                usual.learn(j.value / j.median, n);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_usual_ratio_is_a_running_mean_then_an_exponential_one() {
        let mut u = Usual::default();
        for x in [1.0, 0.9, 1.1, 1.0] {
            u.learn(x, 4);
        }
        assert_eq!(u.learned, 4);
        assert!((u.mean - 1.0).abs() < 1e-12, "{u:?}");
        u.learn(1.2, 4);
        assert_eq!(u.learned, 4);
        assert!((u.mean - 1.05).abs() < 1e-12, "the fifth weighs 1/4: {u:?}");
    }

    fn reading(key: usize, mhz: f64) -> Reading {
        Reading { key, sm_mhz: Some(mhz), power_w: None, util: Some(100) }
    }

    fn judged(r: &Reading, median: f64) -> Option<Judged> {
        Some(Judged { low: false, value: r.sm_mhz.unwrap_or(0.0), median, spread: 0.0, own: None })
    }

    #[test]
    fn a_gpu_falling_against_its_own_usual_ratio_is_low_and_not_learned() {
        let cfg = JudgeConfig { baseline_ticks: 3, ..Default::default() };
        let mut b = Baselines::default();
        // Eight GPUs 4 % apart, steady: none is low against itself.
        let clock = |k: usize| 1800.0 * (0.86 + 0.04 * k as f64);
        let tick = |b: &mut Baselines, slow: f64| {
            let rs: Vec<Reading> = (0..8)
                .map(|k| reading(k, clock(k) * if k == 7 { slow } else { 1.0 } * (1.0 + 0.001 * k as f64)))
                .collect();
            let busy: Vec<&Reading> = rs.iter().collect();
            let mut clocks: Vec<Option<Judged>> = busy.iter().map(|r| judged(r, 1800.0)).collect();
            b.judge(&cfg, &busy, &mut clocks);
            clocks
        };
        for _ in 0..3 {
            assert!(tick(&mut b, 1.0).iter().all(|j| j.is_some_and(|j| j.own.is_none())), "warming up");
        }
        let steady = tick(&mut b, 1.0);
        assert!(steady.iter().all(|j| j.is_some_and(|j| j.own.is_some_and(|o| !o.low))), "{steady:?}");
        let usual = b.by_key[7].mean;
        // The fastest GPU turns 10 % slow: still above the median, low against itself.
        let fell = tick(&mut b, 0.9);
        let own = fell[7].and_then(|j| j.own).expect("judged");
        assert!(own.low && (f64::from(own.usual) - usual).abs() < 1e-6, "{own:?}");
        assert!(fell[..7].iter().all(|j| j.is_some_and(|j| j.own.is_some_and(|o| !o.low))));
        assert_eq!(b.by_key[7].mean, usual, "a low instant is not learned");
    }

    #[test]
    fn zero_baseline_ticks_judge_nothing() {
        let cfg = JudgeConfig { baseline_ticks: 0, ..Default::default() };
        let mut b = Baselines::default();
        let rs: Vec<Reading> = (0..8).map(|k| reading(k, 1800.0)).collect();
        let busy: Vec<&Reading> = rs.iter().collect();
        let mut clocks: Vec<Option<Judged>> = busy.iter().map(|r| judged(r, 1800.0)).collect();
        for _ in 0..10 {
            b.judge(&cfg, &busy, &mut clocks);
        }
        assert!(b.by_key.is_empty() && clocks.iter().all(|j| j.is_some_and(|j| j.own.is_none())));
    }
}
