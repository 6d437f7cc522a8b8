//! A finished run's evidence as rows: per-rank results, findings, and one node-health entry per
//! node of the run. Each kind is written in multi-row statements ([`wide_chunk`] rows each): a
//! report of 16,384 ranks brings about 50,000 rank results, and one statement per row made the
//! take-in grow with the rows' round trips.

use std::collections::HashMap;

use gpusanity_common::report::{Finding, Report, Severity};
use gpusanity_common::wire::job::JobNode;

use crate::bulk::{values, wide_chunk};
use crate::{now_ms, Result, Tx};

/// The name of the node a finding points at: its `node_rank` in the run's node list.
pub fn finding_node<'a>(f: &Finding, nodes: &'a [JobNode]) -> Option<&'a str> {
    f.node_rank.and_then(|k| nodes.get(k)).map(|n| n.name.as_str())
}

/// One row of `rank_results`.
struct RankRow<'a> {
    check: &'static str,
    rank: i64,
    node_rank: Option<i64>,
    host: Option<&'a str>,
    status: String,
    metrics: String,
    error: &'a Option<String>,
}

/// One row of `findings`.
struct FindingRow<'a> {
    severity: String,
    code: &'static str,
    check: String,
    node: Option<&'a str>,
    rank: Option<i64>,
    message: &'a str,
    detail: String,
}

/// A serde enum's wire name (`"passed"`, `"critical"`), as the columns store it.
fn wire_name<T: serde::Serialize>(v: &T) -> Result<String> {
    Ok(serde_json::to_value(v)?.as_str().unwrap_or_default().to_string())
}

/// A count or index as the databases' integer.
fn int(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Stores the report's rank results and the findings (the report's and the service's own).
pub async fn store_results(
    tx: &mut Tx,
    run_id: &str,
    job_id: &str,
    nodes: &[JobNode],
    report: Option<&Report>,
    findings: &[Finding],
) -> Result<()> {
    if let Some(report) = report {
        let infos: HashMap<usize, _> = report.ranks.iter().map(|i| (i.rank, i)).collect();
        let mut rows = Vec::new();
        for check in &report.checks {
            for r in &check.ranks {
                let info = infos.get(&r.rank);
                rows.push(RankRow {
                    check: check.name.as_str(),
                    rank: int(r.rank),
                    node_rank: info.map(|i| int(i.node_rank)),
                    host: info.map(|i| i.host.as_str()),
                    status: wire_name(&r.status)?,
                    metrics: serde_json::to_string(&r.metrics)?,
                    error: &r.error,
                });
            }
        }
        insert_rank_results(tx, run_id, &rows).await?;
    }
    let rows = findings
        .iter()
        .map(|f| {
            Ok(FindingRow {
                severity: wire_name(&f.severity)?,
                code: f.code.as_str(),
                check: f.check.as_str().to_string(),
                node: finding_node(f, nodes),
                rank: f.rank.map(int),
                message: &f.message,
                detail: serde_json::to_string(f)?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    insert_findings(tx, run_id, &rows).await?;
    insert_node_health(tx, run_id, job_id, nodes, findings).await
}

async fn insert_rank_results(tx: &mut Tx, run_id: &str, rows: &[RankRow<'_>]) -> Result<()> {
    for chunk in rows.chunks(wide_chunk(8)) {
        let sql = format!(
            "INSERT INTO rank_results (run_id, check_name, rank, node_rank, host, status, metrics, error) VALUES {}",
            values(chunk.len(), 8, 1)
        );
        let mut q = sqlx::query(&sql);
        for r in chunk {
            q = q
                .bind(run_id)
                .bind(r.check)
                .bind(r.rank)
                .bind(r.node_rank)
                .bind(r.host)
                .bind(r.status.as_str())
                .bind(r.metrics.as_str())
                .bind(r.error.as_deref());
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

async fn insert_findings(tx: &mut Tx, run_id: &str, rows: &[FindingRow<'_>]) -> Result<()> {
    for chunk in rows.chunks(wide_chunk(8)) {
        let sql = format!(
            "INSERT INTO findings (run_id, severity, code, check_name, node_name, rank, message, detail) VALUES {}",
            values(chunk.len(), 8, 1)
        );
        let mut q = sqlx::query(&sql);
        for f in chunk {
            q = q
                .bind(run_id)
                .bind(f.severity.as_str())
                .bind(f.code)
                .bind(f.check.as_str())
                .bind(f.node)
                .bind(f.rank)
                .bind(f.message)
                .bind(f.detail.as_str());
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

/// One `node_health` row per node of the run: healthy unless a critical finding names it.
async fn insert_node_health(
    tx: &mut Tx,
    run_id: &str,
    job_id: &str,
    nodes: &[JobNode],
    findings: &[Finding],
) -> Result<()> {
    let mut codes: HashMap<usize, Vec<&str>> = HashMap::new();
    for f in findings.iter().filter(|f| f.severity == Severity::Critical) {
        if let Some(k) = f.node_rank {
            codes.entry(k).or_default().push(f.code.as_str());
        }
    }
    let now = now_ms();
    let rows: Vec<(&str, String)> = nodes
        .iter()
        .enumerate()
        .map(|(k, n)| (n.name.as_str(), codes.get(&k).map(|c| c.join(",")).unwrap_or_default()))
        .collect();
    for chunk in rows.chunks(wide_chunk(6)) {
        let sql = format!(
            "INSERT INTO node_health (node_name, run_id, job_id, healthy, codes, at) VALUES {}",
            values(chunk.len(), 6, 1)
        );
        let mut q = sqlx::query(&sql);
        for (name, codes) in chunk {
            q = q
                .bind(*name)
                .bind(run_id)
                .bind(job_id)
                .bind(i64::from(codes.is_empty()))
                .bind(codes.as_str())
                .bind(now);
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}
