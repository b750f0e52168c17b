//! Where users are kept. [`Store`] is the one type the use cases see; which
//! database sits behind it (SQLite or PostgreSQL) is chosen by the URL at start.
//!
//! Both backends run the same statements and read rows with the same mapper; they
//! differ in how they write: SQLite through one batching writer task, PostgreSQL
//! through its pool, with uniqueness enforced by the database.
//!
//! Errors are classified here, once: a uniqueness conflict is [`StoreError::Duplicate`],
//! a database that cannot be reached is [`StoreError::Unavailable`], the rest is
//! unexpected and carries its cause for the log.
//!
//! Every operation is timed here, by backend and operation
//! (`authd_store_operation_duration_seconds`); the backends add what only they see:
//! the wait for a pooled connection, the SQLite writer's batches and commits.
//!
//! Every operation is bounded: a connection is waited for at most the acquire
//! timeout, and the statement itself at most `connection::operation_limit` of the
//! statement timeout (PostgreSQL cancels it on its side at the statement timeout; the
//! limit here covers a database that no longer answers at all). A connection whose
//! operation did not finish is closed, never returned to the pool (`connection`).
//! Each operation that fails as unavailable is announced on a watch channel
//! ([`Store::unavailable_events`]), so readiness can turn at once on what requests
//! see instead of waiting for its next probe; the store knows nothing of who listens.
//!
//! # Layout
//!
//! - `admin`: accounts as the admin API sees and changes them, and the per-user
//!   token cutoffs.
//! - `factor`: the second factor: TOTP factors, recovery codes, Login's challenges.
//! - `connection`: the backend choice and its settings, connect options, and the
//!   pools operations take a bounded connection from.
//! - `schema`: the migrations' two ledgers and the compatibility levels: what a
//!   release may run on, and whether a rollback is safe.
//! - `kept`: SQLite's read-only connections, lent without sqlx's pool checks.
//! - `users`: users' rows and statements, and their reads, written once for both
//!   backends.
//! - `session`: sessions' rows, statements and the rotation rule.
//! - `sqlite`: the reader pool and the one batching writer task.
//! - `sqlite_writes`: each kind of write that task applies, and its transaction.
//! - `sqlite_runs`: runs of one statement sent to a connection as one query: the
//!   writer's consecutive inserts, the gathered reads of users.
//! - `sqlite_lookups`: reads of users by name, gathered into batches.
//! - `postgres`: operations on a PostgreSQL pool.
//! - this file: [`Store`], the errors, and the metrics and spans of every operation.

mod admin;
mod connection;
mod factor;
mod kept;
mod postgres;
mod schema;
mod session;
mod sqlite;
mod sqlite_lookups;
mod sqlite_runs;
mod sqlite_writes;
mod users;

pub use admin::{Account, AccountKey, Change, Cutoff, PageQuery, Revoked, SessionInfo};
pub use connection::{PostgresSettings, SqliteSettings, StoreSettings};
pub use factor::{Factor, FactorAnswer, FactorWrite, LiveChallenge, Proof, Proved, Purpose};
pub use schema::{RELEASES, SchemaState};
pub use session::{
    EndReason, Ended, EndedSession, LiveSession, LoggedOut, NewSession, Purged, Refreshed, Rotation,
};
pub use sqlite::WriterSnapshot;
pub use users::{NewUser, User};

use crate::{clock::Clock, credentials::Username, error::Error, metrics::Metrics, otel};
use prometheus::{Histogram, IntCounter};
use std::{sync::Arc, time::Instant};
use tokio::sync::watch;

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

/// The storage backend, chosen by the database URL, and its metrics.
pub struct Store {
    backend: Backend,
    ops: Operations,
    /// Counts the operations that failed as unavailable; readiness watches it.
    unavailable: watch::Sender<u64>,
}

enum Backend {
    Sqlite(sqlite::SqliteStore),
    Postgres(postgres::PostgresStore),
}

/// The metric handles of one operation, resolved when the store opens.
struct OperationMetrics {
    duration: Histogram,
    unavailable: IntCounter,
    failed: IntCounter,
}

