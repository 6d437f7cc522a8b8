//! The isolation backends' circuit breaker, shared by every replica of the service: the nodes
//! seen in runs (`breaker_nodes`) and every isolation asked about (`breaker_actions`). Asking
//! whether one more isolation is allowed ([`Db::breaker_admit`]) counts and takes a slot in one
//! transaction that holds the breaker's lock (PostgreSQL: a transaction-scoped advisory lock;
//! SQLite: the write lock of `BEGIN IMMEDIATE`), so two replicas asking at once never both pass
//! the cap. A slot is taken before the node is changed and given back when nothing changed
//! ([`Db::breaker_settle`]); a replica that dies in between leaves its slot taken until the
//! window passes (it errs towards isolating fewer nodes).

use std::collections::BTreeSet;

use crate::bulk::{values, CHUNK};
use crate::{now_ms, Db, DbBackend, Result};

/// The advisory lock's key on PostgreSQL (the bytes of `gpsbrkr1`).
const LOCK_KEY: i64 = 0x6770_7362_726b_7231;

/// What became of an isolation the breaker was asked about (`breaker_actions.outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The node was changed: the slot stays taken for the window.
    Isolated,
    /// Nothing changed (already isolated, not gpusanity's to change): the slot is given back.
    Unchanged,
    /// The isolation failed: the slot is given back.
    Failed,
}

impl Settled {
    fn as_str(self) -> &'static str {
        match self {
            Settled::Isolated => "isolated",
            Settled::Unchanged => "unchanged",
            Settled::Failed => "failed",
        }
    }
}

/// The breaker's limits: at most `max(min_nodes, floor(max_share x known nodes))` isolations
/// within `window_ms`, a node being known while it was seen in a run within `forget_ms` (a
/// decommissioned node stops raising the cap). Rows older than both are deleted as the breaker
/// is asked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub max_share: f64,
    pub min_nodes: u64,
    pub window_ms: i64,
    pub forget_ms: i64,
}

impl Limits {
    /// The cap for `known` nodes.
    pub fn cap(&self, known: i64) -> i64 {
        // A share of a node count: finite, within 0..=known (max_share is checked to 0..=1).
        let share = (self.max_share.clamp(0.0, 1.0) * known.max(0) as f64).floor() as i64;
        share.max(i64::try_from(self.min_nodes).unwrap_or(i64::MAX))
    }
}

/// The breaker's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Allowed: the slot taken, to settle once the isolation is done.
    Admitted(Slot),
    /// Past the cap (recorded as `refused`).
    Refused(Refusal),
}

/// A slot taken by [`Db::breaker_admit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    pub id: i64,
}

/// Why the breaker refused: `recent` isolations within the window, the cap, the known nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub recent: i64,
    pub cap: i64,
    pub known: i64,
}

/// One row of `breaker_actions`.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct BreakerAction {
    pub id: i64,
    pub node_name: String,
    pub at: i64,
    /// `admitted`, `isolated`, `unchanged`, `failed` or `refused`.
    pub outcome: String,
    pub replica: String,
    /// `kubernetes` or `slurm`.
    pub backend: String,
}

#[derive(sqlx::FromRow)]
struct Count {
    n: i64,
}

#[derive(sqlx::FromRow)]
struct Id {
    id: i64,
}

/// Records `nodes` as seen now (duplicates allowed), in chunks.
async fn seen(conn: &mut sqlx::AnyConnection, nodes: &[&str]) -> Result<()> {
    let unique: Vec<&str> = nodes.iter().copied().collect::<BTreeSet<_>>().into_iter().collect();
    let now = now_ms();
    for chunk in unique.chunks(CHUNK) {
        let sql = format!(
            "INSERT INTO breaker_nodes (node_name, seen_at) VALUES {} \
             ON CONFLICT (node_name) DO UPDATE SET seen_at = excluded.seen_at",
            values(chunk.len(), 2, 1)
        );
        let mut q = sqlx::query(&sql);
        for n in chunk {
            q = q.bind(*n).bind(now);
        }
        q.execute(&mut *conn).await?;
    }
    Ok(())
}

