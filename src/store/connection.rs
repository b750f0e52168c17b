//! Connections: which database to open and how (the settings, connect options,
//! SQLite's file permissions; the migrations run on open are `schema`'s), and the
//! pools every operation takes a connection from, bounded alike on both backends.
//!
//! [`Connections`] is a backend's pool (SQLite's readers, kept by authd: `kept`;
//! PostgreSQL's one sqlx pool) with the wait for a connection measured (`authd_store_pool_acquire_duration_seconds`)
//! and each operation bounded ([`operation_limit`] of the statement timeout, see
//! [`within`]); a connection whose operation did not finish is closed, never returned
//! to the pool ([`Lease`]). The statements run on it are `db`'s: this file builds
//! no statement of its own, and knows nothing of users or sessions.
//!
//! SQLite: WAL, `synchronous=FULL` (a commit that returned is durable), a busy
//! timeout, foreign keys; the writer connection (`sqlite`'s writer task) creates and
//! migrates the file, the readers are read-only. On Unix the database file is created
//! readable by its owner only (0600) before SQLite opens it, and an existing file
//! (with its `-wal` and `-shm`) that others may read is tightened, with a warning.
//!
//! PostgreSQL: every pooled connection runs with `statement_timeout` set
//! (`AUTHD_DB_STATEMENT_TIMEOUT`), so a statement stuck behind a lock is cancelled by
//! PostgreSQL and the connection stays usable. Migrations run on a connection of
//! their own without that timeout: rewriting a large table may take longer than any
//! request should; sqlx holds an advisory lock meanwhile, so replicas take turns.

use super::error::StoreError;
use super::kept::{Kept, Lent};
use super::schema::SchemaState;
use crate::metrics::Metrics;
use anyhow::Context as _;
use prometheus::Histogram;
use sqlx::{
    Connection, Database, PgConnection, PgPool, Sqlite, SqliteConnection,
    pool::PoolConnection,
    postgres::{PgConnectOptions, PgPoolOptions},
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous},
};
use std::{
    fmt,
    future::Future,
    ops::{Deref, DerefMut},
    path::{Path, PathBuf},
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

/// Which database to open, and how.
#[derive(Debug, Clone)]
pub enum StoreSettings {
    Sqlite(SqliteSettings),
    Postgres(PostgresSettings),
}

/// How to open the SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteSettings {
    pub path: PathBuf,
    /// Read-only connections in the reader pool.
    pub readers: u32,
    /// How long a read waits for a free connection before giving up (UNAVAILABLE).
    pub acquire_timeout: Duration,
    /// The most writes committed in one transaction.
    pub max_batch: usize,
    /// Longest a read or a write may take (see [`operation_limit`]).
    pub statement_timeout: Duration,
}

/// How to reach PostgreSQL.
#[derive(Clone)]
pub struct PostgresSettings {
    /// A `postgres://` URL; it may hold a password, so it is never printed.
    pub url: String,
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    /// Longest a statement may run (PostgreSQL's `statement_timeout`).
    pub statement_timeout: Duration,
}

impl fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSettings")
            .field("url", &"<redacted>")
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .finish()
    }
}

/// Runs the embedded migrations and closes the connection: `authd migrate`.
pub(super) async fn migrate_only(settings: &StoreSettings) -> anyhow::Result<()> {
    match settings {
        StoreSettings::Sqlite(s) => {
            let conn = open_sqlite_writer(s).await?;
            conn.close().await.context("closing the SQLite database")?;
            Ok(())
        }
        StoreSettings::Postgres(s) => migrate_postgres(s).await,
    }
}

/// The read-only connections of SQLite (WAL: they see every committed write and
/// never wait for the writer), kept by authd rather than by sqlx's pool (`kept`).
pub(super) async fn open_sqlite_readers(settings: &SqliteSettings) -> anyhow::Result<Kept<Sqlite>> {
    Kept::open(
        sqlite_options(settings).read_only(true),
        settings.readers.max(1) as usize,
        settings.acquire_timeout,
    )
    .await
    .with_context(|| format!("opening SQLite readers on {}", settings.path.display()))
}

