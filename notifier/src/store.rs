//! The notifier's tables (migrations/*/0002_notify.sql): rules, deliveries and attempts.

use gpusanity_db::{now_ms, Db, DbError, Tx};
use serde::Serialize;
use sqlx::any::AnyRow;
use sqlx::Row;

use crate::rules::{Rule, RuleInput};

type Result<T> = std::result::Result<T, DbError>;

const RULE_COLUMNS: &str = "rule_id, workspace_id, name, enabled, events, channels, created_at, updated_at";

fn rule(r: &AnyRow) -> Result<Rule> {
    Ok(Rule {
        rule_id: r.try_get(0)?,
        workspace_id: r.try_get(1)?,
        name: r.try_get(2)?,
        enabled: r.try_get::<i64, _>(3)? != 0,
        events: serde_json::from_str(&r.try_get::<String, _>(4)?)?,
        channels: serde_json::from_str(&r.try_get::<String, _>(5)?)?,
        created_at_ms: r.try_get(6)?,
        updated_at_ms: r.try_get(7)?,
    })
}

pub async fn create_rule(db: &Db, workspace: &str, input: &RuleInput) -> Result<Rule> {
    let now = now_ms();
    let r = Rule {
        rule_id: uuid::Uuid::new_v4().to_string(),
        workspace_id: workspace.into(),
        name: input.name.clone(),
        enabled: input.enabled,
        events: input.events.clone(),
        channels: input.channels.clone(),
        created_at_ms: now,
        updated_at_ms: now,
    };
    sqlx::query(&format!("INSERT INTO notification_rules ({RULE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"))
        .bind(&r.rule_id)
        .bind(&r.workspace_id)
        .bind(&r.name)
        .bind(i64::from(r.enabled))
        .bind(serde_json::to_string(&r.events)?)
        .bind(serde_json::to_string(&r.channels)?)
        .bind(now)
        .bind(now)
        .execute(&db.pool)
        .await?;
    Ok(r)
}

pub async fn rules(db: &Db, workspace: &str) -> Result<Vec<Rule>> {
    let rows = sqlx::query(&format!(
        "SELECT {RULE_COLUMNS} FROM notification_rules WHERE workspace_id = $1 ORDER BY created_at, rule_id"
    ))
    .bind(workspace)
    .fetch_all(&db.pool)
    .await?;
    rows.iter().map(rule).collect()
}

pub async fn get_rule(db: &Db, workspace: &str, id: &str) -> Result<Option<Rule>> {
    let row =
        sqlx::query(&format!("SELECT {RULE_COLUMNS} FROM notification_rules WHERE workspace_id = $1 AND rule_id = $2"))
            .bind(workspace)
            .bind(id)
            .fetch_optional(&db.pool)
            .await?;
    row.as_ref().map(rule).transpose()
}

/// Replaces a rule; None when the workspace has no such rule.
pub async fn update_rule(db: &Db, workspace: &str, id: &str, input: &RuleInput) -> Result<Option<Rule>> {
    let n = sqlx::query(
        "UPDATE notification_rules SET name = $1, enabled = $2, events = $3, channels = $4, updated_at = $5 WHERE workspace_id = $6 AND rule_id = $7",
    )
    .bind(&input.name)
    .bind(i64::from(input.enabled))
    .bind(serde_json::to_string(&input.events)?)
    .bind(serde_json::to_string(&input.channels)?)
    .bind(now_ms())
    .bind(workspace)
    .bind(id)
    .execute(&db.pool)
    .await?
    .rows_affected();
    if n == 0 {
        return Ok(None);
    }
    get_rule(db, workspace, id).await
}

pub async fn delete_rule(db: &Db, workspace: &str, id: &str) -> Result<bool> {
    let n = sqlx::query("DELETE FROM notification_rules WHERE workspace_id = $1 AND rule_id = $2")
        .bind(workspace)
        .bind(id)
        .execute(&db.pool)
        .await?;
    Ok(n.rows_affected() > 0)
}

/// Enabled rules of a workspace, inside the planning transaction.
pub async fn enabled_rules(tx: &mut Tx, workspace: &str) -> Result<Vec<Rule>> {
    let rows = sqlx::query(&format!("SELECT {RULE_COLUMNS} FROM notification_rules WHERE workspace_id = $1 AND enabled = 1 ORDER BY created_at, rule_id"))
        .bind(workspace)
        .fetch_all(&mut **tx)
        .await?;
    rows.iter().map(rule).collect()
}

/// An outbox row the notifier has not planned yet.
pub struct Unplanned {
    pub id: i64,
    pub topic: String,
    pub payload: String,
}

/// Whether any outbox row waits to be planned (a cheap read outside a write transaction).
pub async fn any_unplanned(db: &Db) -> Result<bool> {
    Ok(sqlx::query("SELECT id FROM outbox WHERE notify_planned_at IS NULL LIMIT 1")
        .fetch_optional(&db.pool)
        .await?
        .is_some())
}

pub async fn unplanned(tx: &mut Tx, limit: i64) -> Result<Vec<Unplanned>> {
    let rows =
        sqlx::query("SELECT id, topic, payload FROM outbox WHERE notify_planned_at IS NULL ORDER BY id LIMIT $1")
            .bind(limit)
            .fetch_all(&mut **tx)
            .await?;
    rows.iter().map(|r| Ok(Unplanned { id: r.try_get(0)?, topic: r.try_get(1)?, payload: r.try_get(2)? })).collect()
}

