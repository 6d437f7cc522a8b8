//! Ownership among replicas: who holds a run (a lease with a fencing token) and who holds a
//! named piece of work that one replica at a time may do (the outbox publisher).
//!
//! A replica holds a run while its lease (`runs.lease_until`) is in the future and renews it
//! while it works on the run. Every claim raises the run's fence, and every write that ends the
//! run names the fence its writer holds ([`crate::runs::finish_run`]): a replica that lost its
//! database connection, or whose lease ran out and was taken over, cannot end the run any more.

use crate::rows::{RunRow, RUN_COLUMNS};
use crate::{Db, Result, Tx};

/// A replica's hold on a run: the fence it must name to write the run's end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub owner: String,
    pub token: i64,
}

/// A run's ownership columns.
#[derive(sqlx::FromRow)]
struct Owned {
    owner: Option<String>,
    fence: i64,
    kpartition: Option<i64>,
}

/// A run's id with its fence, as a renewal returns them.
#[derive(sqlx::FromRow)]
struct Renewed {
    run_id: String,
    fence: i64,
}

/// A run taken by a claim, with its new fence and its partition.
#[derive(sqlx::FromRow)]
struct Claimed {
    #[sqlx(flatten)]
    run: RunRow,
    fence: i64,
    kpartition: Option<i64>,
}

/// A stored partition number (None when absent or out of range).
fn partition_of(kpartition: Option<i64>) -> Option<i32> {
    kpartition.and_then(|p| i32::try_from(p).ok())
}

/// Makes `owner` the holder of the run just stored (in the same transaction), with the
/// job-events partition its event came from.
pub async fn own_new(tx: &mut Tx, run_id: &str, owner: &str, partition: i32, until: i64) -> Result<Fence> {
    let token: i64 = sqlx::query_scalar(
        "UPDATE runs SET owner = $1, fence = fence + 1, lease_until = $2, kpartition = $3 WHERE run_id = $4 RETURNING fence",
    )
    .bind(owner)
    .bind(until)
    .bind(i64::from(partition))
    .bind(run_id)
    .fetch_one(&mut **tx)
    .await?;
    Ok(Fence { owner: owner.into(), token })
}

/// `col IN ($first, $first+1, ...)` for `n` values, or a false condition for none.
fn in_list(col: &str, first: usize, n: usize) -> String {
    if n == 0 {
        return "1 = 0".into();
    }
    let list: Vec<String> = (first..first + n).map(|i| format!("${i}")).collect();
    format!("{col} IN ({})", list.join(", "))
}

impl Db {
    /// The fence the run's row holds now, with the run's job-events partition (None: no such run).
    pub async fn fence_of(&self, run_id: &str) -> Result<Option<(Fence, Option<i32>)>> {
        let r: Option<Owned> = sqlx::query_as("SELECT owner, fence, kpartition FROM runs WHERE run_id = $1")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(r.map(|r| (Fence { owner: r.owner.unwrap_or_default(), token: r.fence }, partition_of(r.kpartition))))
    }

    /// Renews `owner`'s leases of `held` (run id, fence) until `until`; returns the ids of those
    /// it still holds (in Checking, not held for a person, with the same fence). A run missing
    /// from the answer was ended elsewhere (cancelled) or taken over.
    pub async fn renew_runs(&self, owner: &str, held: &[(String, i64)], until: i64) -> Result<Vec<String>> {
        let mut kept = Vec::new();
        for chunk in held.chunks(500) {
            let sql = format!(
                "UPDATE runs SET lease_until = $1 WHERE owner = $2 AND state = 'Checking' AND held = 0 AND {} RETURNING run_id, fence",
                in_list("run_id", 3, chunk.len())
            );
            let mut q = sqlx::query_as::<_, Renewed>(&sql).bind(until).bind(owner);
            for (id, _) in chunk {
                q = q.bind(id);
            }
            for r in q.fetch_all(&self.pool).await? {
                if chunk.iter().any(|(i, f)| *i == r.run_id && *f == r.fence) {
                    kept.push(r.run_id);
                }
            }
        }
        Ok(kept)
    }