/// Pages the WAL grows by before the writer copies it into the database file (about
/// 40 MB; SQLite's default is 1,000). A page many commits change (the end of the
/// sessions table and of its time-ordered indexes) is copied once per checkpoint, so
/// ten times rarer checkpoints copy far fewer pages per write: 1.12 times the logins a
/// second on one core at 1,000 rounds (docs/operations.md).
pub(super) const WAL_AUTOCHECKPOINT_PAGES: u32 = 10_000;

fn sqlite_options(settings: &SqliteSettings) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(&settings.path)
        .journal_mode(SqliteJournalMode::Wal)
        // FULL: the WAL is synced at every commit, so a commit that returned is durable.
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(5))
        .foreign_keys(true)
}

/// Makes sure the database file exists and only its owner may read it, before
/// SQLite opens it (and creates the `-wal` and `-shm` files with its permissions).
#[cfg(unix)]
fn restrict_permissions(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("opening SQLite database {}", path.display()))?;
    let with_suffix = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    };
    for file in [path.to_owned(), with_suffix("-wal"), with_suffix("-shm")] {
        let file = file.as_path();
        let mode = match std::fs::metadata(file) {
            Ok(meta) => meta.permissions().mode(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("reading the permissions of {}", file.display()));
            }
        };
        if mode & 0o077 != 0 {
            tracing::warn!(
                file = %file.display(),
                mode = format!("{:o}", mode & 0o777),
                "the SQLite database was readable by other users; restricting it to its owner (0600)"
            );
            std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o600))
                .with_context(|| format!("restricting the permissions of {}", file.display()))?;
        }
    }
    Ok(())
}

#[cfg(not(unix))]
fn restrict_permissions(_path: &Path) -> anyhow::Result<()> {
    Ok(())
}

