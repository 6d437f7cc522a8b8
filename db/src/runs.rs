//! Jobs, job events, runs and their state transitions.

use crate::lease::Fence;
use crate::rows::{JobRow, RunRow, ServiceRunState, RUN_COLUMNS};
use crate::{now_ms, Db, Result, Tx};

/// Records a job event by id; false when it was seen before (a redelivery: do nothing).
pub async fn record_job_event(
    tx: &mut Tx,
    event_id: &str,
    job_id: &str,
    event_type: &str,
    payload: &str,
    decision: &str,
) -> Result<bool> {
    let done = sqlx::query(
        "INSERT INTO job_events (event_id, job_id, event_type, payload, decision, received_at) VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (event_id) DO NOTHING",
    )
    .bind(event_id)
    .bind(job_id)
    .bind(event_type)
    .bind(payload)
    .bind(decision)
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Stores the job, or replaces what its last allocation said (and marks it not stopped).
pub async fn upsert_job(tx: &mut Tx, j: &JobRow) -> Result<()> {
    crate::bulk::upsert_jobs(tx, std::slice::from_ref(j)).await
}

pub async fn get_job(tx: &mut Tx, job_id: &str) -> Result<Option<JobRow>> {
    Ok(sqlx::query_as(
        "SELECT job_id, workspace_id, attempt, framework, nodes, enable_check, check_args FROM jobs WHERE job_id = $1",
    )
    .bind(job_id)
    .fetch_optional(&mut **tx)
    .await?)
}

pub async fn mark_job_stopped(tx: &mut Tx, job_id: &str) -> Result<()> {
    sqlx::query("UPDATE jobs SET stopped = 1, updated_at = $1 WHERE job_id = $2")
        .bind(now_ms())
        .bind(job_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Stores a new run in `Checking` with its first transition.
pub async fn insert_run(tx: &mut Tx, r: &RunRow) -> Result<()> {
    sqlx::query(&format!(
        "INSERT INTO runs ({RUN_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)"
    ))
    .bind(&r.run_id)
    .bind(&r.job_id)
    .bind(&r.workspace_id)
    .bind(r.attempt)
    .bind(&r.cause_event_id)
    .bind(serde_json::to_string(&r.nodes)?)
    .bind(&r.check_args)
    .bind(r.settings.to_string())
    .bind(r.state.as_str())
    .bind(i64::from(r.held))
    .bind(r.created_at)
    .bind(r.deadline_at)
    .bind(r.finished_at)
    .bind(&r.summary)
    .execute(&mut **tx)
    .await?;
    add_transition(tx, &r.run_id, r.state.as_str(), "run stored").await
}

pub async fn add_transition(tx: &mut Tx, run_id: &str, state: &str, detail: &str) -> Result<()> {
    sqlx::query("INSERT INTO transitions (run_id, state, detail, at) VALUES ($1, $2, $3, $4)")
        .bind(run_id)
        .bind(state)
        .bind(detail)
        .bind(now_ms())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// ` AND owner = $a AND fence = $b` when the write is fenced, from parameter `first` on.
fn fence_clause(fence: Option<&Fence>, first: usize) -> String {
    match fence {
        Some(_) => format!(" AND owner = ${first} AND fence = ${}", first + 1),
        None => String::new(),
    }
}

/// Ends a run in `state`, unless it has ended already (then false: nothing changed). With a
/// `fence`, only while the run's row still holds that fence (its writer still owns the run);
/// without (a job stopped, a person's decision), whoever owns it.
pub async fn finish_run(
    tx: &mut Tx,
    run_id: &str,
    state: ServiceRunState,
    summary: &str,
    report: Option<&str>,
    fence: Option<&Fence>,
) -> Result<bool> {
    let sql = format!(
        "UPDATE runs SET state = $1, held = 0, finished_at = $2, summary = $3, report = COALESCE($4, report) WHERE run_id = $5 AND state = 'Checking'{}",
        fence_clause(fence, 6)
    );
    let mut q = sqlx::query(&sql).bind(state.as_str()).bind(now_ms()).bind(summary).bind(report).bind(run_id);
    if let Some(f) = fence {
        q = q.bind(&f.owner).bind(f.token);
    }
    let done = q.execute(&mut **tx).await?;
    transition_if(tx, done.rows_affected(), run_id, state.as_str(), summary).await
}

/// A KeepJobHang overrun: the run stays `Checking`, held for a person.
pub async fn hold_run(
    tx: &mut Tx,
    run_id: &str,
    summary: &str,
    report: Option<&str>,
    fence: Option<&Fence>,
) -> Result<bool> {
    let sql = format!(
        "UPDATE runs SET held = 1, summary = $1, report = COALESCE($2, report) WHERE run_id = $3 AND state = 'Checking' AND held = 0{}",
        fence_clause(fence, 4)
    );
    let mut q = sqlx::query(&sql).bind(summary).bind(report).bind(run_id);
    if let Some(f) = fence {
        q = q.bind(&f.owner).bind(f.token);
    }
    let done = q.execute(&mut **tx).await?;
    transition_if(tx, done.rows_affected(), run_id, "Checking", &format!("held (KeepJobHang): {summary}")).await
}

/// Records the transition when the update changed the run; false when it did not.
async fn transition_if(tx: &mut Tx, changed: u64, run_id: &str, state: &str, detail: &str) -> Result<bool> {
    if changed == 0 {
        return Ok(false);
    }
    add_transition(tx, run_id, state, detail).await?;
    Ok(true)
}

/// The job's run in Checking (a re-check of one of its nodes is not the job's run).
pub async fn active_run_of_job(tx: &mut Tx, job_id: &str) -> Result<Option<RunRow>> {
    Ok(sqlx::query_as(&format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE job_id = $1 AND state = 'Checking' AND recheck_of IS NULL ORDER BY created_at DESC LIMIT 1"
    ))
    .bind(job_id)
    .fetch_optional(&mut **tx)
    .await?)
}

pub async fn get_run_tx(tx: &mut Tx, run_id: &str) -> Result<Option<RunRow>> {
    Ok(sqlx::query_as(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1"))
        .bind(run_id)
        .fetch_optional(&mut **tx)
        .await?)
}

impl Db {
    pub async fn get_run(&self, run_id: &str) -> Result<Option<RunRow>> {
        Ok(sqlx::query_as(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id = $1"))
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// The run's report.json as stored, if any.
    pub async fn run_report(&self, run_id: &str) -> Result<Option<String>> {
        let report: Option<Option<String>> = sqlx::query_scalar("SELECT report FROM runs WHERE run_id = $1")
            .bind(run_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(report.flatten())
    }

    /// Runs in `Checking` (held or not), oldest first: what a restarted service resumes.
    pub async fn active_runs(&self) -> Result<Vec<RunRow>> {
        Ok(sqlx::query_as(&format!("SELECT {RUN_COLUMNS} FROM runs WHERE state = 'Checking' ORDER BY created_at"))
            .fetch_all(&self.pool)
            .await?)
    }

    /// A run in Checking waits for GPUs another run holds: its summary says for what, and a
    /// transition records it.
    pub async fn set_waiting(&self, run_id: &str, why: &str) -> Result<()> {
        let mut tx = self.begin().await?;
        let done = sqlx::query("UPDATE runs SET summary = $1 WHERE run_id = $2 AND state = 'Checking'")
            .bind(why)
            .bind(run_id)
            .execute(&mut *tx)
            .await?;
        transition_if(&mut tx, done.rows_affected(), run_id, "Checking", why).await?;
        tx.commit().await?;
        Ok(())
    }

    /// A run that waited for GPUs starts: its summary cleared, its deadline `deadline_at`.
    pub async fn start_after_wait(&self, run_id: &str, deadline_at: i64) -> Result<()> {
        let mut tx = self.begin().await?;
        let done =
            sqlx::query("UPDATE runs SET summary = '', deadline_at = $1 WHERE run_id = $2 AND state = 'Checking'")
                .bind(deadline_at)
                .bind(run_id)
                .execute(&mut *tx)
                .await?;
        transition_if(&mut tx, done.rows_affected(), run_id, "Checking", "its GPUs are free: started").await?;
        tx.commit().await?;
        Ok(())
    }

    /// A run's transitions as (state, detail, at ms), in order.
    pub async fn transitions(&self, run_id: &str) -> Result<Vec<(String, String, i64)>> {
        let rows: Vec<TransitionRow> =
            sqlx::query_as("SELECT state, detail, at FROM transitions WHERE run_id = $1 ORDER BY id")
                .bind(run_id)
                .fetch_all(&self.pool)
                .await?;
        Ok(rows.into_iter().map(|t| (t.state, t.detail, t.at)).collect())
    }
}

/// One row of `transitions`.
#[derive(sqlx::FromRow)]
struct TransitionRow {
    state: String,
    detail: String,
    at: i64,
}
