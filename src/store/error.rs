//! The store's errors, classified once: a uniqueness conflict is
//! [`StoreError::Duplicate`], a database that cannot be reached is
//! [`StoreError::Unavailable`], the rest is unexpected and carries its cause for the
//! log.

use crate::error::Error;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("username already taken")]
    Duplicate,
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl StoreError {
    /// This error as told to each of the many operations it failed at once (a
    /// batch): an unavailable database stays one (with its reason); anything else
    /// becomes `failed`, its cause logged once by whoever met it.
    pub(crate) fn for_each_of_many(&self, failed: &'static str) -> StoreError {
        match self {
            StoreError::Unavailable(why) => StoreError::Unavailable(why.clone()),
            _ => StoreError::Other(anyhow::anyhow!(failed)),
        }
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        match &err {
            sqlx::Error::Database(db) if db.is_unique_violation() => StoreError::Duplicate,
            // PostgreSQL: query_canceled (57014, what `statement_timeout` raises) and
            // lock_not_available (55P03): the database is there but cannot answer now.
            sqlx::Error::Database(db)
                if db.code().is_some_and(|c| c == "57014" || c == "55P03") =>
            {
                StoreError::Unavailable(format!(
                    "the database did not answer in time: {}",
                    db.message()
                ))
            }
            // PostgreSQL: connection exceptions (08…), shutting down or starting up
            // (57P01-57P03), too many connections (53300).
            sqlx::Error::Database(db)
                if db.code().is_some_and(|c| {
                    c.starts_with("08") || c.starts_with("57P") || c == "53300"
                }) =>
            {
                StoreError::Unavailable(format!(
                    "the database refused the request: {}",
                    db.message()
                ))
            }
            // SQLite: busy (5) or locked (6), in their extended forms too: another
            // connection (another process) holds the lock past the busy timeout.
            sqlx::Error::Database(db)
                if db
                    .try_downcast_ref::<sqlx::sqlite::SqliteError>()
                    .and_then(sqlx::error::DatabaseError::code)
                    .and_then(|code| code.parse::<i32>().ok())
                    .is_some_and(|code| matches!(code & 0xff, 5 | 6)) =>
            {
                StoreError::Unavailable(format!("the database is locked: {}", db.message()))
            }
            sqlx::Error::PoolTimedOut => {
                StoreError::Unavailable("timed out waiting for a database connection".into())
            }
            sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
                StoreError::Unavailable("the database connection is closed".into())
            }
            sqlx::Error::Io(e) => {
                StoreError::Unavailable(format!("cannot reach the database: {e}"))
            }
            sqlx::Error::Tls(e) => {
                StoreError::Unavailable(format!("TLS with the database failed: {e}"))
            }
            // A connection cut mid-conversation (or mid-handshake) surfaces as a
            // protocol error: the database is not reachable, not misbehaving.
            sqlx::Error::Protocol(e) => {
                StoreError::Unavailable(format!("the database connection broke: {e}"))
            }
            _ => StoreError::Other(anyhow::Error::new(err).context("database error")),
        }
    }
}

impl From<StoreError> for Error {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Duplicate => Error::AlreadyExists,
            StoreError::Unavailable(why) => Error::Unavailable(why),
            StoreError::Other(cause) => Error::Internal(cause),
        }
    }
}

/// What an operation meets once the store is closed (shutting down).
pub(super) fn closed() -> StoreError {
    StoreError::Unavailable("the database is closed (shutting down)".into())
}