    /// Takes the runs in Checking (not held) that `owner` may take now, until `until`, each
    /// with a new fence: every run recorded as `owner`'s when `own` (a restart of the same
    /// replica), and every run whose lease ran out before `now` that came from one of
    /// `partitions` (the consumer group gave them to this replica), or whose lease ran out more
    /// than `stale_ms` ago (nobody holds its partition). A row lock makes two replicas that
    /// claim at once take each run once.
    pub async fn claim_runs(
        &self,
        owner: &str,
        own: bool,
        partitions: &[i32],
        now: i64,
        until: i64,
        stale_ms: i64,
    ) -> Result<Vec<(RunRow, Fence, Option<i32>)>> {
        let sql = format!(
            "UPDATE runs SET owner = $1, fence = fence + 1, lease_until = $2 \
             WHERE state = 'Checking' AND held = 0 AND ( \
               ($3 = 1 AND owner = $1) \
               OR (lease_until < $4 AND (kpartition IS NULL OR lease_until < $5 OR {})) \
             ) RETURNING {RUN_COLUMNS}, fence, kpartition",
            in_list("kpartition", 6, partitions.len())
        );
        let mut q = sqlx::query_as::<_, Claimed>(&sql)
            .bind(owner)
            .bind(until)
            .bind(i64::from(own))
            .bind(now)
            .bind(now.saturating_sub(stale_ms));
        for p in partitions {
            q = q.bind(i64::from(*p));
        }
        let rows = q.fetch_all(&self.pool).await?;
        Ok(rows
            .into_iter()
            .map(|c| (c.run, Fence { owner: owner.into(), token: c.fence }, partition_of(c.kpartition)))
            .collect())
    }

