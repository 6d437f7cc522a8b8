//! Read-only queries of the report browser: runs by filter (paged, newest first), a run's
//! findings, a node's health history. Every filter value is a bound parameter.

use std::collections::HashMap;

use gpusanity_common::wire::job::JobNode;
use serde::Serialize;

use gpusanity_common::findings::Code;

use crate::column::{CodeList, Flag, JsonText};
use crate::{Db, DbBackend, Result};

/// Which runs to list. Empty fields do not filter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    pub workspace: Option<String>,
    pub job: Option<String>,
    /// A state's name as stored (`Checking`, `CheckPassed`, `CheckFailed`, `CheckCancelled`).
    pub state: Option<String>,
    /// Runs whose job had this node.
    pub node: Option<String>,
    /// Runs created at or after this time (Unix ms).
    pub from_ms: Option<i64>,
    /// Runs created before this time (Unix ms).
    pub to_ms: Option<i64>,
    pub limit: i64,
    pub offset: i64,
}

/// One row of the runs list.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct RunListRow {
    pub run_id: String,
    pub job_id: String,
    pub workspace_id: String,
    pub state: String,
    #[sqlx(try_from = "Flag")]
    pub held: bool,
    /// The names of the job's nodes.
    #[sqlx(try_from = "JsonText<Vec<JobNode>>")]
    pub nodes: Vec<String>,
    /// Nodes whose health entry of this run is not healthy.
    #[sqlx(skip)]
    pub faulty_nodes: Vec<String>,
    pub created_at: i64,
    pub finished_at: Option<i64>,
    pub summary: String,
}

/// The names of the nodes of a stored node list (`runs.nodes`).
impl From<JsonText<Vec<JobNode>>> for Vec<String> {
    fn from(nodes: JsonText<Vec<JobNode>>) -> Self {
        nodes.0.into_iter().map(|n| n.name).collect()
    }
}

/// One node's entry of one ended run.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct NodeHealthRow {
    pub run_id: String,
    pub job_id: String,
    pub workspace_id: String,
    pub state: String,
    #[sqlx(try_from = "Flag")]
    pub healthy: bool,
    /// The codes of the node's critical findings in that run.
    #[sqlx(try_from = "CodeList")]
    #[schema(value_type = Vec<String>)]
    pub codes: Vec<Code>,
    pub at: i64,
}

/// A finding as the service stored it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct FindingRow {
    pub severity: String,
    pub code: String,
    pub check_name: String,
    pub node_name: Option<String>,
    pub rank: Option<i64>,
    pub message: String,
}

/// The WHERE clause of `f` with its parameters in order (`$1`, `$2`, ...).
fn where_clause(backend: DbBackend, f: &RunFilter) -> (String, Vec<Param>) {
    let mut conds: Vec<String> = Vec::new();
    let mut params: Vec<Param> = Vec::new();
    let mut add = |cond: &str, p: Param| {
        params.push(p);
        conds.push(cond.replace('?', &format!("${}", params.len())));
    };
    if let Some(v) = &f.workspace {
        add("workspace_id = ?", Param::Text(v.clone()));
    }
    if let Some(v) = &f.job {
        add("job_id = ?", Param::Text(v.clone()));
    }
    if let Some(v) = &f.state {
        add("state = ?", Param::Text(v.clone()));
    }
    if let Some(v) = &f.node {
        // A run that ended passed or failed has a health entry per node (indexed by node); the
        // others (checking, cancelled) are found in `nodes`, the JSON list of the job's nodes.
        let json = match backend {
            DbBackend::Sqlite => {
                "EXISTS (SELECT 1 FROM json_each(runs.nodes) n WHERE json_extract(n.value, '$.name') = ?)"
            }
            DbBackend::Postgres => {
                "EXISTS (SELECT 1 FROM jsonb_array_elements(CAST(runs.nodes AS jsonb)) n WHERE n->>'name' = ?)"
            }
        };
        let cond =
            format!("(run_id IN (SELECT h.run_id FROM node_health h WHERE h.node_name = ?) OR (state NOT IN ('CheckPassed', 'CheckFailed') AND {json}))");
        let cond = cond.as_str();
        add(cond, Param::Text(v.clone()));
    }
    if let Some(v) = f.from_ms {
        add("created_at >= ?", Param::Int(v));
    }
    if let Some(v) = f.to_ms {
        add("created_at < ?", Param::Int(v));
    }
    let clause = if conds.is_empty() { String::new() } else { format!(" WHERE {}", conds.join(" AND ")) };
    (clause, params)
}

#[derive(Debug, Clone)]
enum Param {
    Text(String),
    Int(i64),
}

type Args<'q> = sqlx::any::AnyArguments<'q>;

