//! A bound on the time between a stop signal and the process's exit.
//!
//! After SIGTERM the service's parts are dropped in turn, and dropping a Kafka consumer leaves
//! its group synchronously: while a rebalance is under way that can block for the group's
//! session timeout, once per consumer. Nothing the service holds needs that wait to be safe
//! (runs, outbox rows and deliveries live in the database, and consumption restarts from the
//! committed offsets), so a stop that overruns its grace ends the process instead.

use std::time::Duration;

/// Starts a watchdog that ends the process (exit 0, a requested stop) `grace` after now.
pub fn exit_after(grace: Duration, what: &'static str) {
    std::thread::spawn(move || {
        std::thread::sleep(grace);
        tracing::warn!("{what}: stopping took longer than {grace:?}; exiting without waiting further");
        std::process::exit(0);
    });
}
