//! The notifier's rules and the deliveries as the API shows them, through the db crate's
//! queries (gpusanity_db::rules, gpusanity_db::deliveries): rules go in and out as the
//! notifier's types, their events and channels stored as JSON.

use gpusanity_db::rules::{RuleChange, RuleRow};
use gpusanity_db::{now_ms, Db, DbError, Tx};

pub use gpusanity_db::deliveries::{Attempt, DeliveryView};

use crate::rules::{Rule, RuleInput};

type Result<T> = std::result::Result<T, DbError>;

fn rule(r: RuleRow) -> Result<Rule> {
    Ok(Rule {
        rule_id: r.rule_id,
        workspace_id: r.workspace_id,
        name: r.name,
        enabled: r.enabled,
        events: serde_json::from_str(&r.events)?,
        channels: serde_json::from_str(&r.channels)?,
        created_at_ms: r.created_at,
        updated_at_ms: r.updated_at,
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
    db.insert_rule(&RuleRow {
        rule_id: r.rule_id.clone(),
        workspace_id: r.workspace_id.clone(),
        name: r.name.clone(),
        enabled: r.enabled,
        events: serde_json::to_string(&r.events)?,
        channels: serde_json::to_string(&r.channels)?,
        created_at: now,
        updated_at: now,
    })
    .await?;
    Ok(r)
}

pub async fn rules(db: &Db, workspace: &str) -> Result<Vec<Rule>> {
    db.rules(workspace).await?.into_iter().map(rule).collect()
}

pub async fn get_rule(db: &Db, workspace: &str, id: &str) -> Result<Option<Rule>> {
    db.rule(workspace, id).await?.map(rule).transpose()
}

/// Replaces a rule; None when the workspace has no such rule.
pub async fn update_rule(db: &Db, workspace: &str, id: &str, input: &RuleInput) -> Result<Option<Rule>> {
    let (events, channels) = (serde_json::to_string(&input.events)?, serde_json::to_string(&input.channels)?);
    let change = RuleChange {
        name: &input.name,
        enabled: input.enabled,
        events: &events,
        channels: &channels,
        updated_at: now_ms(),
    };
    if !db.update_rule(workspace, id, &change).await? {
        return Ok(None);
    }
    get_rule(db, workspace, id).await
}

pub async fn delete_rule(db: &Db, workspace: &str, id: &str) -> Result<bool> {
    db.delete_rule(workspace, id).await
}

/// Enabled rules of a workspace, inside the planning transaction.
pub async fn enabled_rules(tx: &mut Tx, workspace: &str) -> Result<Vec<Rule>> {
    gpusanity_db::rules::enabled_rules(tx, workspace).await?.into_iter().map(rule).collect()
}

/// The newest deliveries of a workspace (optionally of one status) with their attempts, each
/// target shown as its address (the webhook URL or the email address, never a secret).
pub async fn deliveries(db: &Db, workspace: &str, status: Option<&str>, limit: i64) -> Result<Vec<DeliveryView>> {
    let mut out = db.deliveries(workspace, status, limit).await?;
    for d in &mut out {
        d.target = crate::target::Target::from_json(&d.channel, &d.target)
            .map(|t| t.address().to_string())
            .unwrap_or_default();
    }
    Ok(out)
}
