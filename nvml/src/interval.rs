//! Means over a sampling interval: of the SM clock read several times within it, and of the
//! power from the driver's energy counter (`nvmlDeviceGetTotalEnergyConsumption`, millijoules
//! since the driver loaded). Pure, so that the arithmetic is tested without a GPU.

use std::time::{Duration, Instant};

/// The highest mean power taken for true, watts (the wire's bound for a power reading).
const MAX_W: f64 = 100_000.0;
/// The shortest span an energy difference is divided by: shorter ones say more about the
/// counter's granularity than about the power.
const MIN_SPAN: Duration = Duration::from_millis(50);

/// The mean of the readings taken since the last mean.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Mean {
    sum: u64,
    n: u64,
}

impl Mean {
    pub fn add(&mut self, v: u32) {
        self.sum = self.sum.saturating_add(u64::from(v));
        self.n += 1;
    }

    /// The mean of the readings added since the last call, rounded; None without any.
    pub fn take(&mut self) -> Option<u32> {
        let Mean { sum, n } = std::mem::take(self);
        (n > 0).then(|| u32::try_from((sum + n / 2) / n).unwrap_or(u32::MAX))
    }
}

/// The mean power between two readings of the energy counter.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Energy {
    last: Option<(u64, Instant)>,
}

impl Energy {
    /// Watts since the last reading, given the counter now (`mj`) read at `at`; None for the
    /// first reading, one too soon after the last, a counter that went back (a driver reload) or
    /// a figure no GPU draws.
    pub fn mean_w(&mut self, mj: Option<u64>, at: Instant) -> Option<f32> {
        let mj = mj?;
        let Some((last_mj, last_at)) = self.last else {
            self.last = Some((mj, at));
            return None;
        };
        let span = at.saturating_duration_since(last_at);
        if span < MIN_SPAN && mj >= last_mj {
            return None;
        }
        self.last = Some((mj, at));
        let used = mj.checked_sub(last_mj)?;
        let w = used as f64 / span.as_secs_f64() / 1000.0;
        (w.is_finite() && w <= MAX_W).then_some(w as f32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mean_is_of_the_readings_since_the_last_one() {
        let mut m = Mean::default();
        m.add(1700);
        m.add(1801);
        assert_eq!(m.take(), Some(1751));
        assert_eq!(m.take(), None, "nothing since");
        m.add(1500);
        assert_eq!(m.take(), Some(1500));
    }

    #[test]
    fn the_mean_does_not_overflow() {
        let mut m = Mean::default();
        for _ in 0..1000 {
            m.add(u32::MAX);
        }
        assert_eq!(m.take(), Some(u32::MAX));
    }

    #[test]
    fn energy_over_the_span_is_the_mean_power() {
        let t0 = Instant::now();
        let mut e = Energy::default();
        assert_eq!(e.mean_w(Some(1_000_000), t0), None, "the first reading only starts the span");
        // 690 J in one second: 690 W.
        let w = e.mean_w(Some(1_690_000), t0 + Duration::from_secs(1)).unwrap_or(0.0);
        assert!((w - 690.0).abs() < 1e-3, "{w}");
        // Half a second later, 150 J: 300 W.
        let w = e.mean_w(Some(1_840_000), t0 + Duration::from_millis(1500)).unwrap_or(0.0);
        assert!((w - 300.0).abs() < 1e-3, "{w}");
    }

    #[test]
    fn energy_refuses_what_it_cannot_divide() {
        let t0 = Instant::now();
        let mut e = Energy::default();
        assert_eq!(e.mean_w(None, t0), None);
        e.mean_w(Some(5_000), t0);
        assert_eq!(e.mean_w(Some(6_000), t0 + Duration::from_millis(10)), None, "too short a span");
        // The counter went back (the driver reloaded): nothing, and the next span starts here.
        assert_eq!(e.mean_w(Some(100), t0 + Duration::from_secs(1)), None);
        let w = e.mean_w(Some(700_100), t0 + Duration::from_secs(2)).unwrap_or(0.0);
        assert!((w - 700.0).abs() < 1e-3, "{w}");
        // A figure no GPU draws (a forged or broken counter).
        assert_eq!(e.mean_w(Some(u64::MAX), t0 + Duration::from_secs(3)), None);
    }
}
