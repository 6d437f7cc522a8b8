//! Counts for the service's metrics, read at each scrape: runs by state, deliveries by
//! channel and status. (The outbox backlog is [`Db::outbox_backlog`].)

use sqlx::Row;

use crate::{Db, Result};

impl Db {
    /// (state, count) of the runs; a run held by KeepJobHang counts as state `held`.
    pub async fn runs_by_state(&self) -> Result<Vec<(String, i64)>> {
        let rows = sqlx::query(
            "SELECT CASE WHEN held <> 0 AND state = 'Checking' THEN 'held' ELSE state END AS s, COUNT(*) \
             FROM runs GROUP BY s",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?))).collect()
    }

    /// (channel, status, count) of the notification deliveries.
    pub async fn deliveries_by_status(&self) -> Result<Vec<(String, String, i64)>> {
        let rows = sqlx::query("SELECT channel, status, COUNT(*) FROM deliveries GROUP BY channel, status")
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?))).collect()
    }
}
