//! The gpusanity control plane (`gpusanity serve` and `gpusanity agent`): the coordinator that
//! dispatches runs to the node agents and ends them, the agent that runs a node's launcher, the
//! outbox publisher that sends output events, and the HTTP API with the report browser.
//!
//! The data plane (`gpusanity-executor`) knows nothing of this crate: the agent starts the
//! launcher as a child process. Job events come in through `gpusanity-ingest`, the state is
//! kept by `gpusanity-db`, notifications are planned and sent by `gpusanity-notifier`, and
//! reports are rendered by `gpusanity-reports`.

pub mod agent;
pub mod auth;
pub mod config;
pub mod coordinator;
pub mod fleet;
pub mod http;
pub mod isolation;
pub mod ops;
pub mod outbox;
pub mod replica;
pub mod report_chunks;
pub mod serve;
pub mod shutdown;
pub mod watch;

pub use config::ServiceConfig;

/// Bad input from the person starting the service or the agent (exit 2): a malformed
/// configuration, an unreachable broker, an address that cannot be bound.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);
