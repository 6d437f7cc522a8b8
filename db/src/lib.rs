//! Persistence of the service through sqlx: SQLite (a file, the default, no setup) or
//! PostgreSQL (by URL), one schema each under `migrations/` at the top of the repository.
//!
//! Tables: jobs, job events (idempotency by event id), runs, state transitions, per-rank
//! results, findings, node health history, the outbox of output events, and the notifier's
//! rules, deliveries and attempts. Every query of the service is here; rows are read by column
//! name (`sqlx::FromRow`, the schema's integer flags and JSON text through [`column`]). Writes
//! that belong together take a [`Tx`] so the caller commits them as one transaction.

pub mod breaker;
pub mod browse;
pub mod bulk;
pub mod column;
pub mod deliveries;
mod fault;
pub mod fleet;
pub mod lease;
pub mod outbox;
pub mod reputation;
pub mod results;
pub mod rows;
pub mod rules;
pub mod runs;
pub mod stats;
pub mod wake;
pub mod watch;

use std::str::FromStr;
use std::sync::Arc;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, ConnectOptions, Executor};
use thiserror::Error;

pub use browse::{FindingRow, NodeHealthRow, RunFilter, RunListRow};
pub use fault::Fault;
pub use outbox::OutboxRow;
pub use rows::{JobRow, RunRow, ServiceRunState};

pub type Tx = sqlx::Transaction<'static, sqlx::Any>;

#[derive(Debug, Error)]
pub enum DbError {
    #[error("database URL `{0}`: expected sqlite://PATH or postgres://...")]
    BadUrl(String),
    #[error("database URL options: {0}")]
    Options(sqlx::Error),
    #[error("database TLS: {0} (check sslmode and sslrootcert in the URL)")]
    Tls(String),
    #[error("the database refused the connection: {0}")]
    Refused(String),
    #[error("database: {0}")]
    Sql(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("stored JSON is malformed: {0}")]
    Json(#[from] serde_json::Error),
}

pub type Result<T> = std::result::Result<T, DbError>;

impl DbError {
    /// Whether the database answered with an error (it refused the statement: a constraint, a
    /// lock, a serialization failure), as opposed to not being reached at all (an outage).
    pub fn answered(&self) -> bool {
        matches!(self, DbError::Sql(sqlx::Error::Database(_)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbBackend {
    Sqlite,
    Postgres,
}

#[derive(Clone)]
pub struct Db {
    /// Private: every query of the service is a function of this crate.
    pub(crate) pool: AnyPool,
    pub backend: DbBackend,
    /// The URL it was opened with (for a connection of its own: [`wake`]).
    url: Arc<str>,
}

static SQLITE: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/sqlite");
static POSTGRES: sqlx::migrate::Migrator = sqlx::migrate!("../migrations/postgres");

impl Db {
    /// Connects (creating a SQLite file when missing) and applies the migrations.
    pub async fn connect(url: &str) -> Result<Db> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            DbBackend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            DbBackend::Postgres
        } else {
            return Err(DbError::BadUrl(url.into()));
        };
        let url = match backend {
            DbBackend::Sqlite if !url.contains('?') => format!("{url}?mode=rwc"),
            _ => url.to_string(),
        };
        // The URL's parameters (sslmode, sslrootcert, sslcert, sslkey...) go to the driver as they are.
        let opts = AnyConnectOptions::from_str(&url).map_err(DbError::Options)?.disable_statement_logging();
        let pool = AnyPoolOptions::new()
            .max_connections(if backend == DbBackend::Sqlite { 4 } else { 8 })
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if backend == DbBackend::Sqlite {
                        // WAL: readers do not block the writer; NORMAL: no fsync per commit
                        // (a power cut may lose the last commits, a process crash loses none).
                        conn.execute("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=10000;")
                            .await?;
                    }
                    Ok(())
                })
            })
            .connect_with(opts)
            .await
            .map_err(connect_error)?;
        match backend {
            DbBackend::Sqlite => SQLITE.run(&pool).await?,
            DbBackend::Postgres => POSTGRES.run(&pool).await?,
        }
        Ok(Db { pool, backend, url: url.into() })
    }

    /// A round trip to the database.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Closes the pool: waits for the connections in use, and every later query fails with
    /// `PoolClosed` (an outage).
    pub async fn close(&self) {
        self.pool.close().await;
    }

    /// A write transaction. On SQLite it takes the write lock at once (`BEGIN IMMEDIATE`): a
    /// deferred transaction that reads first could not upgrade after another writer committed
    /// (SQLITE_BUSY_SNAPSHOT, which no busy timeout retries).
    pub async fn begin(&self) -> Result<Tx> {
        Ok(match self.backend {
            DbBackend::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            DbBackend::Postgres => self.pool.begin().await?,
        })
    }
}

/// A first connection's failure: TLS (a certificate not trusted, a server without TLS) and a
/// refusal by the server (SQLSTATE class 28: pg_hba.conf, a wrong password) are told apart from
/// a database that is not there.
fn connect_error(e: sqlx::Error) -> DbError {
    match e {
        sqlx::Error::Tls(t) => DbError::Tls(t.to_string()),
        sqlx::Error::Io(io) if io.get_ref().is_some_and(|e| e.is::<rustls::Error>()) => DbError::Tls(io.to_string()),
        sqlx::Error::Database(d) if d.code().is_some_and(|c| c.starts_with("28")) => DbError::Refused(d.to_string()),
        e => DbError::Sql(e),
    }
}

/// Now, as the Unix milliseconds every time column holds.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_error_the_database_answered_is_told_from_one_it_could_not_be_reached_for() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::connect(&format!("sqlite://{}", dir.path().join("d.db").display())).await.unwrap();
        let refused = sqlx::query("SELECT * FROM no_such_table").execute(&db.pool).await.map_err(DbError::from);
        assert!(refused.as_ref().is_err_and(DbError::answered), "{refused:?}");
        db.pool.close().await;
        let unreachable = db.ping().await;
        assert!(unreachable.as_ref().is_err_and(|e| !e.answered()), "{unreachable:?}");
    }
}
