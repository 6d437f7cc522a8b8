//! A node's reputation (its runs and failures over its last runs), the re-check runs made
//! before isolating it, and every isolation decision with its reason (docs/fleet.md).
//! Only a job's own runs count towards a node's record: a re-check (`runs.recheck_of`) is the
//! evidence of a decision, not a run of its own.

use std::fmt;
use std::str::FromStr;

use gpusanity_common::findings::Code;
use gpusanity_common::wire::output::IsolationBasis;
use serde::Serialize;

use crate::column::{code_list, CodeList, Flag, Parsed};
use crate::rows::RunRow;
use crate::runs::insert_run;
use crate::{now_ms, Db, Result, Tx};

/// What was decided about a node (`node_decisions.decision`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Decided {
    /// NodeIsolated was published.
    Isolated,
    /// A re-check run was made; the node is isolated only when it fails.
    Rechecking,
    /// The re-check passed: not isolated.
    Cleared,
}

impl Decided {
    pub const ALL: [Decided; 3] = [Decided::Isolated, Decided::Rechecking, Decided::Cleared];

    pub fn as_str(self) -> &'static str {
        match self {
            Decided::Isolated => "isolated",
            Decided::Rechecking => "rechecking",
            Decided::Cleared => "cleared",
        }
    }
}

/// On what ground a decision was taken (`node_decisions.basis`): an isolation's
/// [`IsolationBasis`], or the two grounds of a re-check's start and pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    Definitive,
    Quarantine,
    Reproduced,
    Immediate,
    /// A re-check run was made before isolating.
    Recheck,
    /// The re-check passed.
    RecheckPassed,
}

impl Basis {
    pub const ALL: [Basis; 6] = [
        Basis::Definitive,
        Basis::Quarantine,
        Basis::Reproduced,
        Basis::Immediate,
        Basis::Recheck,
        Basis::RecheckPassed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Basis::Definitive => "definitive",
            Basis::Quarantine => "quarantine",
            Basis::Reproduced => "reproduced",
            Basis::Immediate => "immediate",
            Basis::Recheck => "recheck",
            Basis::RecheckPassed => "recheck_passed",
        }
    }
}

impl From<IsolationBasis> for Basis {
    fn from(b: IsolationBasis) -> Basis {
        match b {
            IsolationBasis::Definitive => Basis::Definitive,
            IsolationBasis::Quarantine => Basis::Quarantine,
            IsolationBasis::Reproduced => Basis::Reproduced,
            IsolationBasis::Immediate => Basis::Immediate,
        }
    }
}

/// A stored name that is not one of the set's: named in the error.
#[derive(Debug, thiserror::Error)]
#[error("unknown value `{0}`")]
pub struct UnknownName(String);

/// `FromStr` (by `as_str` over `ALL`), `Display`, and the [`Parsed`] column conversion of a
/// stored closed set.
macro_rules! stored_name {
    ($t:ident) => {
        impl FromStr for $t {
            type Err = UnknownName;

            fn from_str(s: &str) -> std::result::Result<$t, UnknownName> {
                $t::ALL.into_iter().find(|v| v.as_str() == s).ok_or_else(|| UnknownName(s.to_string()))
            }
        }

        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl From<Parsed<$t>> for $t {
            fn from(p: Parsed<$t>) -> $t {
                p.0
            }
        }
    };
}

stored_name!(Decided);
stored_name!(Basis);

/// One decision about a node, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct NodeDecision {
    pub node_name: String,
    /// The run whose end decided (for a re-check's outcome: the re-check run).
    pub run_id: String,
    #[sqlx(try_from = "Parsed<Decided>")]
    pub decision: Decided,
    #[sqlx(try_from = "Parsed<Basis>")]
    pub basis: Basis,
    pub reason: String,
    #[sqlx(try_from = "CodeList")]
    #[schema(value_type = Vec<String>)]
    pub codes: Vec<Code>,
    pub recheck_run: Option<String>,
    pub at: i64,
}

/// A node's record over its last `window` runs.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Reputation {
    pub window: i64,
    pub runs: i64,
    pub failures: i64,
    /// Critical findings over those runs, by code and check, most frequent first.
    pub by_code: Vec<CodeCount>,
}

#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema, sqlx::FromRow)]
pub struct CodeCount {
    #[sqlx(try_from = "Parsed<Code>")]
    #[schema(value_type = String)]
    pub code: Code,
    pub check_name: String,
    pub n: i64,
}

