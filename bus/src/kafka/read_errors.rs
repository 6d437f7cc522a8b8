//! How a consumer's loop treats the errors `recv` returns while a broker is away.
//!
//! librdkafka reports an outage as a stream of error events (one per failed reconnect, several
//! a second), queued on the consumer's queue in front of everything that follows, the
//! rebalance that assigns partitions again included. A loop that pauses after each error
//! drains that queue slower than it fills: after a 25 s outage, a pause of 200 ms per error
//! left the job-events consumer more than a minute behind its own assignment, and the process
//! not ready long after the broker was back. So an error is counted and the loop reads on at
//! once (`recv` itself waits for the next event: no busy loop); the first error of a spell is
//! a warning, the rest are debug lines, and the first message after a spell says how long it
//! lasted.

use std::fmt::Display;
use std::time::Instant;

use crate::signals::SIGNALS;

/// The current spell of read errors of one consumer (`what` names it in the log).
#[derive(Debug)]
pub struct ReadErrors {
    what: &'static str,
    spell: Option<(Instant, u64)>,
}

impl ReadErrors {
    pub fn new(what: &'static str) -> Self {
        Self { what, spell: None }
    }

    /// `recv` returned an error: count it, log it, and read on.
    pub fn error(&mut self, e: &dyn Display) {
        SIGNALS.kafka_error();
        match &mut self.spell {
            None => {
                tracing::warn!("reading {}: {e}; reading on until the broker answers", self.what);
                self.spell = Some((Instant::now(), 1));
            }
            Some((_, n)) => {
                *n = n.saturating_add(1);
                tracing::debug!("reading {}: {e}", self.what);
            }
        }
    }

    /// `recv` returned a message: a spell of errors, if any, is over.
    pub fn message(&mut self) {
        if let Some((since, n)) = self.spell.take() {
            tracing::info!(
                errors = n,
                spell_s = since.elapsed().as_secs_f64(),
                "reading {} again after a spell of read errors",
                self.what
            );
        }
    }

    /// Errors in the current spell (0 when none).
    #[cfg(test)]
    fn in_spell(&self) -> u64 {
        self.spell.map_or(0, |(_, n)| n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spell_counts_its_errors_and_a_message_ends_it() {
        let before = SIGNALS.kafka_errors();
        let mut r = ReadErrors::new("job events");
        assert_eq!(r.in_spell(), 0);
        r.error(&"all brokers down");
        r.error(&"all brokers down");
        r.error(&"connection refused");
        assert_eq!(r.in_spell(), 3);
        assert!(SIGNALS.kafka_errors() >= before + 3, "every error is counted in the signals");
        r.message();
        assert_eq!(r.in_spell(), 0);
        r.error(&"again");
        assert_eq!(r.in_spell(), 1, "a new spell starts at one");
    }
}