impl OperationMetrics {
    fn new(metrics: &Metrics, backend: &str, operation: &str) -> Self {
        let errors = &metrics.store.operation_errors;
        Self {
            duration: (metrics.store.operation_duration).with_label_values(&[backend, operation]),
            unavailable: errors.with_label_values(&[backend, operation, "unavailable"]),
            failed: errors.with_label_values(&[backend, operation, "other"]),
        }
    }

    fn record<T>(&self, started: Instant, result: &Result<T, StoreError>) {
        self.duration.observe(started.elapsed().as_secs_f64());
        match result {
            Err(StoreError::Unavailable(_)) => self.unavailable.inc(),
            Err(StoreError::Other(_)) => self.failed.inc(),
            // A taken username is an answer, not a failure.
            Ok(_) | Err(StoreError::Duplicate) => {}
        }
    }
}

struct Operations {
    find_user: OperationMetrics,
    insert_user: OperationMetrics,
    update_password_hash: OperationMetrics,
    max_hash_iterations: OperationMetrics,
    probe: OperationMetrics,
    insert_session: OperationMetrics,
    rotate_session: OperationMetrics,
    end_sessions: OperationMetrics,
    change_password: OperationMetrics,
    ended_sessions: OperationMetrics,
    purge_sessions: OperationMetrics,
    get_account: OperationMetrics,
    list_accounts: OperationMetrics,
    disable_user: OperationMetrics,
    enable_user: OperationMetrics,
    delete_user: OperationMetrics,
    cutoffs: OperationMetrics,
    purge_cutoffs: OperationMetrics,
    live_sessions: OperationMetrics,
    end_sessions_of: OperationMetrics,
    set_password: OperationMetrics,
    read_factor: OperationMetrics,
    read_challenge: OperationMetrics,
    find_user_by_id: OperationMetrics,
    write_factor: OperationMetrics,
}

impl Operations {
    fn new(metrics: &Metrics, backend: &str) -> Self {
        Self {
            find_user: OperationMetrics::new(metrics, backend, "find_user"),
            insert_user: OperationMetrics::new(metrics, backend, "insert_user"),
            update_password_hash: OperationMetrics::new(metrics, backend, "update_password_hash"),
            max_hash_iterations: OperationMetrics::new(metrics, backend, "max_hash_iterations"),
            probe: OperationMetrics::new(metrics, backend, "probe"),
            insert_session: OperationMetrics::new(metrics, backend, "insert_session"),
            rotate_session: OperationMetrics::new(metrics, backend, "rotate_session"),
            end_sessions: OperationMetrics::new(metrics, backend, "end_sessions"),
            change_password: OperationMetrics::new(metrics, backend, "change_password"),
            ended_sessions: OperationMetrics::new(metrics, backend, "ended_sessions"),
            purge_sessions: OperationMetrics::new(metrics, backend, "purge_sessions"),
            get_account: OperationMetrics::new(metrics, backend, "get_account"),
            list_accounts: OperationMetrics::new(metrics, backend, "list_accounts"),
            disable_user: OperationMetrics::new(metrics, backend, "disable_user"),
            enable_user: OperationMetrics::new(metrics, backend, "enable_user"),
            delete_user: OperationMetrics::new(metrics, backend, "delete_user"),
            cutoffs: OperationMetrics::new(metrics, backend, "cutoffs"),
            purge_cutoffs: OperationMetrics::new(metrics, backend, "purge_cutoffs"),
            live_sessions: OperationMetrics::new(metrics, backend, "live_sessions"),
            end_sessions_of: OperationMetrics::new(metrics, backend, "end_sessions_of"),
            set_password: OperationMetrics::new(metrics, backend, "set_password"),
            read_factor: OperationMetrics::new(metrics, backend, "read_factor"),
            read_challenge: OperationMetrics::new(metrics, backend, "read_challenge"),
            find_user_by_id: OperationMetrics::new(metrics, backend, "find_user_by_id"),
            write_factor: OperationMetrics::new(metrics, backend, "write_factor"),
        }
    }
}

