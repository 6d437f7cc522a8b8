//! Planning: outbox rows -> deliveries, in one transaction per batch.
//!
//! The output events are already in the outbox, written in the transaction of the state change
//! that caused them. The planner reads the rows it has not planned yet, matches each output
//! event against its workspace's enabled rules and, in ONE transaction, inserts one delivery
//! per (event, rule, channel, recipient) under a stable idempotency key and marks the rows
//! planned. A crash before the commit plans the same rows again after a restart, with the same
//! keys; a crash after it leaves the deliveries to the sender. Either way each delivery exists
//! once.

use std::time::Duration;

use gpusanity_common::wire::output::OutputEvent;
use gpusanity_db::deliveries::{self, NewDelivery};
use gpusanity_db::{Db, DbError};
use sha2::{Digest, Sha256};

use crate::store;
use crate::target::targets;

/// The idempotency key of a delivery: a hash of the event id, the rule id, the channel's
/// position in the rule and the recipient, so planning the same row again yields the same key.
pub fn idempotency_key(event_id: &str, rule_id: &str, channel: usize, recipient: &str) -> String {
    let mut h = Sha256::new();
    for part in [event_id, rule_id, &channel.to_string(), recipient] {
        h.update(part.as_bytes());
        h.update([0u8]);
    }
    format!("gsn-{}", &hex::encode(h.finalize())[..40])
}

/// Plans up to `limit` unplanned outbox rows; returns how many deliveries it inserted.
pub async fn plan_batch(db: &Db, output_topic: &str, limit: i64) -> Result<usize, DbError> {
    if !db.any_unplanned().await? {
        return Ok(0);
    }
    let mut tx = db.begin().await?;
    let rows = deliveries::unplanned(&mut tx, limit).await?;
    let mut planned = 0;
    for row in &rows {
        if row.topic == output_topic {
            match serde_json::from_str::<OutputEvent>(&row.payload) {
                Ok(ev) => {
                    for rule in store::enabled_rules(&mut tx, &ev.workspace_id).await? {
                        if !rule.wants(&ev.body) {
                            continue;
                        }
                        for (i, c) in rule.channels.iter().enumerate() {
                            for t in targets(c) {
                                let key = idempotency_key(&ev.event_id, &rule.rule_id, i, t.address());
                                let d = NewDelivery {
                                    key: &key,
                                    workspace: &ev.workspace_id,
                                    rule_id: &rule.rule_id,
                                    event_id: &ev.event_id,
                                    event_type: ev.body.type_name(),
                                    channel: t.channel(),
                                    target: serde_json::to_string(&t)?,
                                    event: &row.payload,
                                };
                                deliveries::insert_delivery(&mut tx, &d).await?;
                                planned += 1;
                            }
                        }
                    }
                }
                // The coordinator wrote it, so this is a bug elsewhere; it is skipped, not retried forever.
                Err(e) => {
                    tracing::error!(outbox_id = row.id, "an output event in the outbox is malformed, not notified: {e}")
                }
            }
        }
        deliveries::mark_planned(&mut tx, row.id).await?;
    }
    tx.commit().await?;
    Ok(planned)
}

/// Plans until the process ends: every `poll` while idle, at once while rows are waiting.
pub async fn run(db: &Db, output_topic: &str, poll: Duration, wake: &tokio::sync::Notify) -> Result<(), DbError> {
    loop {
        let n = plan_batch(db, output_topic, 500).await?;
        if n > 0 {
            tracing::debug!("planned {n} deliveries");
            wake.notify_one();
        }
        if db.any_unplanned().await? {
            continue;
        }
        tokio::time::sleep(poll).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_and_distinct() {
        let k = idempotency_key("ev", "rule", 0, "a@b.c");
        assert_eq!(k, idempotency_key("ev", "rule", 0, "a@b.c"));
        assert_eq!(k.len(), 44);
        assert_ne!(k, idempotency_key("ev", "rule", 1, "a@b.c"));
        assert_ne!(k, idempotency_key("ev", "rule", 0, "x@b.c"));
        assert_ne!(k, idempotency_key("ev2", "rule", 0, "a@b.c"));
        // The separator keeps shifted boundaries apart.
        assert_ne!(idempotency_key("ab", "c", 0, ""), idempotency_key("a", "bc", 0, ""));
    }
}
