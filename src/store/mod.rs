//! Where users are kept. [`Store`] is the one type the use cases see; which
//! database sits behind it is chosen by the URL at start.
//!
//! Errors are classified here, once: a uniqueness conflict is [`StoreError::Duplicate`],
//! a database that cannot be reached is [`StoreError::Unavailable`], the rest is
//! unexpected and carries its cause for the log.

mod sqlite;

pub use sqlite::{SqliteSettings, WriterSnapshot};

use crate::{credentials::Username, error::Error};
use std::time::{SystemTime, UNIX_EPOCH};

/// A stored user.
#[derive(Debug, Clone)]
pub struct User {
    pub id: String,
    pub username: Username,
    pub password_hash: String,
}

/// A user about to be stored.
#[derive(Debug, Clone)]
pub struct NewUser {
    pub id: String,
    pub username: Username,
    pub password_hash: String,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("username already taken")]
    Duplicate,
    #[error("database unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        match &err {
            sqlx::Error::Database(db) if db.is_unique_violation() => StoreError::Duplicate,
            sqlx::Error::PoolTimedOut => {
                StoreError::Unavailable("timed out waiting for a database connection".into())
            }
            sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => {
                StoreError::Unavailable("the database connection is closed".into())
            }
            sqlx::Error::Io(e) => StoreError::Unavailable(format!("database I/O error: {e}")),
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

/// The storage backend, chosen by the database URL.
pub enum Store {
    Sqlite(sqlite::SqliteStore),
}

impl Store {
    pub async fn open_sqlite(settings: SqliteSettings) -> anyhow::Result<Self> {
        Ok(Store::Sqlite(sqlite::SqliteStore::open(settings).await?))
    }

    /// Runs the embedded migrations and closes the connection: `authd migrate`.
    pub async fn migrate_sqlite(settings: &SqliteSettings) -> anyhow::Result<()> {
        sqlite::migrate_only(settings).await
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
        }
    }

    /// Stores a new user; [`StoreError::Duplicate`] when the username is taken.
    pub async fn insert_user(&self, user: NewUser) -> Result<(), StoreError> {
        match self {
            Store::Sqlite(s) => s.insert_user(user).await,
        }
    }

    pub async fn find_user(&self, username: &Username) -> Result<Option<User>, StoreError> {
        match self {
            Store::Sqlite(s) => s.find_user(username).await,
        }
    }

    pub async fn update_password_hash(&self, id: &str, hash: String) -> Result<(), StoreError> {
        match self {
            Store::Sqlite(s) => s.update_password_hash(id, hash).await,
        }
    }

    /// Checks that the database answers, for health.
    pub async fn ping(&self) -> Result<(), StoreError> {
        match self {
            Store::Sqlite(s) => s.ping().await,
        }
    }

    /// Commits everything queued and closes the connections.
    pub async fn close(&self) {
        match self {
            Store::Sqlite(s) => s.close().await,
        }
    }

    /// The SQLite writer's counters; `None` for other backends.
    pub fn writer_stats(&self) -> Option<WriterSnapshot> {
        match self {
            Store::Sqlite(s) => Some(s.writer_stats()),
        }
    }
}

fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
