//! The publisher's lease: one replica at a time sends the outbox (docs/service.md, "Several
//! replicas", says why a lease and not row claims: a job's events must reach the topic in the
//! order they were written, which rows claimed by several senders would not keep).
//!
//! A task of its own renews the lease every fifth of its length, so a round waiting on a slow
//! broker does not lose it. The publisher starts a round only while more than half the lease
//! is left, and its producer gives up a message after a third of the lease: every send of a
//! replica has ended, delivered or failed, before another can hold the lease. The new holder
//! then reads the topics back (recovery) before it sends, so nothing is sent twice.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gpusanity_bus::signals::SIGNALS;
use gpusanity_db::{now_ms, Db};

use crate::ops::metrics::METRICS;

/// The name of the publisher's lease.
pub const OUTBOX_LEASE: &str = "outbox-publisher";

/// The lease as this replica knows it: until when (Unix ms, by this host's clock) it holds it,
/// 0 when it does not.
#[derive(Clone)]
pub struct Keeper {
    pub db: Db,
    pub holder: String,
    pub lease: Duration,
    until: Arc<AtomicI64>,
}

impl Keeper {
    pub fn new(db: Db, holder: String, lease: Duration) -> Keeper {
        Keeper { db, holder, lease, until: Arc::new(AtomicI64::new(0)) }
    }

    fn lease_ms(&self) -> i64 {
        i64::try_from(self.lease.as_millis()).unwrap_or(i64::MAX)
    }

    /// How long a producer of this lease may keep a message in flight.
    pub fn message_timeout(&self) -> Duration {
        self.lease / 3
    }

    /// Whether a round may start now: the lease is held with more than half of it left.
    pub fn may_send(&self) -> bool {
        self.until.load(Ordering::Acquire).saturating_sub(now_ms()) > self.lease_ms() / 2
    }

    /// Whether this replica holds the lease (with any time left).
    pub fn holds(&self) -> bool {
        self.until.load(Ordering::Acquire) > now_ms()
    }

    /// One renewal (or attempt to take the lease); false when another replica holds it. A
    /// database error leaves the lease to run out here as it does in the database.
    pub async fn renew(&self) -> bool {
        let start = now_ms();
        let until = start.saturating_add(self.lease_ms());
        match self.db.hold_lease(OUTBOX_LEASE, &self.holder, start, until).await {
            Ok(Some(token)) => {
                if self.until.swap(until, Ordering::AcqRel) == 0 {
                    tracing::info!(token, "this replica now sends the outbox");
                }
                METRICS.outbox_leader.set(1);
                true
            }
            Ok(None) => {
                if self.until.swap(0, Ordering::AcqRel) != 0 {
                    tracing::warn!("the outbox publisher's lease went to another replica");
                }
                METRICS.outbox_leader.set(0);
                false
            }
            Err(e) => {
                SIGNALS.db_error();
                tracing::warn!("renewing the outbox publisher's lease: {e}");
                if self.until.load(Ordering::Acquire) <= now_ms() {
                    self.until.store(0, Ordering::Release);
                    METRICS.outbox_leader.set(0);
                }
                false
            }
        }
    }

    /// Renews until the process ends.
    pub async fn run(self) {
        loop {
            self.renew().await;
            tokio::time::sleep(self.lease / 5).await;
        }
    }

    /// Hands the lease over at once (a clean stop).
    pub async fn release(&self) {
        self.until.store(0, Ordering::Release);
        if let Err(e) = self.db.drop_lease(OUTBOX_LEASE, &self.holder).await {
            tracing::warn!("handing the outbox publisher's lease over: {e}");
        }
    }
}
