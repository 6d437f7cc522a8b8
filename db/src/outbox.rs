//! The outbox: output events written in the same transaction as the state change that causes
//! them, sent later by the publisher and then marked sent.

use gpusanity_common::wire::output::OutputEvent;

use crate::{now_ms, Db, Result, Tx};

#[derive(Debug, Clone, sqlx::FromRow)]
pub struct OutboxRow {
    pub id: i64,
    pub event_id: String,
    pub topic: String,
    #[sqlx(rename = "msg_key")]
    pub key: String,
    pub payload: String,
}

/// A topic with unsent rows, and the creation time of its oldest unsent row.
#[derive(sqlx::FromRow)]
struct UnsentTopic {
    topic: String,
    oldest: i64,
}

/// The outbox backlog as [`Db::outbox_backlog`] reads it.
#[derive(sqlx::FromRow)]
struct Backlog {
    unsent: i64,
    oldest: Option<i64>,
    failed: i64,
}

/// Queues `event` for `topic`, keyed by its job id (one partition keeps a job's events in order).
pub async fn enqueue(tx: &mut Tx, topic: &str, event: &OutputEvent) -> Result<()> {
    enqueue_raw(tx, topic, &event.job_id, &event.event_id, &serde_json::to_string(event)?).await
}

/// Queues any message; a second message with the same event id is dropped.
pub async fn enqueue_raw(tx: &mut Tx, topic: &str, key: &str, event_id: &str, payload: &str) -> Result<()> {
    sqlx::query("INSERT INTO outbox (event_id, topic, msg_key, payload, created_at) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (event_id) DO NOTHING")
        .bind(event_id)
        .bind(topic)
        .bind(key)
        .bind(payload)
        .bind(now_ms())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

impl Db {
    /// The oldest unsent rows, in the order they were written.
    pub async fn unsent(&self, limit: i64) -> Result<Vec<OutboxRow>> {
        Ok(sqlx::query_as(
            "SELECT id, event_id, topic, msg_key, payload FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL ORDER BY id LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    pub async fn mark_sent(&self, ids: &[i64]) -> Result<()> {
        let now = now_ms();
        for chunk in ids.chunks(1000) {
            let list: Vec<String> = (0..chunk.len()).map(|i| format!("${}", i + 2)).collect();
            let sql = format!("UPDATE outbox SET sent_at = $1 WHERE id IN ({})", list.join(", "));
            let mut q = sqlx::query(&sql).bind(now);
            for id in chunk {
                q = q.bind(id);
            }
            q.execute(&self.pool).await?;
        }
        Ok(())
    }

    /// Marks sent the unsent rows whose event ids are already on the topic (found after a
    /// crash); the number marked.
    pub async fn mark_sent_by_event_ids(&self, event_ids: &[String]) -> Result<u64> {
        let now = now_ms();
        let mut n = 0u64;
        for chunk in event_ids.chunks(500) {
            let list: Vec<String> = (0..chunk.len()).map(|i| format!("${}", i + 2)).collect();
            let sql =
                format!("UPDATE outbox SET sent_at = $1 WHERE sent_at IS NULL AND event_id IN ({})", list.join(", "));
            let mut q = sqlx::query(&sql).bind(now);
            for id in chunk {
                q = q.bind(id);
            }
            n = n.saturating_add(q.execute(&self.pool).await?.rows_affected());
        }
        Ok(n)
    }

    /// The topics that have unsent rows, with the creation time of the oldest unsent row of
    /// each (no message of that row can be older on the topic).
    pub async fn unsent_topics(&self) -> Result<Vec<(String, i64)>> {
        let rows: Vec<UnsentTopic> = sqlx::query_as(
            "SELECT topic, MIN(created_at) AS oldest FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL GROUP BY topic",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|t| (t.topic, t.oldest)).collect())
    }

    /// Counts a refused attempt to send row `id`; after `max_attempts` the row is marked
    /// failed with `error` and is not sent again. True when it was marked failed now.
    pub async fn outbox_refused(&self, id: i64, error: &str, max_attempts: i64) -> Result<bool> {
        let failed: Option<Option<i64>> = sqlx::query_scalar(
            "UPDATE outbox SET attempts = attempts + 1, error = $2, \
             failed_at = CASE WHEN attempts + 1 >= $3 THEN $4 ELSE NULL END \
             WHERE id = $1 AND sent_at IS NULL AND failed_at IS NULL RETURNING failed_at",
        )
        .bind(id)
        .bind(error)
        .bind(max_attempts)
        .bind(now_ms())
        .fetch_optional(&self.pool)
        .await?;
        Ok(failed.flatten().is_some())
    }

    /// The outbox backlog: (unsent rows, creation time of the oldest, rows failed for good).
    pub async fn outbox_backlog(&self) -> Result<(i64, Option<i64>, i64)> {
        let b: Backlog = sqlx::query_as(
            "SELECT COUNT(*) AS unsent, MIN(created_at) AS oldest, \
             (SELECT COUNT(*) FROM outbox WHERE failed_at IS NOT NULL) AS failed \
             FROM outbox WHERE sent_at IS NULL AND failed_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok((b.unsent, b.oldest, b.failed))
    }
}
