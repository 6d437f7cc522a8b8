//! Waiting between attempts while the database or the broker is away: 100 ms, doubling, at
//! most 5 s.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
}

const FIRST: Duration = Duration::from_millis(100);
const MOST: Duration = Duration::from_secs(5);

impl Default for Backoff {
    fn default() -> Self {
        Backoff { next: FIRST }
    }
}

impl Backoff {
    /// The next wait; the one after it is twice as long, up to the most.
    pub fn step(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.saturating_mul(2).min(MOST);
        d
    }

    /// Sleeps the next wait and returns how long it was.
    pub async fn wait(&mut self) -> Duration {
        let d = self.step();
        tokio::time::sleep(d).await;
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_five_seconds() {
        let mut b = Backoff::default();
        let seen: Vec<u128> = (0..8).map(|_| b.step().as_millis()).collect();
        assert_eq!(seen, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    }
}