fn bind_all<'q, O>(
    mut q: sqlx::query::QueryAs<'q, sqlx::Any, O, Args<'q>>,
    params: &[Param],
) -> sqlx::query::QueryAs<'q, sqlx::Any, O, Args<'q>> {
    for p in params {
        q = match p {
            Param::Text(s) => q.bind(s.clone()),
            Param::Int(i) => q.bind(*i),
        };
    }
    q
}

/// A node whose health entry of a run is not healthy.
#[derive(sqlx::FromRow)]
struct UnhealthyNode {
    run_id: String,
    node_name: String,
}

/// A count of matching rows.
#[derive(sqlx::FromRow)]
struct Count {
    total: i64,
}

impl Db {
    /// The runs matching `f`, newest first, one page of them, and how many match in all.
    pub async fn list_runs(&self, f: &RunFilter) -> Result<(Vec<RunListRow>, i64)> {
        let (clause, params) = where_clause(self.backend, f);
        let Count { total } = bind_all(sqlx::query_as(&format!("SELECT COUNT(*) AS total FROM runs{clause}")), &params)
            .fetch_one(&self.pool)
            .await?;
        let n = params.len();
        let sql = format!(
            "SELECT run_id, job_id, workspace_id, state, held, nodes, created_at, finished_at, summary FROM runs{clause} \
             ORDER BY created_at DESC, run_id DESC LIMIT ${} OFFSET ${}",
            n + 1,
            n + 2
        );
        let mut rows: Vec<RunListRow> =
            bind_all(sqlx::query_as(&sql), &params).bind(f.limit).bind(f.offset).fetch_all(&self.pool).await?;
        let ids: Vec<String> = rows.iter().map(|r| r.run_id.clone()).collect();
        let mut faulty = self.unhealthy_nodes(&ids).await?;
        for r in &mut rows {
            r.faulty_nodes = faulty.remove(&r.run_id).unwrap_or_default();
        }
        Ok((rows, total))
    }

    /// The nodes of each run in `run_ids` whose health entry is not healthy, in node order.
    async fn unhealthy_nodes(&self, run_ids: &[String]) -> Result<HashMap<String, Vec<String>>> {
        let mut out: HashMap<String, Vec<String>> = HashMap::new();
        if run_ids.is_empty() {
            return Ok(out);
        }
        let marks: Vec<String> = (1..=run_ids.len()).map(|i| format!("${i}")).collect();
        let sql = format!(
            "SELECT run_id, node_name FROM node_health WHERE healthy = 0 AND run_id IN ({}) ORDER BY id",
            marks.join(", ")
        );
        let mut q = sqlx::query_as::<_, UnhealthyNode>(&sql);
        for id in run_ids {
            q = q.bind(id);
        }
        for r in q.fetch_all(&self.pool).await? {
            out.entry(r.run_id).or_default().push(r.node_name);
        }
        Ok(out)
    }

