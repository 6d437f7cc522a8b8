//! Multi-row statements for the consumer's batches: one round trip writes or looks up the rows
//! of many job events, in the caller's transaction. The same SQL serves SQLite and PostgreSQL
//! (multi-row `VALUES`, `ON CONFLICT`, `RETURNING`); each statement takes at most [`CHUNK`]
//! rows, far below either database's limit on bound parameters.

use std::collections::HashSet;

use crate::rows::JobRow;
use crate::{now_ms, Result, Tx};

/// The most rows one statement writes or looks up.
pub const CHUNK: usize = 500;

/// A job event to record as handled (`job_events`).
#[derive(Debug, Clone)]
pub struct JobEventRow<'a> {
    pub event_id: &'a str,
    pub job_id: &'a str,
    pub event_type: &'a str,
    pub payload: String,
    pub decision: String,
}

/// A message to queue in the outbox.
#[derive(Debug, Clone)]
pub struct OutboxInsert {
    pub topic: String,
    pub key: String,
    pub event_id: String,
    pub payload: String,
}

/// The rows one statement of `cols` columns writes when there are many (a run's rank results,
/// its fleet samples): about 256 bound parameters. More would cost SQLite more than the round
/// trips they save: its driver finds each `$N` by name in a list of every parameter of the
/// statement (measured: 4,000 parameters a statement spent 42% of the service's time there).
pub fn wide_chunk(cols: usize) -> usize {
    (256 / cols.max(1)).max(1)
}

/// `($first, ..., $first+cols-1), (...)` for `rows` rows of `cols` placeholders each.
pub(crate) fn values(rows: usize, cols: usize, first: usize) -> String {
    let mut out = String::new();
    for r in 0..rows {
        if r > 0 {
            out.push_str(", ");
        }
        out.push('(');
        for c in 0..cols {
            if c > 0 {
                out.push_str(", ");
            }
            out.push('$');
            out.push_str(&(first + r * cols + c).to_string());
        }
        out.push(')');
    }
    out
}