    /// Gives a run up (its partition went to another replica): its lease ends now, so the new
    /// holder of the partition takes it at once.
    pub async fn release_run(&self, run_id: &str, fence: &Fence) -> Result<()> {
        sqlx::query("UPDATE runs SET lease_until = 0 WHERE run_id = $1 AND owner = $2 AND fence = $3")
            .bind(run_id)
            .bind(&fence.owner)
            .bind(fence.token)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Gives up every run `owner` holds (a clean stop): their lease ends now.
    pub async fn release_runs_of(&self, owner: &str) -> Result<u64> {
        let done = sqlx::query("UPDATE runs SET lease_until = 0 WHERE owner = $1 AND state = 'Checking'")
            .bind(owner)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Takes or renews the lease `name` for `holder` until `until`, if it is free (never held,
    /// ran out before `now`) or already `holder`'s; its token then, None when another holds it.
    /// The token grows at every change of holder.
    pub async fn hold_lease(&self, name: &str, holder: &str, now: i64, until: i64) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "INSERT INTO leases (name, holder, token, until) VALUES ($1, $2, 1, $3) \
             ON CONFLICT (name) DO UPDATE SET \
               token = CASE WHEN leases.holder = $2 THEN leases.token ELSE leases.token + 1 END, \
               holder = $2, until = $3 \
             WHERE leases.holder = $2 OR leases.until < $4 RETURNING token",
        )
        .bind(name)
        .bind(holder)
        .bind(until)
        .bind(now)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Ends `holder`'s lease `name` now (a clean stop hands it over at once).
    pub async fn drop_lease(&self, name: &str, holder: &str) -> Result<()> {
        sqlx::query("UPDATE leases SET until = 0 WHERE name = $1 AND holder = $2")
            .bind(name)
            .bind(holder)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::ServiceRunState;
    use crate::runs::insert_run;

    fn run(id: &str) -> RunRow {
        RunRow {
            run_id: id.into(),
            job_id: format!("job-{id}"),
            workspace_id: "ws".into(),
            attempt: 1,
            cause_event_id: format!("ev-{id}"),
            nodes: vec![],
            check_args: String::new(),
            settings: serde_json::json!({}),
            state: ServiceRunState::Checking,
            held: false,
            created_at: 0,
            deadline_at: 0,
            finished_at: None,
            summary: String::new(),
        }
    }

    async fn db(dir: &tempfile::TempDir) -> Db {
        Db::connect(&format!("sqlite://{}", dir.path().join("t.db").display())).await.expect("db")
    }

    async fn stored(db: &Db, id: &str, owner: &str, partition: i32, until: i64) -> Fence {
        let mut tx = db.begin().await.expect("tx");
        insert_run(&mut tx, &run(id)).await.expect("insert");
        let f = own_new(&mut tx, id, owner, partition, until).await.expect("own");
        tx.commit().await.expect("commit");
        f
    }

    #[tokio::test]
    async fn a_run_is_taken_over_only_when_its_lease_ran_out_and_the_old_fence_cannot_end_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = db(&dir).await;
        let a = stored(&db, "r1", "a", 3, 10_000).await;
        assert_eq!(a.token, 1);
        // Before the lease ran out: B may not take it, even holding its partition.
        assert!(db.claim_runs("b", false, &[3], 5_000, 15_000, 60_000).await.expect("claim").is_empty());
        // After: only the holder of partition 3 takes it (not B with partition 4).
        assert!(db.claim_runs("b", false, &[4], 11_000, 21_000, 60_000).await.expect("claim").is_empty());
        let taken = db.claim_runs("b", false, &[3, 4], 11_000, 21_000, 60_000).await.expect("claim");
        assert_eq!(taken.len(), 1);
        let b = taken[0].1.clone();
        assert_eq!(b.token, 2);
        // A's renewal finds it lost; B's keeps it.
        assert!(db.renew_runs("a", &[("r1".into(), 1)], 30_000).await.expect("renew").is_empty());
        assert_eq!(db.renew_runs("b", &[("r1".into(), 2)], 30_000).await.expect("renew"), vec!["r1".to_string()]);
        // A cannot end it with its old fence; B can.
        let mut tx = db.begin().await.expect("tx");
        assert!(!crate::runs::finish_run(&mut tx, "r1", ServiceRunState::CheckPassed, "ok", None, Some(&a))
            .await
            .expect("finish"));
        assert!(crate::runs::finish_run(&mut tx, "r1", ServiceRunState::CheckPassed, "ok", None, Some(&b))
            .await
            .expect("finish"));
        tx.commit().await.expect("commit");
        assert!(db.claim_runs("c", true, &[3], 99_000, 109_000, 1).await.expect("claim").is_empty(), "ended");
    }

    #[tokio::test]
    async fn a_stale_lease_is_taken_by_anyone_and_a_restarted_replica_takes_its_own_at_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = db(&dir).await;
        stored(&db, "r1", "a", 3, 10_000).await;
        stored(&db, "r2", "b", 5, 10_000).await;
        let taken = db.claim_runs("c", false, &[], 40_000, 50_000, 20_000).await.expect("claim");
        assert_eq!(taken.iter().map(|(r, _, _)| r.run_id.as_str()).collect::<Vec<_>>(), vec!["r1", "r2"]);
        // C restarted: it takes its own runs back before their lease ran out, with a new fence.
        let again = db.claim_runs("c", true, &[], 41_000, 51_000, 20_000).await.expect("claim");
        assert_eq!(again.len(), 2);
        assert!(again.iter().all(|(_, f, _)| f.token == 3));
        // A release hands a run over at once to the holder of its partition.
        db.release_run("r2", &again[1].1).await.expect("release");
        let d = db.claim_runs("d", false, &[5], 42_000, 52_000, 20_000).await.expect("claim");
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].0.run_id, "r2");
    }

    #[tokio::test]
    async fn one_holder_of_a_named_lease_at_a_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = db(&dir).await;
        assert_eq!(db.hold_lease("outbox", "a", 0, 10_000).await.expect("lease"), Some(1));
        assert_eq!(db.hold_lease("outbox", "b", 5_000, 15_000).await.expect("lease"), None);
        assert_eq!(db.hold_lease("outbox", "a", 6_000, 16_000).await.expect("lease"), Some(1), "renewed");
        assert_eq!(db.hold_lease("outbox", "b", 17_000, 27_000).await.expect("lease"), Some(2), "ran out");
        db.drop_lease("outbox", "b").await.expect("drop");
        assert_eq!(db.hold_lease("outbox", "a", 18_000, 28_000).await.expect("lease"), Some(3), "handed over");
    }
}
