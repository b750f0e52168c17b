//! PostgreSQL: a sqlx pool shared by every request, for replicas that share one
//! database.
//!
//! Uniqueness is the database's job (a UNIQUE constraint on the lowercased name),
//! so concurrent registrations on different replicas never race. A commit is
//! durable when PostgreSQL says so (its `synchronous_commit`). Connections are
//! bounded (`AUTHD_DB_MAX_CONNECTIONS`) and a request waits at most
//! `AUTHD_DB_ACQUIRE_TIMEOUT` for one, then fails with UNAVAILABLE. Each operation
//! takes its connection explicitly, so the wait for one is measured apart from the
//! query (`authd_store_pool_acquire_duration_seconds`): a pool too small for the
//! load shows there, not as a slow database.
//!
//! Every pooled connection runs with `statement_timeout` set
//! (`AUTHD_DB_STATEMENT_TIMEOUT`), so a statement stuck behind a lock is cancelled
//! by PostgreSQL and the connection stays usable; authd also stops waiting on its
//! own shortly after ([`super::operation_limit`]), for a peer that stopped answering.
//! Migrations run on a connection of their own without that timeout: rewriting a
//! large table may take longer than any request should.

use super::{
    Lease, NewUser, StoreError, User, acquire, find_user_query, insert_user_query,
    iterations_from_column, operation_limit, password_hash_query,
    session::{
        EndReason, Ended, EndedSession, LoggedOut, NewSession, Purged, Refreshed, Rotation,
        session_ops,
    },
    sql, unix_millis, user_from_row, watch_pool, within,
};
use crate::{credentials::Username, metrics::Metrics};
use anyhow::Context as _;
use prometheus::Histogram;
use sqlx::{
    Connection, PgConnection, PgPool, Postgres,
    postgres::{PgConnectOptions, PgPoolOptions},
};
use std::{fmt, str::FromStr, time::Duration};

/// The session statements on a pooled connection.
mod ops {
    super::session_ops!(
        sqlx::PgConnection,
        sqlx::postgres::PgRow,
        crate::store::session::sql::INSERT_SESSION_LOCKING
    );
}