#[derive(sqlx::FromRow)]
struct Healthy {
    #[sqlx(try_from = "Flag")]
    healthy: bool,
}

#[derive(sqlx::FromRow)]
struct NodeCount {
    node_name: String,
    n: i64,
}

#[derive(sqlx::FromRow)]
struct Origin {
    recheck_of: Option<String>,
}

/// The node's job runs (re-checks left out), newest first, at most `$2`, of workspace `$3`
/// (empty: every workspace).
const RECENT: &str = "SELECT h.run_id FROM node_health h JOIN runs r ON r.run_id = h.run_id \
     WHERE h.node_name = $1 AND r.recheck_of IS NULL AND ($3 = '' OR r.workspace_id = $3) \
     ORDER BY h.at DESC, h.id DESC LIMIT $2";

/// Whether each of the node's last `n` job runs was healthy, newest first (in the caller's
/// transaction: the run being ended counts once its results are stored).
pub async fn recent_outcomes(tx: &mut Tx, node: &str, n: u32) -> Result<Vec<bool>> {
    let rows: Vec<Healthy> = sqlx::query_as(
        "SELECT h.healthy AS healthy FROM node_health h JOIN runs r ON r.run_id = h.run_id \
         WHERE h.node_name = $1 AND r.recheck_of IS NULL ORDER BY h.at DESC, h.id DESC LIMIT $2",
    )
    .bind(node)
    .bind(i64::from(n))
    .fetch_all(&mut **tx)
    .await?;
    Ok(rows.into_iter().map(|r| r.healthy).collect())
}

/// The run that run `run_id` re-checks (None: a job's own run, or no such run).
pub async fn recheck_of(tx: &mut Tx, run_id: &str) -> Result<Option<String>> {
    let row: Option<Origin> =
        sqlx::query_as("SELECT recheck_of FROM runs WHERE run_id = $1").bind(run_id).fetch_optional(&mut **tx).await?;
    Ok(row.and_then(|r| r.recheck_of))
}

