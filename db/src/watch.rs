//! The watch while a job runs (docs/watch.md): which jobs are watched (those not stopped whose
//! newest run passed), and each node the judgement suspected, stored with its NodeSuspected in
//! one transaction.

use gpusanity_common::wire::output::{OutputBody, OutputEvent};
use gpusanity_common::wire::watch::SuspectCode;
use serde::Serialize;

use crate::column::Parsed;
use crate::rows::RunRow;
use crate::{outbox, Db, Result, Tx};

/// The most jobs watched at once.
const MAX_WATCHED: i64 = 100_000;

/// A stored suspicion, for the node's page.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct SuspicionRow {
    pub run_id: String,
    pub job_id: String,
    pub node: String,
    pub gpu: String,
    #[sqlx(try_from = "Parsed<SuspectCode>")]
    #[schema(value_type = String)]
    pub code: SuspectCode,
    pub evidence: String,
    pub since_ms: i64,
    pub at_ms: i64,
}

impl From<Parsed<SuspectCode>> for SuspectCode {
    fn from(p: Parsed<SuspectCode>) -> SuspectCode {
        p.0
    }
}

impl Db {
    /// The runs whose jobs are watched: the newest run of each job not stopped, where it passed.
    pub async fn watched_runs(&self) -> Result<Vec<RunRow>> {
        Ok(sqlx::query_as(
            "SELECT r.* FROM runs r JOIN jobs j ON j.job_id = r.job_id \
             WHERE j.stopped = 0 AND r.state = 'CheckPassed' \
             AND r.created_at = (SELECT MAX(r2.created_at) FROM runs r2 WHERE r2.job_id = r.job_id) \
             ORDER BY r.created_at LIMIT $1",
        )
        .bind(MAX_WATCHED)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Stores a suspicion and queues its NodeSuspected on `topic`, unless the run is no longer
    /// its job's watched one (the job stopped or restarted meanwhile) or the (run, node, code)
    /// was stored before; true when stored. Its time (`at_ms`) is when the judgement raised it
    /// (the event's `at`), which a database that was down stores later.
    pub async fn record_suspicion(&self, event: &OutputEvent, topic: &str) -> Result<bool> {
        let OutputBody::NodeSuspected { node, gpu, code, evidence, since } = &event.body else { return Ok(false) };
        let Some(run_id) = &event.run_id else { return Ok(false) };
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "INSERT INTO node_suspicions (event_id, run_id, job_id, workspace_id, node, gpu, code, evidence, since_ms, at_ms) \
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10 WHERE EXISTS ( \
               SELECT 1 FROM runs r JOIN jobs j ON j.job_id = r.job_id WHERE r.run_id = $2 AND j.stopped = 0 \
               AND r.state = 'CheckPassed' \
               AND r.created_at = (SELECT MAX(r2.created_at) FROM runs r2 WHERE r2.job_id = r.job_id)) \
             ON CONFLICT DO NOTHING",
        )
        .bind(&event.event_id)
        .bind(run_id)
        .bind(&event.job_id)
        .bind(&event.workspace_id)
        .bind(node)
        .bind(gpu)
        .bind(code.as_str())
        .bind(evidence)
        .bind(since.timestamp_millis())
        .bind(event.at.timestamp_millis())
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if done == 1 {
            outbox::enqueue(&mut tx, topic, event).await?;
        }
        tx.commit().await?;
        Ok(done == 1)
    }

    /// The node's newest suspicions, newest first (of `workspace`'s jobs only, where given).
    pub async fn node_suspicions(&self, node: &str, workspace: Option<&str>, limit: i64) -> Result<Vec<SuspicionRow>> {
        Ok(sqlx::query_as(
            "SELECT run_id, job_id, node, gpu, code, evidence, since_ms, at_ms FROM node_suspicions \
             WHERE node = $1 AND ($2 = '' OR workspace_id = $2) ORDER BY at_ms DESC LIMIT $3",
        )
        .bind(node)
        .bind(workspace.unwrap_or(""))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }
}

/// Whether the watch suspected a node of the job's newest run (the one its restart supersedes).
pub async fn suspected_in_latest_run(tx: &mut Tx, job_id: &str) -> Result<bool> {
    let n: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM node_suspicions s JOIN runs r ON r.run_id = s.run_id WHERE r.job_id = $1 \
         AND r.created_at = (SELECT MAX(r2.created_at) FROM runs r2 WHERE r2.job_id = $1)",
    )
    .bind(job_id)
    .fetch_one(&mut **tx)
    .await?;
    Ok(n > 0)
}