/// Runs `$body` (which uses `$tx`, a `&mut PgConnection`) in a transaction on a
/// pooled connection, bounded by the operation limit, and commits it.
macro_rules! in_transaction {
    ($store:expr, |$tx:ident| $body:expr) => {{
        let mut conn = $store.connection().await?;
        let result = within($store.limit, async {
            let mut transaction = conn.begin().await?;
            let value = {
                let $tx: &mut PgConnection = &mut transaction;
                $body
            };
            transaction.commit().await?;
            Ok::<_, sqlx::Error>(value)
        })
        .await?;
        conn.finish();
        result.map_err(StoreError::from)
    }};
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

pub struct PostgresStore {
    pool: PgPool,
    /// Time waiting for a connection from the pool.
    pool_wait: Histogram,
    /// Longest authd waits for one statement's answer.
    limit: Duration,
}

fn connect_options(settings: &PostgresSettings) -> anyhow::Result<PgConnectOptions> {
    Ok(PgConnectOptions::from_str(&settings.url)
        .context("parsing the PostgreSQL URL")?
        .application_name("authd"))
}

async fn connect(settings: &PostgresSettings) -> anyhow::Result<PgPool> {
    // Whole milliseconds, at least one: PostgreSQL reads 0 as "no timeout".
    let timeout_ms = settings.statement_timeout.as_millis().max(1);
    let options =
        connect_options(settings)?.options([("statement_timeout", format!("{timeout_ms}ms"))]);
    PgPoolOptions::new()
        .max_connections(settings.max_connections.max(1))
        .acquire_timeout(settings.acquire_timeout)
        .connect_with(options)
        .await
        .context("connecting to PostgreSQL")
}

async fn migrate(settings: &PostgresSettings) -> anyhow::Result<()> {
    let mut conn = PgConnection::connect_with(&connect_options(settings)?)
        .await
        .context("connecting to PostgreSQL")?;
    // sqlx holds an advisory lock while it migrates, so replicas starting together
    // take turns instead of racing.
    sqlx::migrate!("migrations/postgres")
        .run(&mut conn)
        .await
        .context("migrating the PostgreSQL database")?;
    conn.close()
        .await
        .context("closing the migration connection")
}

pub(crate) async fn migrate_only(settings: &PostgresSettings) -> anyhow::Result<()> {
    migrate(settings).await
}

impl PostgresStore {
    pub(crate) async fn open(
        settings: PostgresSettings,
        metrics: &Metrics,
    ) -> anyhow::Result<Self> {
        migrate(&settings).await?;
        let pool = connect(&settings).await?;
        let pool_wait = watch_pool(metrics, "postgres", &pool);
        Ok(Self {
            pool,
            pool_wait,
            limit: operation_limit(settings.statement_timeout),
        })
    }

    async fn connection(&self) -> Result<Lease<Postgres>, StoreError> {
        acquire(&self.pool, &self.pool_wait).await
    }

    pub(crate) async fn insert_user(&self, user: NewUser) -> Result<(), StoreError> {
        let mut conn = self.connection().await?;
        let inserted = within(
            self.limit,
            insert_user_query(&user, unix_millis()).execute(&mut *conn),
        )
        .await?;
        conn.finish();
        if inserted?.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::Duplicate)
        }
    }

    pub(crate) async fn find_user(&self, username: &Username) -> Result<Option<User>, StoreError> {
        let mut conn = self.connection().await?;
        let row = within(
            self.limit,
            find_user_query(username).fetch_optional(&mut *conn),
        )
        .await?;
        conn.finish();
        Ok(row?.as_ref().map(user_from_row).transpose()?)
    }

    pub(crate) async fn update_password_hash(
        &self,
        id: &str,
        hash: String,
        version: i64,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection().await?;
        let updated = within(
            self.limit,
            password_hash_query(id, &hash, version, false, unix_millis()).execute(&mut *conn),
        )
        .await?;
        conn.finish();
        updated?;
        Ok(())
    }

    pub(crate) async fn max_hash_iterations(&self) -> Result<u32, StoreError> {
        let mut conn = self.connection().await?;
        let max = within(
            self.limit,
            sqlx::query_scalar::<_, Option<i64>>(sql::MAX_HASH_ITERATIONS).fetch_one(&mut *conn),
        )
        .await?;
        conn.finish();
        Ok(iterations_from_column(max?))
    }

    pub(crate) async fn insert_session(&self, session: NewSession) -> Result<bool, StoreError> {
        let mut conn = self.connection().await?;
        let inserted = within(self.limit, ops::insert_session(&mut conn, &session)).await?;
        conn.finish();
        Ok(inserted?)
    }

    pub(crate) async fn rotate(&self, rotation: Rotation) -> Result<Refreshed, StoreError> {
        in_transaction!(self, |tx| ops::rotate(tx, &rotation).await?)
    }

    pub(crate) async fn end_by_digest(
        &self,
        digest: &str,
        all: bool,
        now: i64,
        grace_ms: i64,
    ) -> Result<LoggedOut, StoreError> {
        in_transaction!(self, |tx| ops::end_by_digest(
            tx, digest, all, now, grace_ms
        )
        .await?)
    }

    pub(crate) async fn end_by_id(
        &self,
        id: &str,
        user_id: &str,
        all: bool,
        now: i64,
    ) -> Result<Option<Ended>, StoreError> {
        in_transaction!(self, |tx| ops::end_by_id(tx, id, user_id, all, now).await?)
    }

    pub(crate) async fn change_password(
        &self,
        id: &str,
        hash: String,
        version: i64,
        now: i64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        // The update takes the user's row lock first: a Login's insert (which locks
        // it FOR SHARE) either committed before, and its session is ended below, or
        // waits, and then finds the new version.
        in_transaction!(self, |tx| {
            let changed = password_hash_query(id, &hash, version, true, now)
                .execute(&mut *tx)
                .await?
                .rows_affected()
                == 1;
            if changed {
                Some(ops::end_user_sessions(tx, id, EndReason::PasswordChange, now).await?)
            } else {
                None
            }
        })
    }

    pub(crate) async fn purge(
        &self,
        now: i64,
        ended_before: i64,
        limit: i64,
    ) -> Result<Purged, StoreError> {
        in_transaction!(self, |tx| ops::purge(tx, now, ended_before, limit).await?)
    }

    pub(crate) async fn ended_since(
        &self,
        after: (i64, &str),
        limit: i64,
    ) -> Result<Vec<EndedSession>, StoreError> {
        let mut conn = self.connection().await?;
        let rows = within(self.limit, ops::ended_since(&mut conn, after, limit)).await?;
        conn.finish();
        Ok(rows?)
    }

    pub(crate) async fn probe(&self) -> Result<u32, StoreError> {
        self.max_hash_iterations().await
    }

    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }
}
