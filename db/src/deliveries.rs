//! Notification deliveries and their attempts (migrations/*/0002_notify.sql), and the outbox
//! rows the notifier plans them from: the planner reads output events not planned yet and
//! inserts one delivery per rule and target; the sender claims a due delivery, sends it and
//! records the attempt.

use serde::Serialize;

use crate::column::Flag;
use crate::{now_ms, Db, Result, Tx};

/// An outbox row the notifier has not planned yet.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Unplanned {
    pub id: i64,
    pub topic: String,
    pub payload: String,
}

/// A delivery to plan: one event to one webhook or one email recipient.
pub struct NewDelivery<'a> {
    pub key: &'a str,
    pub workspace: &'a str,
    pub rule_id: &'a str,
    pub event_id: &'a str,
    pub event_type: &'a str,
    pub channel: &'a str,
    pub target: String,
    pub event: &'a str,
}

/// A planned delivery as the sender reads it.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Due {
    pub id: i64,
    #[sqlx(rename = "idempotency_key")]
    pub key: String,
    pub channel: String,
    pub target: String,
    pub event: String,
    pub attempts: i64,
}

/// What one attempt came to.
pub struct Outcome {
    pub ok: bool,
    pub status_code: Option<i64>,
    pub error: Option<String>,
    pub took_ms: i64,
    /// `sent`, `pending` (retry at `next_at`) or `failed`.
    pub status: &'static str,
    pub next_at: i64,
}

/// One logged attempt of a delivery.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct Attempt {
    #[serde(skip)]
    pub delivery_id: i64,
    pub attempt: i64,
    #[sqlx(rename = "at")]
    pub at_ms: i64,
    #[sqlx(try_from = "Flag")]
    pub ok: bool,
    pub status_code: Option<i64>,
    pub error: Option<String>,
    pub took_ms: i64,
}

/// A delivery as the API lists it, with its attempts.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow)]
pub struct DeliveryView {
    pub id: i64,
    pub idempotency_key: String,
    pub rule_id: String,
    pub event_id: String,
    pub event_type: String,
    pub channel: String,
    /// The webhook URL or the email address (stored: the target as JSON, which the notifier
    /// turns into its address before it shows it).
    pub target: String,
    pub status: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    #[sqlx(rename = "created_at")]
    pub created_at_ms: i64,
    #[sqlx(rename = "next_at")]
    pub next_at_ms: i64,
    #[sqlx(rename = "sent_at")]
    pub sent_at_ms: Option<i64>,
    #[sqlx(skip)]
    pub attempt_log: Vec<Attempt>,
}

pub async fn unplanned(tx: &mut Tx, limit: i64) -> Result<Vec<Unplanned>> {
    Ok(sqlx::query_as("SELECT id, topic, payload FROM outbox WHERE notify_planned_at IS NULL ORDER BY id LIMIT $1")
        .bind(limit)
        .fetch_all(&mut **tx)
        .await?)
}

