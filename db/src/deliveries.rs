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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{RuleChange, RuleRow};

    async fn db(dir: &tempfile::TempDir) -> Db {
        Db::connect(&format!("sqlite://{}", dir.path().join("d.db").display())).await.unwrap()
    }

    #[tokio::test]
    async fn a_delivery_is_planned_once_claimed_once_and_listed_with_its_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let db = db(&dir).await;
        let mut tx = db.begin().await.unwrap();
        crate::outbox::enqueue_raw(&mut tx, "out", "job-1", "ev-1", "{}").await.unwrap();
        tx.commit().await.unwrap();
        assert!(db.any_unplanned().await.unwrap());
        let mut tx = db.begin().await.unwrap();
        let rows = unplanned(&mut tx, 10).await.unwrap();
        assert_eq!(rows.iter().map(|r| (r.topic.as_str(), r.payload.as_str())).collect::<Vec<_>>(), [("out", "{}")]);
        let d = NewDelivery {
            key: "k1",
            workspace: "ws",
            rule_id: "r1",
            event_id: "ev-1",
            event_type: "CheckFailed",
            channel: "webhook",
            target: "{}".into(),
            event: "{}",
        };
        insert_delivery(&mut tx, &d).await.unwrap();
        insert_delivery(&mut tx, &d).await.unwrap();
        mark_planned(&mut tx, rows[0].id).await.unwrap();
        tx.commit().await.unwrap();
        assert!(!db.any_unplanned().await.unwrap());
        let due = db.due_deliveries(10).await.unwrap();
        assert_eq!(due.iter().map(|d| (d.key.as_str(), d.attempts)).collect::<Vec<_>>(), [("k1", 0)]);
        assert!(db.claim_delivery(&due[0], "a", 60_000).await.unwrap());
        assert!(!db.claim_delivery(&due[0], "b", 60_000).await.unwrap(), "claimed twice");
        let failed = Outcome {
            ok: false,
            status_code: Some(503),
            error: Some("busy".into()),
            took_ms: 7,
            status: "pending",
            next_at: 0,
        };
        db.record_attempt(&due[0], &failed).await.unwrap();
        let listed = db.deliveries("ws", Some("pending"), 10).await.unwrap();
        assert_eq!(listed.len(), 1);
        let (d, log) = (&listed[0], &listed[0].attempt_log);
        assert_eq!((d.idempotency_key.as_str(), d.attempts, d.last_error.as_deref()), ("k1", 1, Some("busy")));
        assert_eq!(log.iter().map(|a| (a.attempt, a.ok, a.status_code)).collect::<Vec<_>>(), [(1, false, Some(503))]);
        assert!(db.deliveries("ws", Some("sent"), 10).await.unwrap().is_empty());
        assert!(db.deliveries("other", None, 10).await.unwrap().is_empty());
        let mut counts = db.deliveries_by_status().await.unwrap();
        counts.sort();
        assert_eq!(counts, [("webhook".to_string(), "pending".to_string(), 1)]);
    }

    #[tokio::test]
    async fn rules_are_kept_per_workspace_and_only_enabled_ones_are_planned() {
        let dir = tempfile::tempdir().unwrap();
        let db = db(&dir).await;
        let rule = |id: &str, ws: &str, at: i64| RuleRow {
            rule_id: id.into(),
            workspace_id: ws.into(),
            name: format!("rule {id}"),
            enabled: true,
            events: r#"["CheckFailed"]"#.into(),
            channels: "[]".into(),
            created_at: at,
            updated_at: at,
        };
        db.insert_rule(&rule("r2", "ws", 2)).await.unwrap();
        db.insert_rule(&rule("r1", "ws", 1)).await.unwrap();
        db.insert_rule(&rule("r3", "other", 1)).await.unwrap();
        let ids = |rows: Vec<RuleRow>| rows.into_iter().map(|r| r.rule_id).collect::<Vec<_>>();
        assert_eq!(ids(db.rules("ws").await.unwrap()), ["r1", "r2"]);
        assert_eq!(db.rule("ws", "r2").await.unwrap(), Some(rule("r2", "ws", 2)));
        assert_eq!(db.rule("other", "r2").await.unwrap(), None);
        let off = RuleChange { name: "off", enabled: false, events: "[]", channels: "[]", updated_at: 9 };
        assert!(db.update_rule("ws", "r1", &off).await.unwrap());
        assert!(!db.update_rule("other", "r1", &off).await.unwrap());
        let r1 = db.rule("ws", "r1").await.unwrap().unwrap();
        assert_eq!((r1.name.as_str(), r1.enabled, r1.updated_at, r1.created_at), ("off", false, 9, 1));
        let mut tx = db.begin().await.unwrap();
        assert_eq!(ids(crate::rules::enabled_rules(&mut tx, "ws").await.unwrap()), ["r2"]);
        tx.commit().await.unwrap();
        assert!(db.delete_rule("ws", "r2").await.unwrap());
        assert!(!db.delete_rule("ws", "r2").await.unwrap());
        assert_eq!(ids(db.rules("ws").await.unwrap()), ["r1"]);
    }
}
