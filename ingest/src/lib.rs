//! The Kafka side of the service: the job-event consumer (validation, dead letters, idempotency
//! by event id, the scope rule and the timing policy, runs stored before offsets are committed)
//! and the Kafka helpers (topics, producers, consumers) the rest of the service uses. The outbox
//! publisher is `gpusanity_service::outbox`.

mod apply;
mod batch;
pub mod consume;
pub mod dead_letter;
pub mod kafka;
pub mod policy;
pub mod retry;
pub mod signals;
pub mod text;
pub mod validate;

/// What the consumer tells the coordinator once a transaction is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A new run in `Checking`: dispatch it.
    Start(String),
    /// A run ended outside the coordinator (its job stopped or was reallocated): stop its agents.
    Cancelled { run_id: String, reason: String },
}
