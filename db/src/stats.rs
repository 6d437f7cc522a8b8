//! Counts for the service's metrics, read at each scrape: runs by state, deliveries by
//! channel and status. (The outbox backlog is [`Db::outbox_backlog`].)

use crate::{Db, Result};

/// Runs in one state.
#[derive(sqlx::FromRow)]
struct StateCount {
    /// `s`: a name no column has, so that `GROUP BY s` groups by the expression.
    #[sqlx(rename = "s")]
    state: String,
    n: i64,
}

/// Deliveries of one channel in one status.
#[derive(sqlx::FromRow)]
struct DeliveryCount {
    channel: String,
    status: String,
    n: i64,
}

impl Db {
    /// (state, count) of the runs; a run held by KeepJobHang counts as state `held`.
    pub async fn runs_by_state(&self) -> Result<Vec<(String, i64)>> {
        let rows: Vec<StateCount> = sqlx::query_as(
            "SELECT CASE WHEN held <> 0 AND state = 'Checking' THEN 'held' ELSE state END AS s, COUNT(*) AS n \
             FROM runs GROUP BY s",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| (r.state, r.n)).collect())
    }

    /// (channel, status, count) of the notification deliveries.
    pub async fn deliveries_by_status(&self) -> Result<Vec<(String, String, i64)>> {
        let rows: Vec<DeliveryCount> =
            sqlx::query_as("SELECT channel, status, COUNT(*) AS n FROM deliveries GROUP BY channel, status")
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(|r| (r.channel, r.status, r.n)).collect())
    }
}
