//! Where users are kept. [`Store`] is the one type the use cases see; which
//! database sits behind it (SQLite or PostgreSQL) is chosen by the URL at start.
//!
//! Both backends run the same statements ([`sql`]) and read rows with the same
//! mapper; they differ in how they write: SQLite through one batching writer task,
//! PostgreSQL through its pool, with uniqueness enforced by the database.
//!
//! Errors are classified here, once: a uniqueness conflict is [`StoreError::Duplicate`],
//! a database that cannot be reached is [`StoreError::Unavailable`], the rest is
//! unexpected and carries its cause for the log.

mod postgres;
mod sqlite;

pub use postgres::PostgresSettings;
pub use sqlite::{SqliteSettings, WriterSnapshot};

use crate::{credentials::Username, error::Error};
use sqlx::{ColumnIndex, Database, Decode, Encode, Row, Type, query::Query};
use std::time::{SystemTime, UNIX_EPOCH};

/// The statements both backends run. `$N` placeholders are PostgreSQL's and are
/// also understood by SQLite, so each statement is written once.
mod sql {
    pub const FIND_USER: &str = "SELECT id, username, password_hash FROM users WHERE username = $1";
    /// Usernames are stored lowercased, so the UNIQUE (username) conflict is
    /// case-insensitive. A conflict inserts nothing: zero rows affected.
    pub const INSERT_USER: &str = "INSERT INTO users (id, username, password_hash, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (username) DO NOTHING";
    pub const UPDATE_PASSWORD_HASH: &str =
        "UPDATE users SET password_hash = $1, updated_at = $2 WHERE id = $3";
    pub const PING: &str = "SELECT 1";
}

fn insert_user_query<DB>(user: &NewUser, now: i64) -> Query<'static, DB, DB::Arguments>
where
    DB: Database,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
{
    sqlx::query(sql::INSERT_USER)
        .bind(user.id.as_str())
        .bind(user.username.as_str())
        .bind(user.password_hash.as_str())
        .bind(now)
        .bind(now)
}

fn update_password_hash_query<DB>(
    id: &str,
    hash: &str,
    now: i64,
) -> Query<'static, DB, DB::Arguments>
where
    DB: Database,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
    for<'a> i64: Encode<'a, DB> + Type<DB>,
{
    sqlx::query(sql::UPDATE_PASSWORD_HASH)
        .bind(hash)
        .bind(now)
        .bind(id)
}

fn find_user_query<DB>(username: &Username) -> Query<'static, DB, DB::Arguments>
where
    DB: Database,
    for<'a> &'a str: Encode<'a, DB> + Type<DB>,
{
    sqlx::query(sql::FIND_USER).bind(username.as_str())
}

fn user_from_row<'r, R>(row: &'r R) -> Result<User, sqlx::Error>
where
    R: Row,
    &'r str: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(User {
        id: row.try_get("id")?,
        username: Username::from_store(row.try_get("username")?),
        password_hash: row.try_get("password_hash")?,
    })
}

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

/// The storage backend, chosen by the database URL.
pub enum Store {
    Sqlite(sqlite::SqliteStore),
    Postgres(postgres::PostgresStore),
}

/// Which database to open, and how.
#[derive(Debug, Clone)]
pub enum StoreSettings {
    Sqlite(SqliteSettings),
    Postgres(PostgresSettings),
}

/// Dispatches a call to whichever backend this store is.
macro_rules! each_backend {
    ($store:expr, $backend:ident => $call:expr) => {
        match $store {
            Store::Sqlite($backend) => $call,
            Store::Postgres($backend) => $call,
        }
    };
}

impl Store {
    /// Opens the database and brings its schema up to date.
    pub async fn open(settings: StoreSettings) -> anyhow::Result<Self> {
        Ok(match settings {
            StoreSettings::Sqlite(s) => Store::Sqlite(sqlite::SqliteStore::open(s).await?),
            StoreSettings::Postgres(s) => Store::Postgres(postgres::PostgresStore::open(s).await?),
        })
    }

    /// Runs the embedded migrations and closes the connection: `authd migrate`.
    /// Safe when several replicas start at once (sqlx takes a migration lock).
    pub async fn migrate(settings: &StoreSettings) -> anyhow::Result<()> {
        match settings {
            StoreSettings::Sqlite(s) => sqlite::migrate_only(s).await,
            StoreSettings::Postgres(s) => postgres::migrate_only(s).await,
        }
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Store::Sqlite(_) => "sqlite",
            Store::Postgres(_) => "postgres",
        }
    }

    /// Stores a new user; [`StoreError::Duplicate`] when the username is taken.
    pub async fn insert_user(&self, user: NewUser) -> Result<(), StoreError> {
        each_backend!(self, s => s.insert_user(user).await)
    }

    pub async fn find_user(&self, username: &Username) -> Result<Option<User>, StoreError> {
        each_backend!(self, s => s.find_user(username).await)
    }

    pub async fn update_password_hash(&self, id: &str, hash: String) -> Result<(), StoreError> {
        each_backend!(self, s => s.update_password_hash(id, hash).await)
    }

    /// Checks that the database answers, for health.
    pub async fn ping(&self) -> Result<(), StoreError> {
        each_backend!(self, s => s.ping().await)
    }

    /// Commits everything queued and closes the connections.
    pub async fn close(&self) {
        each_backend!(self, s => s.close().await)
    }

    /// The SQLite writer's counters; `None` for other backends.
    pub fn writer_stats(&self) -> Option<WriterSnapshot> {
        match self {
            Store::Sqlite(s) => Some(s.writer_stats()),
            Store::Postgres(_) => None,
        }
    }
}

fn unix_millis() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}
