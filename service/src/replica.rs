//! `[replica]`: this process's name among the replicas of the service, how long its leases
//! last, and the single-replica rule of SQLite.

use std::fs::File;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ReplicaConfig {
    /// This replica's name, unique among the replicas on one database and the same across its
    /// restarts (a restarted replica takes its own runs back at once). Default: the host name
    /// and the HTTP port, `HOST:PORT`.
    pub id: Option<String>,
    /// How long a replica's hold on a run (and on the outbox publisher) lasts without renewal:
    /// a replica that died has its runs taken over about this long after (plus up to a fifth).
    pub lease_s: f64,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig { id: None, lease_s: 10.0 }
    }
}

/// Replica ids are stored and logged: printable, bounded.
const MAX_ID: usize = 128;

impl ReplicaConfig {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.lease_s.is_finite() && (1.0..=600.0).contains(&self.lease_s)) {
            return Err(format!("replica.lease_s must be between 1 and 600 seconds, got {}", self.lease_s));
        }
        if let Some(id) = &self.id {
            if id.is_empty() || id.len() > MAX_ID || id.chars().any(|c| c.is_control() || c.is_whitespace()) {
                return Err(format!("replica.id must be 1 to {MAX_ID} printable characters without spaces"));
            }
        }
        Ok(())
    }

    pub fn lease(&self) -> Duration {
        Duration::from_secs_f64(self.lease_s)
    }

    /// The id: the configured one, else `HOST:PORT` of `listen`.
    pub fn id(&self, listen: &str) -> String {
        if let Some(id) = &self.id {
            return id.clone();
        }
        let host = nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "localhost".into());
        let port = listen.rsplit(':').next().unwrap_or(listen);
        let mut id = format!("{host}:{port}");
        id.retain(|c| !c.is_control() && !c.is_whitespace());
        id.truncate(MAX_ID);
        id
    }
}

/// Why a second replica may not start on this database.
#[derive(Debug, thiserror::Error)]
pub enum SingleReplica {
    #[error(
        "another `gpusanity serve` uses the SQLite database {0}: SQLite serves one replica; run several on PostgreSQL"
    )]
    Taken(String),
    #[error("cannot open the lock file {0}: {1}")]
    Io(String, std::io::Error),
}

/// On SQLite, an exclusive lock on `DB.replica-lock` for the process's life (the kernel drops
/// it when the process dies, so a crash never leaves it behind); None for PostgreSQL.
pub fn sqlite_lock(url: &str) -> Result<Option<File>, SingleReplica> {
    let Some(rest) = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:")) else {
        return Ok(None);
    };
    let path = rest.split('?').next().unwrap_or(rest);
    if path.is_empty() || path == ":memory:" {
        return Ok(None);
    }
    let lock = PathBuf::from(format!("{path}.replica-lock"));
    let shown = lock.display().to_string();
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .map_err(|e| SingleReplica::Io(shown.clone(), e))?;
    match f.try_lock() {
        Ok(()) => Ok(Some(f)),
        Err(std::fs::TryLockError::WouldBlock) => Err(SingleReplica::Taken(path.to_string())),
        Err(std::fs::TryLockError::Error(e)) => Err(SingleReplica::Io(shown, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_replica_on_one_sqlite_file_is_refused_and_the_lock_goes_with_the_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let url = format!("sqlite://{}?mode=rwc", dir.path().join("g.db").display());
        let first = sqlite_lock(&url).expect("first").expect("a lock");
        assert!(matches!(sqlite_lock(&url), Err(SingleReplica::Taken(_))));
        drop(first);
        assert!(sqlite_lock(&url).expect("again").is_some());
        assert!(sqlite_lock("postgres://u@h/db").expect("pg").is_none());
    }

    #[test]
    fn ids_and_leases_are_bounded() {
        let mut c = ReplicaConfig::default();
        assert!(c.validate().is_ok());
        assert!(c.id("0.0.0.0:8088").ends_with(":8088"));
        c.lease_s = 0.5;
        assert!(c.validate().is_err());
        c.lease_s = 10.0;
        c.id = Some("a b".into());
        assert!(c.validate().is_err());
        c.id = Some("replica-1".into());
        assert_eq!(c.id("x:1"), "replica-1");
    }
}