impl Db {
    /// Records nodes seen in a run: they count towards the fleet.
    pub async fn breaker_seen(&self, nodes: &[String]) -> Result<()> {
        let names: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let mut tx = self.begin().await?;
        seen(&mut tx, &names).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Whether `replica`'s `backend` may isolate `node` now: counts the known nodes (`node`
    /// among them) and the slots taken within the window, and takes one or records the
    /// refusal, atomically across replicas (see the module's description).
    pub async fn breaker_admit(&self, node: &str, replica: &str, backend: &str, limits: Limits) -> Result<Admission> {
        let mut tx = self.begin().await?;
        if self.backend == DbBackend::Postgres {
            // Held until the commit; the statements after it see what the last holder committed.
            sqlx::query("SELECT 1 AS n FROM (SELECT pg_advisory_xact_lock($1)) l")
                .bind(LOCK_KEY)
                .execute(&mut *tx)
                .await?;
        }
        let now = now_ms();
        // What neither the count of known nodes nor the window will read again.
        let horizon = now.saturating_sub(limits.forget_ms.max(limits.window_ms));
        sqlx::query("DELETE FROM breaker_nodes WHERE seen_at < $1").bind(horizon).execute(&mut *tx).await?;
        sqlx::query("DELETE FROM breaker_actions WHERE at < $1").bind(horizon).execute(&mut *tx).await?;
        seen(&mut tx, &[node]).await?;
        let known: Count = sqlx::query_as("SELECT COUNT(*) AS n FROM breaker_nodes WHERE seen_at >= $1")
            .bind(now.saturating_sub(limits.forget_ms))
            .fetch_one(&mut *tx)
            .await?;
        let recent: Count = sqlx::query_as(
            "SELECT COUNT(*) AS n FROM breaker_actions WHERE outcome IN ('admitted', 'isolated') AND at > $1",
        )
        .bind(now.saturating_sub(limits.window_ms))
        .fetch_one(&mut *tx)
        .await?;
        let cap = limits.cap(known.n);
        let outcome = if recent.n >= cap { "refused" } else { "admitted" };
        let row: Id = sqlx::query_as(
            "INSERT INTO breaker_actions (node_name, at, outcome, replica, backend) VALUES ($1, $2, $3, $4, $5) RETURNING id",
        )
        .bind(node)
        .bind(now)
        .bind(outcome)
        .bind(replica)
        .bind(backend)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(if recent.n >= cap {
            Admission::Refused(Refusal { recent: recent.n, cap, known: known.n })
        } else {
            Admission::Admitted(Slot { id: row.id })
        })
    }

    /// What became of the isolation of `slot`: the slot stays taken only when it isolated.
    pub async fn breaker_settle(&self, slot: &Slot, outcome: Settled) -> Result<()> {
        sqlx::query("UPDATE breaker_actions SET outcome = $1 WHERE id = $2 AND outcome = 'admitted'")
            .bind(outcome.as_str())
            .bind(slot.id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// The last `limit` actions, newest first.
    pub async fn breaker_actions(&self, limit: i64) -> Result<Vec<BreakerAction>> {
        Ok(sqlx::query_as(
            "SELECT id, node_name, at, outcome, replica, backend FROM breaker_actions ORDER BY id DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_the_share_of_the_known_nodes_at_least_min_nodes() {
        let l = Limits { max_share: 0.2, min_nodes: 1, window_ms: 1000, forget_ms: 1000 };
        assert_eq!((l.cap(0), l.cap(4), l.cap(10), l.cap(19)), (1, 1, 2, 3));
        let wide = Limits { max_share: 7.0, min_nodes: u64::MAX, window_ms: 1, forget_ms: 1 };
        assert_eq!(wide.cap(i64::MAX), i64::MAX);
        assert_eq!(Limits { max_share: f64::NAN, min_nodes: 0, window_ms: 1, forget_ms: 1 }.cap(10), 0);
    }

    #[tokio::test]
    async fn a_slot_given_back_is_free_again_and_the_window_moves_on() {
        let dir = tempfile::tempdir().expect("dir");
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("b.db").display())).await.expect("db");
        let nodes: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
        db.breaker_seen(&nodes).await.expect("seen");
        db.breaker_seen(&nodes[..3]).await.expect("seen twice");
        let limits = Limits { max_share: 0.2, min_nodes: 1, window_ms: 60_000, forget_ms: 60_000 };
        let admit = |n: &'static str| db.breaker_admit(n, "r0", "kubernetes", limits);
        let Admission::Admitted(a) = admit("n1").await.expect("admit") else { panic!("the first is allowed") };
        let Admission::Admitted(b) = admit("n2").await.expect("admit") else { panic!("the second is allowed") };
        let refused = admit("n3").await.expect("admit");
        assert_eq!(refused, Admission::Refused(Refusal { recent: 2, cap: 2, known: 10 }));
        db.breaker_settle(&a, Settled::Unchanged).await.expect("settle");
        db.breaker_settle(&b, Settled::Isolated).await.expect("settle");
        // Settled once: a second settling changes nothing.
        db.breaker_settle(&b, Settled::Failed).await.expect("settle");
        let Admission::Admitted(_) = admit("n3").await.expect("admit") else { panic!("a slot was given back") };
        let outcomes: Vec<String> =
            db.breaker_actions(10).await.expect("actions").into_iter().map(|a| a.outcome).collect();
        assert_eq!(outcomes, ["admitted", "refused", "isolated", "unchanged"]);
        let short = Limits { window_ms: 0, ..limits };
        assert!(matches!(db.breaker_admit("n4", "r0", "slurm", short).await.expect("admit"), Admission::Admitted(_)));
    }

    #[tokio::test]
    async fn nodes_not_seen_for_a_while_stop_counting_and_old_rows_are_deleted() {
        let dir = tempfile::tempdir().expect("dir");
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("b.db").display())).await.expect("db");
        let nodes: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
        db.breaker_seen(&nodes).await.expect("seen");
        let long = Limits { max_share: 0.5, min_nodes: 1, window_ms: 60_000, forget_ms: 60_000 };
        let Admission::Admitted(slot) = db.breaker_admit("n1", "r0", "slurm", long).await.expect("admit") else {
            panic!("1 of 10")
        };
        db.breaker_settle(&slot, Settled::Isolated).await.expect("settle");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        // Forgotten after 20 ms: the ten nodes and the old isolation are gone; the node asked
        // about is the one known node, and its share (0.5 of 1) is below min_nodes.
        let short = Limits { max_share: 0.5, min_nodes: 1, window_ms: 20, forget_ms: 20 };
        let Admission::Admitted(_) = db.breaker_admit("n2", "r0", "slurm", short).await.expect("admit") else {
            panic!("the old isolation is out of the window")
        };
        let refused = db.breaker_admit("n3", "r0", "slurm", short).await.expect("admit");
        assert_eq!(refused, Admission::Refused(Refusal { recent: 1, cap: 1, known: 2 }));
        let nodes: Vec<String> =
            db.breaker_actions(10).await.expect("actions").into_iter().map(|a| a.node_name).collect();
        assert_eq!(nodes, ["n3", "n2"], "the isolation of n1 is deleted");
    }
}