pub async fn mark_planned(tx: &mut Tx, id: i64) -> Result<()> {
    sqlx::query("UPDATE outbox SET notify_planned_at = $1 WHERE id = $2")
        .bind(now_ms())
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Inserts a delivery; a second one with the same key is dropped.
pub async fn insert_delivery(tx: &mut Tx, d: &NewDelivery<'_>) -> Result<()> {
    let now = now_ms();
    sqlx::query(
        "INSERT INTO deliveries (idempotency_key, workspace_id, rule_id, event_id, event_type, channel, target, event, status, attempts, next_at, created_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, 'pending', 0, $9, $10) ON CONFLICT (idempotency_key) DO NOTHING",
    )
    .bind(d.key)
    .bind(d.workspace)
    .bind(d.rule_id)
    .bind(d.event_id)
    .bind(d.event_type)
    .bind(d.channel)
    .bind(&d.target)
    .bind(d.event)
    .bind(now)
    .bind(now)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Db {
    /// Whether any outbox row waits to be planned (a cheap read outside a write transaction).
    pub async fn any_unplanned(&self) -> Result<bool> {
        let id: Option<i64> = sqlx::query_scalar("SELECT id FROM outbox WHERE notify_planned_at IS NULL LIMIT 1")
            .fetch_optional(&self.pool)
            .await?;
        Ok(id.is_some())
    }

    /// Pending deliveries whose time has come, oldest first.
    pub async fn due_deliveries(&self, limit: i64) -> Result<Vec<Due>> {
        Ok(sqlx::query_as(
            "SELECT id, idempotency_key, channel, target, event, attempts FROM deliveries WHERE status = 'pending' AND next_at <= $1 AND claim_until < $1 ORDER BY next_at, id LIMIT $2",
        )
        .bind(now_ms())
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Claims `d` for one attempt by `holder` for `for_ms`: true for the one replica that got it
    /// (the row is still pending with the attempts `d` read, and no live claim is on it).
    pub async fn claim_delivery(&self, d: &Due, holder: &str, for_ms: i64) -> Result<bool> {
        let now = now_ms();
        let done = sqlx::query(
            "UPDATE deliveries SET claimed_by = $1, claim_until = $2 WHERE id = $3 AND status = 'pending' AND attempts = $4 AND claim_until < $5",
        )
        .bind(holder)
        .bind(now.saturating_add(for_ms))
        .bind(d.id)
        .bind(d.attempts)
        .bind(now)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Logs an attempt and updates its delivery, in one transaction.
    pub async fn record_attempt(&self, d: &Due, o: &Outcome) -> Result<()> {
        let now = now_ms();
        let attempt = d.attempts.saturating_add(1);
        let mut tx = self.begin().await?;
        sqlx::query("INSERT INTO delivery_attempts (delivery_id, attempt, at, ok, status_code, error, took_ms) VALUES ($1, $2, $3, $4, $5, $6, $7)")
            .bind(d.id)
            .bind(attempt)
            .bind(now)
            .bind(i64::from(o.ok))
            .bind(o.status_code)
            .bind(o.error.as_deref())
            .bind(o.took_ms)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "UPDATE deliveries SET status = $1, attempts = $2, next_at = $3, last_error = $4, sent_at = $5, claim_until = 0 WHERE id = $6",
        )
        .bind(o.status)
        .bind(attempt)
        .bind(o.next_at)
        .bind(o.error.as_deref())
        .bind(o.ok.then_some(now))
        .bind(d.id)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The newest deliveries of a workspace (optionally of one status) with their attempts.
    pub async fn deliveries(&self, workspace: &str, status: Option<&str>, limit: i64) -> Result<Vec<DeliveryView>> {
        let mut out: Vec<DeliveryView> = sqlx::query_as(
            "SELECT id, idempotency_key, rule_id, event_id, event_type, channel, target, status, attempts, last_error, created_at, next_at, sent_at \
             FROM deliveries WHERE workspace_id = $1 AND ($2 = '' OR status = $2) ORDER BY id DESC LIMIT $3",
        )
        .bind(workspace)
        .bind(status.unwrap_or(""))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        // The attempts of all of them in one query: the deliveries' ids are between the oldest and
        // the newest shown, so one range scan of the index finds them.
        if let (Some(lo), Some(hi)) = (out.iter().map(|d| d.id).min(), out.iter().map(|d| d.id).max()) {
            let attempts: Vec<Attempt> = sqlx::query_as(
                "SELECT delivery_id, attempt, at, ok, status_code, error, took_ms FROM delivery_attempts WHERE delivery_id BETWEEN $1 AND $2 ORDER BY delivery_id, attempt",
            )
            .bind(lo)
            .bind(hi)
            .fetch_all(&self.pool)
            .await?;
            let mut by_id: std::collections::HashMap<i64, &mut DeliveryView> =
                out.iter_mut().map(|d| (d.id, d)).collect();
            for a in attempts {
                if let Some(d) = by_id.get_mut(&a.delivery_id) {
                    d.attempt_log.push(a);
                }
            }
        }
        Ok(out)
    }
}
