//! The job-event consumer of the service: validation, dead letters, idempotency by event id,
//! the scope rule and the timing policy, runs stored before offsets are committed. Its Kafka
//! clients, backoff and error signals are `gpusanity_bus`'s, shared with the rest of the
//! service; the outbox publisher is `gpusanity_service::outbox`.

mod apply;
mod batch;
pub mod consume;
pub mod dead_letter;
pub mod policy;
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
