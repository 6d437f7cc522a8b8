//! Workspace notification rules (migrations/*/0002_notify.sql). The rule's events and channels
//! are the notifier's types: stored as JSON text, which this crate keeps as it is.

use crate::column::Flag;
use crate::{Db, Result, Tx};

/// A notification rule as stored.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct RuleRow {
    pub rule_id: String,
    pub workspace_id: String,
    pub name: String,
    #[sqlx(try_from = "Flag")]
    pub enabled: bool,
    /// The event kinds, as JSON.
    pub events: String,
    /// The channels, as JSON.
    pub channels: String,
    pub created_at: i64,
    pub updated_at: i64,
}

/// What a replacement of a rule changes.
#[derive(Debug, Clone, Copy)]
pub struct RuleChange<'a> {
    pub name: &'a str,
    pub enabled: bool,
    /// The event kinds, as JSON.
    pub events: &'a str,
    /// The channels, as JSON.
    pub channels: &'a str,
    pub updated_at: i64,
}

const RULE_COLUMNS: &str = "rule_id, workspace_id, name, enabled, events, channels, created_at, updated_at";

/// Enabled rules of a workspace, oldest first, inside the planning transaction.
pub async fn enabled_rules(tx: &mut Tx, workspace: &str) -> Result<Vec<RuleRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {RULE_COLUMNS} FROM notification_rules WHERE workspace_id = $1 AND enabled = 1 ORDER BY created_at, rule_id"
    ))
    .bind(workspace)
    .fetch_all(&mut **tx)
    .await?)
}

impl Db {
    pub async fn insert_rule(&self, r: &RuleRow) -> Result<()> {
        sqlx::query(&format!(
            "INSERT INTO notification_rules ({RULE_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)"
        ))
        .bind(&r.rule_id)
        .bind(&r.workspace_id)
        .bind(&r.name)
        .bind(i64::from(r.enabled))
        .bind(&r.events)
        .bind(&r.channels)
        .bind(r.created_at)
        .bind(r.updated_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The rules of a workspace, oldest first.
    pub async fn rules(&self, workspace: &str) -> Result<Vec<RuleRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {RULE_COLUMNS} FROM notification_rules WHERE workspace_id = $1 ORDER BY created_at, rule_id"
        ))
        .bind(workspace)
        .fetch_all(&self.pool)
        .await?)
    }

    pub async fn rule(&self, workspace: &str, id: &str) -> Result<Option<RuleRow>> {
        Ok(sqlx::query_as(&format!(
            "SELECT {RULE_COLUMNS} FROM notification_rules WHERE workspace_id = $1 AND rule_id = $2"
        ))
        .bind(workspace)
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Replaces a rule's fields; false when the workspace has no such rule.
    pub async fn update_rule(&self, workspace: &str, id: &str, c: &RuleChange<'_>) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE notification_rules SET name = $1, enabled = $2, events = $3, channels = $4, updated_at = $5 WHERE workspace_id = $6 AND rule_id = $7",
        )
        .bind(c.name)
        .bind(i64::from(c.enabled))
        .bind(c.events)
        .bind(c.channels)
        .bind(c.updated_at)
        .bind(workspace)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Deletes a rule; false when the workspace has no such rule.
    pub async fn delete_rule(&self, workspace: &str, id: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM notification_rules WHERE workspace_id = $1 AND rule_id = $2")
            .bind(workspace)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }
}
