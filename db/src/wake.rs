//! The publisher's wake across replicas: on PostgreSQL every commit that queues outbox rows
//! sends a notification (migrations/postgres/0006_outbox_wake.sql), which every replica listens
//! for. SQLite has one replica, whose own commits wake its publisher.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::Notify;

use crate::{Db, DbBackend};

/// The channel of the commits that queued outbox rows.
pub const OUTBOX_CHANNEL: &str = "gpusanity_outbox";

/// The pause before listening again after the connection failed.
const RETRY: Duration = Duration::from_secs(1);

impl Db {
    /// Wakes `wake` at every commit, by any replica, that queued outbox rows, until the process
    /// ends; returns at once on SQLite. The listening connection is opened again after a
    /// pause when it fails (the database away): the publisher's own looks at the table find
    /// what was committed meanwhile, and `wake` is woken once the listening is back.
    pub async fn wake_on_outbox(&self, wake: Arc<Notify>) {
        if self.backend != DbBackend::Postgres {
            return;
        }
        loop {
            let mut listener = match PgListener::connect(&self.url).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::debug!("listening for queued outbox rows: {e}");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            if let Err(e) = listener.listen(OUTBOX_CHANNEL).await {
                tracing::debug!("listening for queued outbox rows: {e}");
                tokio::time::sleep(RETRY).await;
                continue;
            }
            // Rows may have been committed while nothing listened.
            wake.notify_one();
            // recv() listens again by itself after a lost connection; an error is a failed
            // reconnection.
            while listener.recv().await.is_ok() {
                wake.notify_one();
            }
            tokio::time::sleep(RETRY).await;
        }
    }
}