pub async fn mark_planned(tx: &mut Tx, id: i64) -> Result<()> {
    sqlx::query("UPDATE outbox SET notify_planned_at = $1 WHERE id = $2")
        .bind(now_ms())
        .bind(id)
        .execute(&mut **tx)
        .await?;
    Ok(())
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

/// A planned delivery as the sender reads it.
#[derive(Debug, Clone)]
pub struct Due {
    pub id: i64,
    pub key: String,
    pub channel: String,
    pub target: String,
    pub event: String,
    pub attempts: i64,
}

/// Pending deliveries whose time has come, oldest first.
pub async fn due(db: &Db, limit: i64) -> Result<Vec<Due>> {
    let rows = sqlx::query(
        "SELECT id, idempotency_key, channel, target, event, attempts FROM deliveries WHERE status = 'pending' AND next_at <= $1 AND claim_until < $1 ORDER BY next_at, id LIMIT $2",
    )
    .bind(now_ms())
    .bind(limit)
    .fetch_all(&db.pool)
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Due {
                id: r.try_get(0)?,
                key: r.try_get(1)?,
                channel: r.try_get(2)?,
                target: r.try_get(3)?,
                event: r.try_get(4)?,
                attempts: r.try_get(5)?,
            })
        })
        .collect()
}

/// Claims `d` for one attempt by `holder` for `for_ms`: true for the one replica that got it
/// (the row is still pending with the attempts `d` read, and no live claim is on it).
pub async fn claim(db: &Db, d: &Due, holder: &str, for_ms: i64) -> Result<bool> {
    let now = now_ms();
    let done = sqlx::query(
        "UPDATE deliveries SET claimed_by = $1, claim_until = $2 WHERE id = $3 AND status = 'pending' AND attempts = $4 AND claim_until < $5",
    )
    .bind(holder)
    .bind(now.saturating_add(for_ms))
    .bind(d.id)
    .bind(d.attempts)
    .bind(now)
    .execute(&db.pool)
    .await?;
    Ok(done.rows_affected() == 1)
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

/// Logs an attempt and updates its delivery, in one transaction.
pub async fn record(db: &Db, d: &Due, o: &Outcome) -> Result<()> {
    let now = now_ms();
    let attempt = d.attempts + 1;
    let mut tx = db.begin().await?;
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

#[derive(Debug, Serialize)]
pub struct Attempt {
    pub attempt: i64,
    pub at_ms: i64,
    pub ok: bool,
    pub status_code: Option<i64>,
    pub error: Option<String>,
    pub took_ms: i64,
}

#[derive(Debug, Serialize)]
pub struct DeliveryView {
    pub id: i64,
    pub idempotency_key: String,
    pub rule_id: String,
    pub event_id: String,
    pub event_type: String,
    pub channel: String,
    /// The webhook URL or the email address.
    pub target: String,
    pub status: String,
    pub attempts: i64,
    pub last_error: Option<String>,
    pub created_at_ms: i64,
    pub next_at_ms: i64,
    pub sent_at_ms: Option<i64>,
    pub attempt_log: Vec<Attempt>,
}

/// The newest deliveries of a workspace (optionally of one status) with their attempts.
pub async fn deliveries(db: &Db, workspace: &str, status: Option<&str>, limit: i64) -> Result<Vec<DeliveryView>> {
    let rows = sqlx::query(
        "SELECT id, idempotency_key, rule_id, event_id, event_type, channel, target, status, attempts, last_error, created_at, next_at, sent_at \
         FROM deliveries WHERE workspace_id = $1 AND ($2 = '' OR status = $2) ORDER BY id DESC LIMIT $3",
    )
    .bind(workspace)
    .bind(status.unwrap_or(""))
    .bind(limit)
    .fetch_all(&db.pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in &rows {
        let channel: String = r.try_get(5)?;
        let target: String = r.try_get(6)?;
        out.push(DeliveryView {
            id: r.try_get(0)?,
            idempotency_key: r.try_get(1)?,
            rule_id: r.try_get(2)?,
            event_id: r.try_get(3)?,
            event_type: r.try_get(4)?,
            target: crate::plan::Target::from_json(&channel, &target)
                .map(|t| t.address().to_string())
                .unwrap_or_default(),
            channel,
            status: r.try_get(7)?,
            attempts: r.try_get(8)?,
            last_error: r.try_get(9)?,
            created_at_ms: r.try_get(10)?,
            next_at_ms: r.try_get(11)?,
            sent_at_ms: r.try_get(12)?,
            attempt_log: Vec::new(),
        });
    }
    // The attempts of all of them in one query: the deliveries' ids are between the oldest and
    // the newest shown, so one range scan of the index finds them.
    if let (Some(lo), Some(hi)) = (out.iter().map(|d| d.id).min(), out.iter().map(|d| d.id).max()) {
        let rows = sqlx::query(
            "SELECT delivery_id, attempt, at, ok, status_code, error, took_ms FROM delivery_attempts WHERE delivery_id BETWEEN $1 AND $2 ORDER BY delivery_id, attempt",
        )
        .bind(lo)
        .bind(hi)
        .fetch_all(&db.pool)
        .await?;
        let mut by_id: std::collections::HashMap<i64, &mut DeliveryView> = out.iter_mut().map(|d| (d.id, d)).collect();
        for r in &rows {
            let Some(d) = by_id.get_mut(&r.try_get::<i64, _>(0)?) else { continue };
            d.attempt_log.push(Attempt {
                attempt: r.try_get(1)?,
                at_ms: r.try_get(2)?,
                ok: r.try_get::<i64, _>(3)? != 0,
                status_code: r.try_get(4)?,
                error: r.try_get(5)?,
                took_ms: r.try_get(6)?,
            });
        }
    }
    Ok(out)
}
