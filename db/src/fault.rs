//! What a failed database operation says about the message being handled: the database is
//! away (an outage: retry the same message later), or it refused this message's data (a
//! poison message: retrying cannot help, the message goes to the dead letters). Told apart
//! from the error's type and, for errors the server reports, its SQLSTATE (PostgreSQL) or
//! result code (SQLite), never from its text.

use sqlx::error::{DatabaseError, ErrorKind};
use sqlx::postgres::PgDatabaseError;
use sqlx::sqlite::SqliteError;

use crate::DbError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The database cannot be reached, is shutting down or is overloaded: the message is
    /// fine, handle it again later.
    Outage,
    /// The database refused the data of the message (a data exception, an integrity
    /// violation, a value too large): handling it again fails again.
    Poison,
    /// Anything else (a bug, a schema that does not match): not known to be the message's
    /// fault, so it is handled like an outage (retried, never dead-lettered).
    Other,
}

impl DbError {
    pub fn fault(&self) -> Fault {
        match self {
            DbError::Sql(e) => sql_fault(e),
            // Stored JSON that does not parse, or a value that does not encode: the data.
            DbError::Json(_) => Fault::Poison,
            // A handshake or a login refused on a reconnect: the server's state, not the data's.
            DbError::Tls(_) | DbError::Refused(_) => Fault::Outage,
            DbError::BadUrl(_) | DbError::Options(_) | DbError::Migrate(_) => Fault::Other,
        }
    }

    /// The database refused the data: a retry cannot succeed.
    pub fn is_poison(&self) -> bool {
        self.fault() == Fault::Poison
    }
}

fn sql_fault(e: &sqlx::Error) -> Fault {
    match e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::Protocol(_) => Fault::Outage,
        sqlx::Error::Database(d) => database_fault(d.as_ref()),
        sqlx::Error::Decode(_) | sqlx::Error::ColumnDecode { .. } | sqlx::Error::Encode(_) => Fault::Poison,
        _ => Fault::Other,
    }
}

fn database_fault(d: &dyn DatabaseError) -> Fault {
    if let Some(pg) = d.try_downcast_ref::<PgDatabaseError>() {
        return sqlstate_fault(pg.code());
    }
    if let Some(lite) = d.try_downcast_ref::<SqliteError>() {
        if let Some(code) = lite.code().and_then(|c| c.parse::<i32>().ok()) {
            return sqlite_fault(code);
        }
    }
    match d.kind() {
        ErrorKind::UniqueViolation
        | ErrorKind::ForeignKeyViolation
        | ErrorKind::NotNullViolation
        | ErrorKind::CheckViolation => Fault::Poison,
        _ => Fault::Other,
    }
}

/// PostgreSQL's error classes (the first two characters of the SQLSTATE).
pub(crate) fn sqlstate_fault(code: &str) -> Fault {
    match code.get(..2) {
        // 22 data exception (a NUL in text, a value out of range), 23 integrity constraint
        // violation, 54 program limit exceeded (an index row too large).
        Some("22" | "23" | "54") => Fault::Poison,
        // 08 connection exception, 40 transaction rollback (serialization, deadlock), 53
        // insufficient resources, 55 object not in prerequisite state (connections not
        // allowed, lock not available), 57 operator intervention (shutdown), 58 system error.
        Some("08" | "40" | "53" | "55" | "57" | "58") => Fault::Outage,
        _ => Fault::Other,
    }
}

/// SQLite's primary result codes (the low byte of the extended code).
pub(crate) fn sqlite_fault(code: i32) -> Fault {
    match code & 0xff {
        // TOOBIG, CONSTRAINT, MISMATCH, RANGE
        18 | 19 | 20 | 25 => Fault::Poison,
        // BUSY, LOCKED, NOMEM, IOERR, FULL, CANTOPEN, PROTOCOL
        5 | 6 | 7 | 10 | 13 | 14 | 15 => Fault::Outage,
        _ => Fault::Other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstate_classes() {
        assert_eq!(sqlstate_fault("22021"), Fault::Poison, "character not in repertoire (a NUL)");
        assert_eq!(sqlstate_fault("22P05"), Fault::Poison);
        assert_eq!(sqlstate_fault("23505"), Fault::Poison);
        assert_eq!(sqlstate_fault("54000"), Fault::Poison);
        assert_eq!(sqlstate_fault("57P01"), Fault::Outage, "admin shutdown");
        assert_eq!(sqlstate_fault("08006"), Fault::Outage);
        assert_eq!(sqlstate_fault("53300"), Fault::Outage, "too many connections");
        assert_eq!(sqlstate_fault("42P01"), Fault::Other);
        assert_eq!(sqlstate_fault(""), Fault::Other);
    }

    #[test]
    fn sqlite_codes() {
        assert_eq!(sqlite_fault(2067), Fault::Poison, "SQLITE_CONSTRAINT_UNIQUE");
        assert_eq!(sqlite_fault(5), Fault::Outage, "SQLITE_BUSY");
        assert_eq!(sqlite_fault(1), Fault::Other);
    }

    #[tokio::test]
    async fn outages_and_poison_from_real_errors() {
        let io = DbError::Sql(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)));
        assert_eq!(io.fault(), Fault::Outage);
        assert_eq!(DbError::Sql(sqlx::Error::PoolTimedOut).fault(), Fault::Outage);
        let dir = tempfile::tempdir().expect("dir");
        let db = crate::Db::connect(&format!("sqlite://{}", dir.path().join("t.db").display())).await.expect("db");
        let twice = "INSERT INTO outbox (event_id, topic, msg_key, payload, created_at) VALUES ('e', 't', 'k', 'p', 0)";
        sqlx::query(twice).execute(&db.pool).await.expect("first");
        let e = DbError::from(sqlx::query(twice).execute(&db.pool).await.expect_err("a duplicate"));
        assert_eq!(e.fault(), Fault::Poison, "{e}");
        let e =
            DbError::from(sqlx::query("SELECT * FROM no_such_table").execute(&db.pool).await.expect_err("no table"));
        assert_eq!(e.fault(), Fault::Other, "{e}");
    }
}
