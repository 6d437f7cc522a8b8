//! The mean of readings taken within a sampling interval (the SM clock and the power draw,
//! read several times an interval). Pure, so that the arithmetic is tested without a GPU.

/// The mean of the readings taken since the last mean (MHz, or milliwatts).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Mean {
    sum: u64,
    n: u64,
}

impl Mean {
    pub fn add(&mut self, v: u32) {
        self.sum = self.sum.saturating_add(u64::from(v));
        self.n = self.n.saturating_add(1);
    }

    /// The mean of the readings added since the last call, rounded; None without any.
    pub fn take(&mut self) -> Option<u32> {
        let Mean { sum, n } = std::mem::take(self);
        (n > 0).then(|| u32::try_from((sum + n / 2) / n).unwrap_or(u32::MAX))
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
}
