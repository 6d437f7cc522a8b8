//! What the service's parts tell its health and metrics: counts of Kafka and database errors,
//! and whether the database answered the last time it was used. One set per process (a
//! process runs one service); `gpusanity_service::metrics` reads them at every scrape.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Signals {
    kafka_errors: AtomicU64,
    db_errors: AtomicU64,
    db_down: AtomicBool,
}

/// The process's signals.
pub static SIGNALS: Signals =
    Signals { kafka_errors: AtomicU64::new(0), db_errors: AtomicU64::new(0), db_down: AtomicBool::new(false) };

impl Signals {
    /// A Kafka client reported an error (a broker away, a refused request).
    pub fn kafka_error(&self) {
        self.kafka_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// A database operation failed.
    pub fn db_error(&self) {
        self.db_errors.fetch_add(1, Ordering::Relaxed);
        self.db_down.store(true, Ordering::Relaxed);
    }

    /// A database operation succeeded.
    pub fn db_ok(&self) {
        self.db_down.store(false, Ordering::Relaxed);
    }

    pub fn kafka_errors(&self) -> u64 {
        self.kafka_errors.load(Ordering::Relaxed)
    }

    pub fn db_errors(&self) -> u64 {
        self.db_errors.load(Ordering::Relaxed)
    }

    /// The last database operation failed.
    pub fn db_down(&self) -> bool {
        self.db_down.load(Ordering::Relaxed)
    }
}