/// Dispatches a call to whichever backend this store is.
macro_rules! each_backend {
    ($store:expr, $backend:ident => $call:expr) => {
        match &$store.backend {
            Backend::Sqlite($backend) => $call,
            Backend::Postgres($backend) => $call,
        }
    };
}

/// Runs a store operation, records its duration and failure, and announces a
/// failure to reach the database.
macro_rules! timed {
    ($store:expr, $op:ident, $backend:ident => $call:expr) => {{
        // A latency metric: how long the operation took, not the time of any rule.
        let started = Instant::now();
        let mut span = otel::child(stringify!($op));
        span.set("db.system", $store.db_system());
        span.set("db.operation.name", stringify!($op));
        // Each backend's operation runs boxed: the future of a database call (a
        // pool's lease, a query, a timeout) is kilobytes, and every request future
        // that awaits a store operation would otherwise hold the largest of them
        // inline, and be copied whole each time it moves.
        let result = each_backend!($store, $backend => Box::pin(async { $call }).await);
        $store.ops.$op.record(started, &result);
        match &result {
            Err(StoreError::Unavailable(_)) => span.fail("database unavailable"),
            Err(StoreError::Other(_)) => span.fail("store error"),
            Ok(_) | Err(StoreError::Duplicate) => {}
        }
        drop(span);
        if matches!(result, Err(StoreError::Unavailable(_))) {
            $store.unavailable.send_modify(|n| *n = n.wrapping_add(1));
        }
        result
    }};
}