/// Stores `run`, a re-check of run `origin`, in `Checking` with no owner: the replica holding
/// `origin`'s job-events partition claims it at its next lease round, like a run left over.
pub async fn insert_recheck(tx: &mut Tx, run: &RunRow, origin: &str) -> Result<()> {
    insert_run(tx, run).await?;
    sqlx::query(
        "UPDATE runs SET recheck_of = $1, lease_until = 0, \
         kpartition = (SELECT o.kpartition FROM runs o WHERE o.run_id = $1) WHERE run_id = $2",
    )
    .bind(origin)
    .bind(&run.run_id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records a decision about a node in the caller's transaction.
pub async fn record_decision(tx: &mut Tx, d: &NodeDecision) -> Result<()> {
    sqlx::query(
        "INSERT INTO node_decisions (node_name, run_id, decision, basis, reason, codes, recheck_run, at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
    )
    .bind(&d.node_name)
    .bind(&d.run_id)
    .bind(d.decision.as_str())
    .bind(d.basis.as_str())
    .bind(&d.reason)
    .bind(code_list(&d.codes))
    .bind(&d.recheck_run)
    .bind(if d.at > 0 { d.at } else { now_ms() })
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Db {
    /// The node's decisions, newest first, at most `limit`; `workspace`: only those of that
    /// workspace's runs.
    pub async fn node_decisions(&self, node: &str, workspace: Option<&str>, limit: i64) -> Result<Vec<NodeDecision>> {
        Ok(sqlx::query_as(
            "SELECT d.node_name AS node_name, d.run_id AS run_id, d.decision AS decision, d.basis AS basis, \
             d.reason AS reason, d.codes AS codes, d.recheck_run AS recheck_run, d.at AS at \
             FROM node_decisions d LEFT JOIN runs r ON r.run_id = d.run_id \
             WHERE d.node_name = $1 AND ($2 = '' OR r.workspace_id = $2) ORDER BY d.at DESC, d.id DESC LIMIT $3",
        )
        .bind(node)
        .bind(workspace.unwrap_or(""))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The nodes with failed job runs since `since_ms`, most failures first, at most `cap`
    /// (bounded for the metrics' labels), and how many such nodes there are in all.
    pub async fn failing_nodes(&self, since_ms: i64, cap: i64) -> Result<(Vec<(String, i64)>, i64)> {
        const FAILED: &str = "FROM node_health h JOIN runs r ON r.run_id = h.run_id \
             WHERE h.healthy = 0 AND h.at >= $1 AND r.recheck_of IS NULL";
        let rows: Vec<NodeCount> = sqlx::query_as(&format!(
            "SELECT h.node_name AS node_name, COUNT(*) AS n {FAILED} GROUP BY h.node_name ORDER BY n DESC, node_name LIMIT $2"
        ))
        .bind(since_ms)
        .bind(cap)
        .fetch_all(&self.pool)
        .await?;
        let total: i64 = sqlx::query_scalar(&format!("SELECT COUNT(DISTINCT h.node_name) {FAILED}"))
            .bind(since_ms)
            .fetch_one(&self.pool)
            .await?;
        Ok((rows.into_iter().map(|r| (r.node_name, r.n)).collect(), total))
    }

    /// The node's record over its last `window` job runs (`workspace`: of that workspace's).
    pub async fn reputation(&self, node: &str, workspace: Option<&str>, window: u32) -> Result<Reputation> {
        let ws = workspace.unwrap_or("");
        let mut tx = self.begin().await?;
        let outcomes: Vec<Healthy> =
            sqlx::query_as(&format!("SELECT healthy FROM node_health WHERE node_name = $1 AND run_id IN ({RECENT})"))
                .bind(node)
                .bind(i64::from(window))
                .bind(ws)
                .fetch_all(&mut *tx)
                .await?;
        let by_code: Vec<CodeCount> = sqlx::query_as(&format!(
            "SELECT code, check_name, COUNT(*) AS n FROM findings \
             WHERE node_name = $1 AND severity = 'critical' AND run_id IN ({RECENT}) \
             GROUP BY code, check_name ORDER BY n DESC, code, check_name"
        ))
        .bind(node)
        .bind(i64::from(window))
        .bind(ws)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        let failures = outcomes.iter().filter(|h| !h.healthy).count();
        Ok(Reputation {
            window: i64::from(window),
            runs: i64::try_from(outcomes.len()).unwrap_or(i64::MAX),
            failures: i64::try_from(failures).unwrap_or(i64::MAX),
            by_code,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn db() -> (tempfile::TempDir, Db) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("r.db").display())).await.unwrap();
        (dir, db)
    }

    async fn store(db: &Db, decision: &str, basis: &str, codes: &str) {
        sqlx::query(
            "INSERT INTO node_decisions (node_name, run_id, decision, basis, reason, codes, recheck_run, at) \
             VALUES ('n1', 'r1', $1, $2, 'why', $3, NULL, 1)",
        )
        .bind(decision)
        .bind(basis)
        .bind(codes)
        .execute(&db.pool)
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_decision_reads_back_typed() {
        let (_dir, db) = db().await;
        let d = NodeDecision {
            node_name: "n1".into(),
            run_id: "r1".into(),
            decision: Decided::Isolated,
            basis: Basis::Definitive,
            reason: "why".into(),
            codes: vec![Code::GemmWrongResult, Code::AgentLost],
            recheck_run: None,
            at: 5,
        };
        let mut tx = db.begin().await.unwrap();
        record_decision(&mut tx, &d).await.unwrap();
        tx.commit().await.unwrap();
        assert_eq!(db.node_decisions("n1", None, 10).await.unwrap(), [d]);
        for b in Basis::ALL {
            assert_eq!(b.as_str().parse::<Basis>().unwrap(), b);
            assert_eq!(serde_json::to_value(b).unwrap(), b.as_str());
        }
        for d in Decided::ALL {
            assert_eq!(d.as_str().parse::<Decided>().unwrap(), d);
            assert_eq!(serde_json::to_value(d).unwrap(), d.as_str());
        }
    }

    #[tokio::test]
    async fn a_malformed_stored_decision_is_refused_naming_the_column_and_the_value() {
        for (decision, basis, codes, column, value) in [
            ("isolated", "by_hand", "GEMM_SLOW", "basis", "by_hand"),
            ("drained", "definitive", "GEMM_SLOW", "decision", "drained"),
            ("isolated", "definitive", "GEMM_SLOW,NOT_A_CODE", "codes", "NOT_A_CODE"),
        ] {
            let (_dir, db) = db().await;
            store(&db, decision, basis, codes).await;
            let e = db.node_decisions("n1", None, 10).await.unwrap_err();
            let text = e.to_string();
            assert!(text.contains(column) && text.contains(&format!("`{value}`")), "{text}");
            assert!(e.is_poison(), "{e:?}");
        }
    }
}