    /// A run's findings as stored, in order.
    pub async fn run_findings(&self, run_id: &str) -> Result<Vec<FindingRow>> {
        Ok(sqlx::query_as(
            "SELECT severity, code, check_name, node_name, rank, message FROM findings WHERE run_id = $1 ORDER BY id",
        )
        .bind(run_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// A node's entries, newest first, one page of them, and how many there are in all;
    /// `workspace`: only the entries of that workspace's runs.
    pub async fn node_history(
        &self,
        node: &str,
        workspace: Option<&str>,
        limit: i64,
        offset: i64,
    ) -> Result<(Vec<NodeHealthRow>, i64)> {
        // An empty workspace is no filter (no run has an empty workspace id).
        let ws = workspace.unwrap_or("");
        let Count { total } = sqlx::query_as(
            "SELECT COUNT(*) AS total FROM node_health h LEFT JOIN runs r ON r.run_id = h.run_id \
             WHERE h.node_name = $1 AND ($2 = '' OR r.workspace_id = $2)",
        )
        .bind(node)
        .bind(ws)
        .fetch_one(&self.pool)
        .await?;
        let history = sqlx::query_as(
            "SELECT h.run_id AS run_id, h.job_id AS job_id, COALESCE(r.workspace_id, '') AS workspace_id, \
             COALESCE(r.state, '') AS state, h.healthy AS healthy, h.codes AS codes, h.at AS at \
             FROM node_health h LEFT JOIN runs r ON r.run_id = h.run_id \
             WHERE h.node_name = $1 AND ($2 = '' OR r.workspace_id = $2) \
             ORDER BY h.at DESC, h.id DESC LIMIT $3 OFFSET $4",
        )
        .bind(node)
        .bind(ws)
        .bind(limit)
        .bind(offset)
        .fetch_all(&self.pool)
        .await?;
        Ok((history, total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rows::{RunRow, ServiceRunState};
    use crate::runs::insert_run;
    use gpusanity_common::wire::job::JobNode;

    fn run(id: &str, job: &str, ws: &str, nodes: &[&str], at: i64) -> RunRow {
        RunRow {
            run_id: id.into(),
            job_id: job.into(),
            workspace_id: ws.into(),
            attempt: 0,
            cause_event_id: format!("ev-{id}"),
            nodes: nodes
                .iter()
                .map(|n| JobNode { name: n.to_string(), address: "127.0.0.1".into(), gpus: 1, gpu_ids: Vec::new() })
                .collect(),
            check_args: String::new(),
            settings: serde_json::json!({}),
            state: ServiceRunState::Checking,
            held: false,
            created_at: at,
            deadline_at: at + 1000,
            finished_at: None,
            summary: String::new(),
        }
    }

    #[tokio::test]
    async fn filters_page_and_node_names_are_exact() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("b.db").display())).await.unwrap();
        let mut tx = db.begin().await.unwrap();
        insert_run(&mut tx, &run("r1", "j1", "ws-a", &["n1", "n2"], 1000)).await.unwrap();
        insert_run(&mut tx, &run("r2", "j2", "ws-b", &["n2"], 2000)).await.unwrap();
        insert_run(&mut tx, &run("r3", "j1", "ws-a", &["n%"], 3000)).await.unwrap();
        // r2 ended passed: found by node through its health entry.
        sqlx::query("UPDATE runs SET state = 'CheckPassed' WHERE run_id = 'r2'").execute(&mut *tx).await.unwrap();
        for (run, node, healthy) in [("r1", "n1", 1), ("r1", "n2", 0), ("r2", "n2", 1)] {
            sqlx::query("INSERT INTO node_health (node_name, run_id, job_id, healthy, codes, at) VALUES ($1, $2, 'j1', $3, '', 1)")
                .bind(node)
                .bind(run)
                .bind(healthy as i64)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        let ids = |rows: Vec<RunListRow>| rows.into_iter().map(|r| r.run_id).collect::<Vec<_>>();
        let all = RunFilter { limit: 10, ..Default::default() };
        let (rows, total) = db.list_runs(&all).await.unwrap();
        let faulty: Vec<Vec<String>> = rows.iter().map(|r| r.faulty_nodes.clone()).collect();
        assert_eq!(faulty, [vec![], vec![], vec!["n2".to_string()]]);
        assert_eq!((ids(rows), total), (vec!["r3".to_string(), "r2".into(), "r1".into()], 3));
        let (rows, total) = db.list_runs(&RunFilter { limit: 1, offset: 1, ..all.clone() }).await.unwrap();
        assert_eq!((ids(rows), total), (vec!["r2".to_string()], 3));
        let f = RunFilter { node: Some("n2".into()), ..all.clone() };
        assert_eq!(ids(db.list_runs(&f).await.unwrap().0), ["r2", "r1"]);
        // A LIKE wildcard or a different case is no match: the comparison is exact.
        let f = RunFilter { node: Some("N2".into()), ..all.clone() };
        assert!(db.list_runs(&f).await.unwrap().0.is_empty());
        let f = RunFilter { node: Some("n%".into()), ..all.clone() };
        assert_eq!(ids(db.list_runs(&f).await.unwrap().0), ["r3"]);
        let f = RunFilter { workspace: Some("ws-a".into()), from_ms: Some(1000), to_ms: Some(3000), ..all.clone() };
        assert_eq!(ids(db.list_runs(&f).await.unwrap().0), ["r1"]);
        let f = RunFilter { job: Some("j1' OR '1'='1".into()), ..all.clone() };
        assert_eq!(db.list_runs(&f).await.unwrap().1, 0);
        let f = RunFilter { state: Some("CheckFailed".into()), ..all.clone() };
        assert_eq!(db.list_runs(&f).await.unwrap().1, 0);
        let f = RunFilter { state: Some("CheckPassed".into()), node: Some("n2".into()), ..all };
        assert_eq!(ids(db.list_runs(&f).await.unwrap().0), ["r2"]);
        let (history, total) = db.node_history("n2", None, 10, 0).await.unwrap();
        assert_eq!((history.len(), total, history[1].healthy, history[1].workspace_id.as_str()), (2, 2, false, "ws-a"));
        let (mine, n) = db.node_history("n2", Some("ws-a"), 10, 0).await.unwrap();
        assert!(n >= 1 && mine.iter().all(|h| h.workspace_id == "ws-a"), "{mine:?}");
        assert_eq!(db.node_history("n2", Some("ws-none"), 10, 0).await.unwrap().1, 0);
    }
}