/// The SQLite write connection: creates the file (owner-only) if missing and brings
/// its schema up to date.
pub(super) async fn open_sqlite_writer(
    settings: &SqliteSettings,
) -> anyhow::Result<SqliteConnection> {
    restrict_permissions(&settings.path)?;
    let options = sqlite_options(settings)
        .create_if_missing(true)
        .pragma("wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES.to_string());
    let mut conn = SqliteConnection::connect_with(&options)
        .await
        .with_context(|| format!("opening SQLite database {}", settings.path.display()))?;
    super::schema::migrate_sqlite(&mut conn)
        .await
        .with_context(|| format!("migrating SQLite database {}", settings.path.display()))?;
    Ok(conn)
}

fn postgres_options(settings: &PostgresSettings) -> anyhow::Result<PgConnectOptions> {
    Ok(PgConnectOptions::from_str(&settings.url)
        .context("parsing the PostgreSQL URL")?
        .application_name("authd"))
}

/// The pool every PostgreSQL operation runs on, each connection with
/// `statement_timeout` set.
pub(super) async fn connect_postgres(settings: &PostgresSettings) -> anyhow::Result<PgPool> {
    // Whole milliseconds, at least one: PostgreSQL reads 0 as "no timeout".
    let timeout_ms = settings.statement_timeout.as_millis().max(1);
    let options =
        postgres_options(settings)?.options([("statement_timeout", format!("{timeout_ms}ms"))]);
    PgPoolOptions::new()
        .max_connections(settings.max_connections.max(1))
        .acquire_timeout(settings.acquire_timeout)
        .connect_with(options)
        .await
        .context("connecting to PostgreSQL")
}

/// Brings the PostgreSQL schema up to date, on a connection of its own.
pub(super) async fn migrate_postgres(settings: &PostgresSettings) -> anyhow::Result<()> {
    let mut conn = PgConnection::connect_with(&postgres_options(settings)?)
        .await
        .context("connecting to PostgreSQL")?;
    super::schema::migrate_postgres(&mut conn)
        .await
        .context("migrating the PostgreSQL database")?;
    conn.close()
        .await
        .context("closing the migration connection")
}

/// What the database's schema is, read without changing it (`authd migrate
/// --status`); an SQLite file that does not exist is an error, not an empty schema.
pub(super) async fn read_schema(settings: &StoreSettings) -> anyhow::Result<SchemaState> {
    read_only(
        settings,
        async |conn| super::schema::sqlite_state(conn).await,
        async |conn| super::schema::postgres_state(conn).await,
    )
    .await
}

/// Users whose password is an ext hash (a marker in `password_hash`), read without
/// changing anything: for `authd migrate --check-rollback`.
pub(super) async fn read_ext_users(settings: &StoreSettings) -> anyhow::Result<i64> {
    read_only(
        settings,
        async |conn| super::schema::sqlite_ext_users(conn).await,
        async |conn| super::schema::postgres_ext_users(conn).await,
    )
    .await
}

/// Runs `sqlite` or `postgres` (as the backend is) on one connection of its own,
/// read-only on SQLite (whose file must exist), closed afterwards.
async fn read_only<T>(
    settings: &StoreSettings,
    sqlite: impl AsyncFnOnce(&mut SqliteConnection) -> anyhow::Result<T>,
    postgres: impl AsyncFnOnce(&mut PgConnection) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    match settings {
        StoreSettings::Sqlite(s) => {
            anyhow::ensure!(
                s.path.exists(),
                "no SQLite database at {}",
                s.path.display()
            );
            let mut conn = SqliteConnection::connect_with(&sqlite_options(s).read_only(true))
                .await
                .with_context(|| format!("opening SQLite database {}", s.path.display()))?;
            let read = sqlite(&mut conn).await;
            conn.close().await.context("closing the SQLite database")?;
            read
        }
        StoreSettings::Postgres(s) => {
            let mut conn = PgConnection::connect_with(&postgres_options(s)?)
                .await
                .context("connecting to PostgreSQL")?;
            let read = postgres(&mut conn).await;
            conn.close().await.context("closing the connection")?;
            read
        }
    }
}

/// A backend's pool of connections: the wait for one is measured, and every
/// operation on one is bounded by [`Connections::limit`].
pub(super) struct Connections<DB: Database> {
    pool: Pool<DB>,
    /// Time waiting for a connection from the pool.
    wait: Histogram,
    /// Longest authd waits for one statement's answer.
    limit: Duration,
}

/// Where a backend's connections come from.
pub(super) enum Pool<DB: Database> {
    /// sqlx's pool (PostgreSQL): each connection checked before it is lent and
    /// when it comes back, as a connection across a network must be.
    Sqlx(sqlx::Pool<DB>),
    /// Connections lent as they are (SQLite's readers, see `kept`).
    Kept(Arc<Kept<DB>>),
}

impl<DB: Database> Pool<DB> {
    /// The most connections it holds.
    fn max(&self) -> usize {
        match self {
            Pool::Sqlx(pool) => pool.options().get_max_connections() as usize,
            Pool::Kept(kept) => kept.max(),
        }
    }

    /// (connections open, of which idle).
    fn sizes(&self) -> (usize, usize) {
        match self {
            Pool::Sqlx(pool) => (pool.size() as usize, pool.num_idle()),
            Pool::Kept(kept) => kept.sizes(),
        }
    }
}

impl<DB: Database> Clone for Pool<DB> {
    fn clone(&self) -> Self {
        match self {
            Pool::Sqlx(pool) => Pool::Sqlx(pool.clone()),
            Pool::Kept(kept) => Pool::Kept(kept.clone()),
        }
    }
}

impl From<sqlx::Pool<sqlx::Postgres>> for Pool<sqlx::Postgres> {
    fn from(pool: sqlx::Pool<sqlx::Postgres>) -> Self {
        Pool::Sqlx(pool)
    }
}

impl From<Kept<Sqlite>> for Pool<Sqlite> {
    fn from(kept: Kept<Sqlite>) -> Self {
        Pool::Kept(Arc::new(kept))
    }
}

impl<DB: Database> Connections<DB> {
    /// `pool`, exported as the `backend`'s in `metrics`, its operations bounded by
    /// the [`operation_limit`] of `statement_timeout`.
    pub(super) fn new(
        pool: impl Into<Pool<DB>>,
        metrics: &Metrics,
        backend: &str,
        statement_timeout: Duration,
    ) -> Self {
        let pool = pool.into();
        Self {
            wait: watch_pool(metrics, backend, &pool),
            pool,
            limit: operation_limit(statement_timeout),
        }
    }

    /// Longest authd waits for one operation's answer.
    pub(super) fn limit(&self) -> Duration {
        self.limit
    }

    /// Takes a connection from the pool, recording how long that took.
    pub(super) async fn lease(&self) -> Result<Lease<DB>, StoreError> {
        // A latency metric: how long the lease took, not the time of any rule.
        let started = Instant::now();
        let held = match &self.pool {
            Pool::Sqlx(pool) => pool.acquire().await.map(Held::Pooled),
            Pool::Kept(kept) => kept.acquire().await.map(Held::Kept),
        };
        self.wait.observe(started.elapsed().as_secs_f64());
        Ok(Lease { held: Some(held?) })
    }

    pub(super) async fn close(&self) {
        match &self.pool {
            Pool::Sqlx(pool) => pool.close().await,
            Pool::Kept(kept) => kept.close().await,
        }
    }
}

/// Exports a pool's connections (read at scrape time) and returns the histogram of
/// the wait for one, which the backend records when it acquires a connection.
fn watch_pool<DB: Database>(metrics: &Metrics, backend: &str, pool: &Pool<DB>) -> Histogram {
    let store = &metrics.store;
    (store.pool_max.with_label_values(&[backend])).set(pool.max() as i64);
    let in_use = store
        .pool_connections
        .with_label_values(&[backend, "in_use"]);
    let idle = store.pool_connections.with_label_values(&[backend, "idle"]);
    let pool = pool.clone();
    metrics.on_scrape(move || {
        let (size, free) = pool.sizes();
        // Two separate reads of a live pool: keep them consistent.
        let free = free.min(size);
        in_use.set((size - free) as i64);
        idle.set(free as i64);
    });
    store.pool_acquire.with_label_values(&[backend])
}

/// A pooled connection lent to one operation.
///
/// Given back with [`Lease::finish`] once the operation has an answer. Dropped
/// before that (the operation timed out, or its caller went away mid-query), the
/// connection is in an unknown state, possibly waiting on a peer that will never
/// answer: it is detached and closed, so the pool opens a fresh one, instead of
/// going back to the pool, whose release check (a ping) nothing would bound.
pub(super) struct Lease<DB: Database> {
    held: Option<Held<DB>>,
}

/// A connection of either kind of [`Pool`].
enum Held<DB: Database> {
    Pooled(PoolConnection<DB>),
    Kept(Lent<DB>),
}

impl<DB: Database> Lease<DB> {
    /// The operation is over: the connection goes back to the pool.
    pub(super) fn finish(mut self) {
        match self.held.take() {
            Some(Held::Pooled(conn)) => drop(conn),
            Some(Held::Kept(lent)) => lent.give_back(),
            None => {}
        }
    }

    fn held(&self) -> &Held<DB> {
        self.held
            .as_ref()
            .expect("a lease holds its connection until it ends")
    }
}

impl<DB: Database> Drop for Lease<DB> {
    fn drop(&mut self) {
        match self.held.take() {
            // Dropping the detached connection closes its socket without a goodbye.
            Some(Held::Pooled(conn)) => drop(conn.detach()),
            Some(Held::Kept(lent)) => lent.discard(),
            None => {}
        }
    }
}

impl<DB: Database> Deref for Lease<DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &Self::Target {
        match self.held() {
            Held::Pooled(conn) => conn,
            Held::Kept(lent) => &lent.conn,
        }
    }
}

impl<DB: Database> DerefMut for Lease<DB> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        match self
            .held
            .as_mut()
            .expect("a lease holds its connection until it ends")
        {
            Held::Pooled(conn) => conn,
            Held::Kept(lent) => &mut lent.conn,
        }
    }
}

/// How long authd itself waits for one statement, given the statement timeout:
/// the timeout plus as much again (at most a second), so that a database that
/// answers reports its own cancellation first, and one that does not (a dead or
/// unreachable peer) is given up on shortly after.
pub(crate) fn operation_limit(statement_timeout: Duration) -> Duration {
    statement_timeout + statement_timeout.min(Duration::from_secs(1))
}

/// Runs `operation` for at most `limit`. The outer error is the timeout (the
/// operation was dropped unfinished); the inner result is the operation's own.
pub(super) async fn within<T, E>(
    limit: Duration,
    operation: impl Future<Output = Result<T, E>>,
) -> Result<Result<T, E>, StoreError> {
    tokio::time::timeout(limit, operation).await.map_err(|_| {
        StoreError::Unavailable(format!(
            "the database did not answer within {}",
            humantime::format_duration(limit)
        ))
    })
}