impl Store {
    /// Opens the database and brings its schema up to date; records into `metrics`.
    /// The times it writes of its own accord (a user's creation, a rehash) read `clock`;
    /// every other operation is given its time by the caller.
    pub async fn open(
        settings: StoreSettings,
        metrics: &Metrics,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Self> {
        let backend = match settings {
            StoreSettings::Sqlite(s) => {
                Backend::Sqlite(sqlite::SqliteStore::open(s, metrics, clock).await?)
            }
            StoreSettings::Postgres(s) => {
                Backend::Postgres(postgres::PostgresStore::open(s, metrics, clock).await?)
            }
        };
        let ops = Operations::new(metrics, backend.name());
        Ok(Self {
            backend,
            ops,
            unavailable: watch::Sender::new(0),
        })
    }

    /// Runs the embedded migrations and closes the connection: `authd migrate`.
    /// Safe when several replicas start at once (sqlx takes a migration lock).
    pub async fn migrate(settings: &StoreSettings) -> anyhow::Result<()> {
        connection::migrate_only(settings).await
    }

    /// The database's schema, read without changing it: `authd migrate --status`.
    pub async fn schema(settings: &StoreSettings) -> anyhow::Result<SchemaState> {
        connection::read_schema(settings).await
    }

    /// Stores a new user; [`StoreError::Duplicate`] when the username is taken.
    pub async fn insert_user(&self, user: NewUser) -> Result<(), StoreError> {
        timed!(self, insert_user, s => s.insert_user(user).await)
    }

    pub async fn find_user(&self, username: &Username) -> Result<Option<User>, StoreError> {
        timed!(self, find_user, s => s.find_user(username).await)
    }

    /// Stores a rehash of the same password; nothing when the password's version is
    /// no longer `version`.
    pub async fn update_password_hash(
        &self,
        id: &str,
        hash: String,
        version: i64,
    ) -> Result<(), StoreError> {
        timed!(self, update_password_hash, s => s.update_password_hash(id, hash, version).await)
    }

    /// Stores a new session (Login) if the user's password is still at the version
    /// the login verified; `false` (nothing stored) when it is not. Atomic against
    /// a password change on any replica: the session is stored before the change
    /// (which then ends it) or not at all.
    pub async fn insert_session(&self, session: NewSession) -> Result<bool, StoreError> {
        timed!(self, insert_session, s => s.insert_session(session).await)
    }

    /// Runs a Refresh: rotation, the retry rule, or reuse (see `session`).
    pub async fn rotate(&self, rotation: Rotation) -> Result<Refreshed, StoreError> {
        timed!(self, rotate_session, s => s.rotate(rotation).await)
    }

    /// Logout by a refresh token's digest (see `session` for which tokens end what).
    pub async fn end_by_digest(
        &self,
        digest: &str,
        all: bool,
        now: i64,
        grace_ms: i64,
    ) -> Result<LoggedOut, StoreError> {
        timed!(self, end_sessions, s => s.end_by_digest(digest, all, now, grace_ms).await)
    }

    /// Logout by a verified access token's session id and user; `None` when that
    /// session is no longer live (nothing ends).
    pub async fn end_by_id(
        &self,
        id: &str,
        user_id: &str,
        all: bool,
        now: i64,
    ) -> Result<Option<Ended>, StoreError> {
        timed!(self, end_sessions, s => s.end_by_id(id, user_id, all, now).await)
    }

    /// Stores a new password hash, if the password is still at `version` (the one
    /// verified), and ends every session of the user, in one transaction; returns
    /// the sessions ended, or `None` when the password had changed meanwhile.
    pub async fn change_password(
        &self,
        id: &str,
        hash: String,
        version: i64,
        now: i64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        timed!(self, change_password, s => s.change_password(id, hash, version, now).await)
    }

    /// Sessions ended after `after` (ended_at, id), in that order, at most `limit`
    /// (read through the readers: with SQLite's WAL they see every committed write).
    pub async fn ended_since(
        &self,
        after: (i64, &str),
        limit: i64,
    ) -> Result<Vec<EndedSession>, StoreError> {
        timed!(self, ended_sessions, s => session::ended_since(s.readers(), after, limit).await)
    }

    /// Deletes up to `limit` sessions that expired by `now`, and up to `limit`
    /// that ended by `ended_before`.
    pub async fn purge_sessions(
        &self,
        now: i64,
        ended_before: i64,
        limit: i64,
    ) -> Result<Purged, StoreError> {
        timed!(self, purge_sessions, s => s.purge(now, ended_before, limit).await)
    }

    /// The account `key` names, its live sessions counted at `now`.
    pub async fn account(&self, key: &AccountKey, now: i64) -> Result<Option<Account>, StoreError> {
        timed!(self, get_account, s => admin::account(s.readers(), key, now).await)
    }

    /// A page of accounts in username order (byte order).
    pub async fn accounts_page(
        &self,
        query: &PageQuery,
        now: i64,
    ) -> Result<Vec<Account>, StoreError> {
        timed!(self, list_accounts, s => s.accounts_page(query, now).await)
    }

    /// Disables the account `id`: marks it, takes the next password version (a
    /// login or password change in flight stores nothing), ends its live sessions
    /// and writes its token cutoff at `now`, in one transaction.
    pub async fn disable_user(
        &self,
        id: &str,
        reason: &str,
        now: i64,
    ) -> Result<Change<Revoked>, StoreError> {
        timed!(self, disable_user, s => s.disable_user(id, reason, now).await)
    }

    /// Enables the account `id` again; its cutoff stays.
    pub async fn enable_user(&self, id: &str, now: i64) -> Result<Change<()>, StoreError> {
        timed!(self, enable_user, s => s.enable_user(id, now).await)
    }

    /// Deletes the account `id`, its sessions and their refresh tokens, and writes
    /// its token cutoff at `now`, in one transaction.
    pub async fn delete_user(&self, id: &str, now: i64) -> Result<Change<Revoked>, StoreError> {
        timed!(self, delete_user, s => s.delete_user(id, now).await)
    }

    /// Cutoffs written after `after` (cutoff_at, user_id), in that order, at most
    /// `limit`.
    pub async fn cutoffs_since(
        &self,
        after: (i64, &str),
        limit: i64,
    ) -> Result<Vec<Cutoff>, StoreError> {
        timed!(self, cutoffs, s => admin::cutoffs_since(s.readers(), after, limit).await)
    }

    /// The live sessions of `user_id` at `now`, newest first, at most `limit`.
    pub async fn live_sessions(
        &self,
        user_id: &str,
        now: i64,
        limit: i64,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        timed!(self, live_sessions, s => admin::live_sessions(s.readers(), user_id, now, limit).await)
    }

    /// Ends the named live sessions of `user_id` (every one when `ids` is empty);
    /// returns those it ended.
    pub async fn end_sessions_of(
        &self,
        user_id: &str,
        ids: Vec<String>,
        now: i64,
    ) -> Result<Vec<String>, StoreError> {
        timed!(self, end_sessions_of, s => s.end_sessions_of(user_id, ids, now).await)
    }

    /// An administrator's new password hash for `user_id` (the next version), and
    /// with `end_sessions` every live session ended, in one transaction; `None`
    /// when there is no such user.
    pub async fn set_password(
        &self,
        user_id: &str,
        hash: String,
        end_sessions: bool,
        now: i64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        timed!(self, set_password, s => s.set_password(user_id, hash, end_sessions, now).await)
    }

    /// The user of id `id`.
    pub async fn find_user_by_id(&self, id: &str) -> Result<Option<User>, StoreError> {
        timed!(self, find_user_by_id, s => users::find_by_id(s.readers(), id).await)
    }

    /// The TOTP factor of `user_id` (on or pending), if any.
    pub async fn factor(&self, user_id: &str) -> Result<Option<Factor>, StoreError> {
        timed!(self, read_factor, s => factor::factor(s.readers(), user_id).await)
    }

    /// The Login challenge of `digest`, if it is live at `now` with fewer than `max`
    /// attempts taken.
    pub async fn live_challenge(
        &self,
        digest: &str,
        now: i64,
        max: i64,
    ) -> Result<Option<LiveChallenge>, StoreError> {
        timed!(self, read_challenge, s => factor::live_challenge(s.readers(), digest, now, max).await)
    }

    /// A write of the second factor, in one transaction (see `factor`).
    pub async fn factor_write(&self, write: FactorWrite) -> Result<FactorAnswer, StoreError> {
        timed!(self, write_factor, s => s.factor_write(write).await)
    }

    /// Deletes up to `limit` cutoffs written at or before `before`.
    pub async fn purge_cutoffs(&self, before: i64, limit: i64) -> Result<u64, StoreError> {
        timed!(self, purge_cutoffs, s => s.purge_cutoffs(before, limit).await)
    }

    /// The highest PBKDF2 iteration count of any stored hash (0 with no users).
    pub async fn max_hash_iterations(&self) -> Result<u32, StoreError> {
        timed!(self, max_hash_iterations, s => s.max_hash_iterations().await)
    }

    /// Checks that the database answers a real query the way requests run theirs
    /// (same pool, same limits, the users table), and on SQLite that the writer
    /// commits: for readiness. Returns what the query read, the highest stored
    /// iteration count.
    pub async fn probe(&self) -> Result<u32, StoreError> {
        timed!(self, probe, s => s.probe().await)
    }

    /// A receiver whose value changes each time an operation fails because the
    /// database could not be reached or did not answer in time.
    pub fn unavailable_events(&self) -> watch::Receiver<u64> {
        self.unavailable.subscribe()
    }

    /// Commits everything queued and closes the connections.
    pub async fn close(&self) {
        each_backend!(self, s => s.close().await)
    }

    /// Whether other processes may write to this database (PostgreSQL, shared by
    /// replicas); a SQLite file has one process, which knows all it writes.
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::Postgres(_))
    }

    /// The `db.system` of the store's spans (OpenTelemetry's names).
    fn db_system(&self) -> &'static str {
        match &self.backend {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgresql",
        }
    }

    /// The SQLite writer's counters; `None` for other backends.
    pub fn writer_stats(&self) -> Option<WriterSnapshot> {
        match &self.backend {
            Backend::Sqlite(s) => Some(s.writer_stats()),
            Backend::Postgres(_) => None,
        }
    }
}

impl Backend {
    /// The `backend` label of the store's metrics.
    fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite(_) => "sqlite",
            Backend::Postgres(_) => "postgres",
        }
    }
}
