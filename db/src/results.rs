//! A finished run's evidence as rows: per-rank results, findings, and one node-health entry per
//! node of the run.

use gpusanity_common::report::{Finding, Report, Severity};
use gpusanity_common::wire::job::JobNode;

use crate::{now_ms, Result, Tx};

/// The name of the node a finding points at: its `node_rank` in the run's node list.
pub fn finding_node<'a>(f: &Finding, nodes: &'a [JobNode]) -> Option<&'a str> {
    f.node_rank.and_then(|k| nodes.get(k)).map(|n| n.name.as_str())
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
        for check in &report.checks {
            for r in &check.ranks {
                let info = report.ranks.iter().find(|i| i.rank == r.rank);
                sqlx::query(
                    "INSERT INTO rank_results (run_id, check_name, rank, node_rank, host, status, metrics, error) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                )
                .bind(run_id)
                .bind(check.name.as_str())
                .bind(r.rank as i64)
                .bind(info.map(|i| i.node_rank as i64))
                .bind(info.map(|i| i.host.clone()))
                .bind(serde_json::to_value(r.status)?.as_str().unwrap_or_default().to_string())
                .bind(serde_json::to_string(&r.metrics)?)
                .bind(&r.error)
                .execute(&mut **tx)
                .await?;
            }
        }
    }
    for f in findings {
        sqlx::query(
            "INSERT INTO findings (run_id, severity, code, check_name, node_name, rank, message, detail) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(run_id)
        .bind(serde_json::to_value(f.severity)?.as_str().unwrap_or_default().to_string())
        .bind(f.code.as_str())
        .bind(f.check.as_str())
        .bind(finding_node(f, nodes).map(str::to_string))
        .bind(f.rank.map(|r| r as i64))
        .bind(&f.message)
        .bind(serde_json::to_string(f)?)
        .execute(&mut **tx)
        .await?;
    }
    let now = now_ms();
    for (k, node) in nodes.iter().enumerate() {
        let codes: Vec<&str> = findings
            .iter()
            .filter(|f| f.severity == Severity::Critical && f.node_rank == Some(k))
            .map(|f| f.code.as_str())
            .collect();
        sqlx::query(
            "INSERT INTO node_health (node_name, run_id, job_id, healthy, codes, at) VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(&node.name)
        .bind(run_id)
        .bind(job_id)
        .bind(i64::from(codes.is_empty()))
        .bind(codes.join(","))
        .bind(now)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}
