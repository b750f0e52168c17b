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

use super::{
    NewUser, StoreError, User, acquire, find_user_query, insert_user_query, sql, unix_millis,
    update_password_hash_query, user_from_row, watch_pool,
};
use crate::{credentials::Username, metrics::Metrics};
use anyhow::Context as _;
use prometheus::Histogram;
use sqlx::{
    PgPool, Postgres,
    pool::PoolConnection,
    postgres::{PgConnectOptions, PgPoolOptions},
};
use std::{fmt, str::FromStr, time::Duration};

/// How to reach PostgreSQL.
#[derive(Clone)]
pub struct PostgresSettings {
    /// A `postgres://` URL; it may hold a password, so it is never printed.
    pub url: String,
    pub max_connections: u32,
    pub acquire_timeout: Duration,
}

impl fmt::Debug for PostgresSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresSettings")
            .field("url", &"<redacted>")
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .finish()
    }
}

pub struct PostgresStore {
    pool: PgPool,
    /// Time waiting for a connection from the pool.
    pool_wait: Histogram,
}

async fn connect(settings: &PostgresSettings) -> anyhow::Result<PgPool> {
    let options = PgConnectOptions::from_str(&settings.url)
        .context("parsing the PostgreSQL URL")?
        .application_name("authd");
    PgPoolOptions::new()
        .max_connections(settings.max_connections.max(1))
        .acquire_timeout(settings.acquire_timeout)
        .connect_with(options)
        .await
        .context("connecting to PostgreSQL")
}

async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    // sqlx holds an advisory lock while it migrates, so replicas starting together
    // take turns instead of racing.
    sqlx::migrate!("migrations/postgres")
        .run(pool)
        .await
        .context("migrating the PostgreSQL database")
}

pub(crate) async fn migrate_only(settings: &PostgresSettings) -> anyhow::Result<()> {
    let pool = connect(settings).await?;
    migrate(&pool).await?;
    pool.close().await;
    Ok(())
}

impl PostgresStore {
    pub(crate) async fn open(
        settings: PostgresSettings,
        metrics: &Metrics,
    ) -> anyhow::Result<Self> {
        let pool = connect(&settings).await?;
        migrate(&pool).await?;
        let pool_wait = watch_pool(metrics, "postgres", &pool);
        Ok(Self { pool, pool_wait })
    }

    async fn connection(&self) -> Result<PoolConnection<Postgres>, StoreError> {
        acquire(&self.pool, &self.pool_wait).await
    }

    pub(crate) async fn insert_user(&self, user: NewUser) -> Result<(), StoreError> {
        let mut conn = self.connection().await?;
        let inserted = insert_user_query(&user, unix_millis())
            .execute(&mut *conn)
            .await?;
        if inserted.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StoreError::Duplicate)
        }
    }

    pub(crate) async fn find_user(&self, username: &Username) -> Result<Option<User>, StoreError> {
        let mut conn = self.connection().await?;
        let row = find_user_query(username).fetch_optional(&mut *conn).await?;
        Ok(row.as_ref().map(user_from_row).transpose()?)
    }

    pub(crate) async fn update_password_hash(
        &self,
        id: &str,
        hash: String,
    ) -> Result<(), StoreError> {
        let mut conn = self.connection().await?;
        update_password_hash_query(id, &hash, unix_millis())
            .execute(&mut *conn)
            .await?;
        Ok(())
    }

    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.connection().await?;
        sqlx::query(sql::PING).execute(&mut *conn).await?;
        Ok(())
    }

    pub(crate) async fn close(&self) {
        self.pool.close().await;
    }
}
