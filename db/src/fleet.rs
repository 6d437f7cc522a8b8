//! The fleet's samples: each passed rank's headline figure, appended when its run ends, and
//! the newest window of each key, read to learn its baseline (`gpusanity_common::fleet`).

use gpusanity_common::fleet::samples::Learnable;
use gpusanity_common::fleet::{Key, Sample};

use crate::bulk::{values, wide_chunk};
use crate::{now_ms, Db, Result, Tx};

#[derive(sqlx::FromRow)]
struct KeyRow {
    fkey: String,
}

#[derive(sqlx::FromRow)]
struct SampleRow {
    node_name: String,
    value: f64,
}

#[derive(sqlx::FromRow)]
struct NodeRow {
    fkey: String,
    value: f64,
    at: i64,
    run_id: String,
}

/// One of a node's figures: its key, the figure, when it was learned and from which run.
#[derive(Debug, Clone)]
pub struct NodeSample {
    pub key: Key,
    pub value: f64,
    pub at: i64,
    pub run_id: String,
}

#[derive(sqlx::FromRow)]
struct MeanRow {
    node_name: String,
    mean: f64,
    n: i64,
}

/// A node's mean figure of one key over the figures read (see [`Db::fleet_lowest_nodes`]).
#[derive(Debug, Clone, PartialEq)]
pub struct NodeMean {
    pub node: String,
    pub mean: f64,
    pub samples: usize,
}

#[derive(sqlx::FromRow)]
struct CountRow {
    n: i64,
}

/// Appends `samples` of run `run_id` in the caller's transaction, [`wide_chunk`] rows a statement;
/// a (run, rank, key) already stored is left as it is.
pub async fn add_samples(tx: &mut Tx, run_id: &str, samples: &[Learnable]) -> Result<()> {
    let at = now_ms();
    let keys = samples.iter().map(|s| serde_json::to_string(&s.key)).collect::<serde_json::Result<Vec<_>>>()?;
    for (chunk, keys) in samples.chunks(wide_chunk(6)).zip(keys.chunks(wide_chunk(6))) {
        let sql = format!(
            "INSERT INTO fleet_samples (run_id, rank, fkey, node_name, value, at) VALUES {} \
             ON CONFLICT (run_id, rank, fkey) DO NOTHING",
            values(chunk.len(), 6, 1)
        );
        let mut q = sqlx::query(&sql);
        for (s, key) in chunk.iter().zip(keys) {
            q = q
                .bind(run_id)
                .bind(i64::try_from(s.rank).unwrap_or(i64::MAX))
                .bind(key.as_str())
                .bind(s.node.as_str())
                .bind(s.value)
                .bind(at);
        }
        q.execute(&mut **tx).await?;
    }
    Ok(())
}

impl Db {
    /// Every key with samples. A stored key that no longer parses (an older format) is skipped.
    pub async fn fleet_keys(&self) -> Result<Vec<Key>> {
        let rows: Vec<KeyRow> =
            sqlx::query_as("SELECT DISTINCT fkey FROM fleet_samples ORDER BY fkey").fetch_all(&self.pool).await?;
        Ok(rows.into_iter().filter_map(|r| serde_json::from_str(&r.fkey).ok()).collect())
    }

    /// The newest `window` samples of `key`, newest first.
    pub async fn fleet_window(&self, key: &Key, window: usize) -> Result<Vec<Sample>> {
        let rows: Vec<SampleRow> = sqlx::query_as(
            "SELECT node_name, value FROM fleet_samples WHERE fkey = $1 ORDER BY at DESC, run_id DESC, rank DESC LIMIT $2",
        )
        .bind(serde_json::to_string(key)?)
        .bind(i64::try_from(window).unwrap_or(i64::MAX))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| Sample { node: r.node_name, value: r.value }).collect())
    }

    /// Each node's newest sample of `key` learned at or after `since` (ms), in no order.
    pub async fn fleet_last_per_node(&self, key: &Key, since: i64) -> Result<Vec<Sample>> {
        let rows: Vec<SampleRow> = sqlx::query_as(
            "SELECT node_name, value FROM (SELECT node_name, value, ROW_NUMBER() OVER \
             (PARTITION BY node_name ORDER BY at DESC, run_id DESC, rank DESC) AS rn \
             FROM fleet_samples WHERE fkey = $1 AND at >= $2) t WHERE rn = 1",
        )
        .bind(serde_json::to_string(key)?)
        .bind(since)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|r| Sample { node: r.node_name, value: r.value }).collect())
    }

    /// The `limit` nodes whose mean figure of `key` is lowest, lowest first, over the key's
    /// figures learned at or after `since` (ms): the whole fleet's recent figures, not only the
    /// baseline's window, so that a slow node whose figures are older than the newest few
    /// hundred is still listed. One pass over the key's range of the covering index
    /// `fleet_samples_key_node` (fkey, node_name, at, value), in node order, grouped in the
    /// database: only `limit` rows come back, and the cost is linear in the key's figures since
    /// `since` (docs/fleet.md). A mean, not a median: neither SQLite nor a portable query has a
    /// median aggregate, and learned figures have no outliers to resist (a rank a finding named
    /// is never learned).
    pub async fn fleet_lowest_nodes(&self, key: &Key, since: i64, limit: u32) -> Result<Vec<NodeMean>> {
        let rows: Vec<MeanRow> = sqlx::query_as(
            "SELECT node_name, AVG(value) AS mean, COUNT(*) AS n FROM fleet_samples WHERE fkey = $1 AND at >= $2 \
             GROUP BY node_name ORDER BY mean ASC, node_name ASC LIMIT $3",
        )
        .bind(serde_json::to_string(key)?)
        .bind(since)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|r| NodeMean { node: r.node_name, mean: r.mean, samples: usize::try_from(r.n).unwrap_or(0) })
            .collect())
    }

    /// The newest `limit` figures of `node` over every key, newest first; `workspace`: only
    /// those of that workspace's runs. A stored key that no longer parses is skipped.
    pub async fn node_samples(&self, node: &str, workspace: Option<&str>, limit: u32) -> Result<Vec<NodeSample>> {
        let rows: Vec<NodeRow> = sqlx::query_as(
            "SELECT fkey, value, at, run_id FROM fleet_samples f WHERE node_name = $1 AND ($3 = '' OR EXISTS \
             (SELECT 1 FROM runs r WHERE r.run_id = f.run_id AND r.workspace_id = $3)) \
             ORDER BY at DESC, run_id DESC, rank DESC LIMIT $2",
        )
        .bind(node)
        .bind(i64::from(limit))
        .bind(workspace.unwrap_or(""))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .filter_map(|r| {
                let key = serde_json::from_str(&r.fkey).ok()?;
                Some(NodeSample { key, value: r.value, at: r.at, run_id: r.run_id })
            })
            .collect())
    }

    /// How many samples are stored, over every key.
    pub async fn fleet_sample_count(&self) -> Result<i64> {
        let row: CountRow = sqlx::query_as("SELECT COUNT(*) AS n FROM fleet_samples").fetch_one(&self.pool).await?;
        Ok(row.n)
    }
}