/// `$first, $first+1, ...` for `n` values.
fn list(n: usize, first: usize) -> String {
    (first..first + n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// The first column (text) of the rows `select` finds, `select` ending in `IN (` and taking
/// `values` there, chunk by chunk.
async fn texts_in(tx: &mut Tx, select: &str, values: &[&str]) -> Result<HashSet<String>> {
    let mut found = HashSet::new();
    for chunk in values.chunks(CHUNK) {
        let sql = format!("{select}{})", list(chunk.len(), 1));
        let mut q = sqlx::query_scalar::<_, String>(&sql);
        for v in chunk {
            q = q.bind(*v);
        }
        found.extend(q.fetch_all(&mut **tx).await?);
    }
    Ok(found)
}

/// The ids among `ids` of job events already recorded.
pub async fn seen_job_events(tx: &mut Tx, ids: &[&str]) -> Result<HashSet<String>> {
    texts_in(tx, "SELECT event_id FROM job_events WHERE event_id IN (", ids).await
}

/// The ids among `job_ids` of jobs with a run in `Checking`.
pub async fn jobs_with_active_run(tx: &mut Tx, job_ids: &[&str]) -> Result<HashSet<String>> {
    texts_in(tx, "SELECT DISTINCT job_id FROM runs WHERE state = 'Checking' AND job_id IN (", job_ids).await
}

/// Stores or replaces the jobs (as [`crate::runs::upsert_job`] does each). A job id may appear
/// once only: one statement cannot change a row twice.
pub async fn upsert_jobs(tx: &mut Tx, jobs: &[JobRow]) -> Result<()> {
    let now = now_ms();
    for chunk in jobs.chunks(CHUNK) {
        let sql = format!(
            "INSERT INTO jobs (job_id, workspace_id, attempt, framework, nodes, enable_check, check_args, stopped, updated_at) \
             VALUES {} ON CONFLICT (job_id) DO UPDATE SET workspace_id = excluded.workspace_id, attempt = excluded.attempt, \
             framework = excluded.framework, nodes = excluded.nodes, enable_check = excluded.enable_check, \
             check_args = excluded.check_args, stopped = excluded.stopped, updated_at = excluded.updated_at",
            values(chunk.len(), 9, 1)
        );
        let mut q = sqlx::query(&sql);
        for j in chunk {
            q = q
                .bind(&j.job_id)
                .bind(&j.workspace_id)
                .bind(j.attempt)
                .bind(&j.framework)
                .bind(serde_json::to_string(&j.nodes)?)
                .bind(i64::from(j.enable_check))
                .bind(&j.check_args)
                .bind(0i64)
                .bind(now);
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

/// Records the job events as handled; returns the ids of those recorded now. An id missing
/// from the answer was recorded before (by another replica, while this transaction ran).
pub async fn record_job_events(tx: &mut Tx, rows: &[JobEventRow<'_>]) -> Result<HashSet<String>> {
    let now = now_ms();
    let mut done = HashSet::new();
    for chunk in rows.chunks(CHUNK) {
        let sql = format!(
            "INSERT INTO job_events (event_id, job_id, event_type, payload, decision, received_at) VALUES {} \
             ON CONFLICT (event_id) DO NOTHING RETURNING event_id",
            values(chunk.len(), 6, 1)
        );
        let mut q = sqlx::query_scalar::<_, String>(&sql);
        for r in chunk {
            q = q.bind(r.event_id).bind(r.job_id).bind(r.event_type).bind(&r.payload).bind(&r.decision).bind(now);
        }
        done.extend(q.fetch_all(&mut **tx).await?);
    }
    Ok(done)
}

/// Queues the messages, in order (as [`crate::outbox::enqueue_raw`] does each: a message whose
/// event id is queued already is dropped).
pub async fn enqueue(tx: &mut Tx, rows: &[OutboxInsert]) -> Result<()> {
    let now = now_ms();
    for chunk in rows.chunks(CHUNK) {
        let sql = format!(
            "INSERT INTO outbox (event_id, topic, msg_key, payload, created_at) VALUES {} ON CONFLICT (event_id) DO NOTHING",
            values(chunk.len(), 5, 1)
        );
        let mut q = sqlx::query(&sql);
        for r in chunk {
            q = q.bind(&r.event_id).bind(&r.topic).bind(&r.key).bind(&r.payload).bind(now);
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Db;

    #[test]
    fn placeholders() {
        assert_eq!(values(2, 3, 1), "($1, $2, $3), ($4, $5, $6)");
        assert_eq!(list(3, 2), "$2, $3, $4");
    }

    fn job(id: &str, attempt: i64) -> JobRow {
        JobRow {
            job_id: id.into(),
            workspace_id: "ws".into(),
            attempt,
            framework: None,
            nodes: vec![],
            enable_check: false,
            check_args: String::new(),
        }
    }

    #[tokio::test]
    async fn many_rows_in_one_statement_and_ids_recorded_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("t.db").display())).await.expect("db");
        let mut tx = db.begin().await.expect("tx");
        let jobs: Vec<JobRow> = (0..CHUNK + 3).map(|i| job(&format!("j{i}"), 0)).collect();
        upsert_jobs(&mut tx, &jobs).await.expect("jobs");
        upsert_jobs(&mut tx, &[job("j1", 4)]).await.expect("again");
        assert_eq!(crate::runs::get_job(&mut tx, "j1").await.expect("get").map(|j| j.attempt), Some(4));
        let ev = |id: &'static str| JobEventRow {
            event_id: id,
            job_id: "j1",
            event_type: "JobStopped",
            payload: "{}".into(),
            decision: "d".into(),
        };
        assert_eq!(record_job_events(&mut tx, &[ev("a"), ev("b")]).await.expect("record").len(), 2);
        let again = record_job_events(&mut tx, &[ev("b"), ev("c")]).await.expect("record");
        assert_eq!(again, HashSet::from(["c".to_string()]));
        let seen = seen_job_events(&mut tx, &["a", "c", "x"]).await.expect("seen");
        assert_eq!(seen, HashSet::from(["a".to_string(), "c".to_string()]));
        assert!(jobs_with_active_run(&mut tx, &["j1"]).await.expect("active").is_empty());
        let m =
            |id: &str| OutboxInsert { topic: "t".into(), key: "k".into(), event_id: id.into(), payload: "p".into() };
        enqueue(&mut tx, &[m("o1"), m("o2"), m("o1")]).await.expect("enqueue");
        tx.commit().await.expect("commit");
        assert_eq!(db.unsent(10).await.expect("unsent").len(), 2);
    }
}
