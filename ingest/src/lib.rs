//! The Kafka side of the service: the job-event consumer (validation, dead letters, idempotency
//! by event id, the timing policy, runs stored before offsets are committed) and the outbox
//! publisher that sends output events and marks them sent.

pub mod consume;
pub mod kafka;
pub mod policy;
pub mod validate;

/// What the consumer tells the coordinator once a transaction is committed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A new run in `Checking`: dispatch it.
    Start(String),
    /// A run ended outside the coordinator (its job stopped or was reallocated): stop its agents.
    Cancelled { run_id: String, reason: String },
}
