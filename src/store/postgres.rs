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
//! own shortly after (`connection::operation_limit`), for a peer that stopped
//! answering. Connecting and migrating are `connection`'s; the reads are written
//! once for both backends (`users`, `session`, `admin`, `factor`); what is here
//! are the writes.

use super::{
    StoreError,
    admin::{self, Account, Change, PageQuery, Revoked},
    connection::{Connections, PostgresSettings, connect_postgres, migrate_postgres, within},
    factor::{self, FactorAnswer, FactorWrite},
    session::{
        self, EndReason, Ended, LoggedOut, NewSession, Purged, Refreshed, Rotation, session_ops,
    },
    users::{self, NewUser, User, insert_user_query, password_hash_query},
};
use crate::{clock::Clock, credentials::Username, metrics::Metrics};
use sqlx::{Connection, PgConnection, Postgres};
use std::sync::Arc;

/// The session statements on a pooled connection.
mod ops {
    super::session_ops!(sqlx::PgConnection, sqlx::postgres::PgRow);
    super::admin::admin_ops!(sqlx::PgConnection);
    super::factor::factor_ops!(sqlx::PgConnection);
}

/// Runs `$body` (which uses `$tx`, a `&mut PgConnection`) in a transaction on a
/// pooled connection, bounded by the operation limit, and commits it.
macro_rules! in_transaction {
    ($store:expr, |$tx:ident| $body:expr) => {{
        let mut conn = $store.conns.lease().await?;
        let result = within($store.conns.limit(), async {
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

pub struct PostgresStore {
    conns: Connections<Postgres>,
    /// The time of a user's creation and of a rehash.
    clock: Arc<dyn Clock>,
}

impl PostgresStore {
    pub(crate) async fn open(
        settings: PostgresSettings,
        metrics: &Metrics,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Self> {
        migrate_postgres(&settings).await?;
        let pool = connect_postgres(&settings).await?;
        Ok(Self {
            conns: Connections::new(pool, metrics, "postgres", settings.statement_timeout),
            clock,
        })
    }

    pub(crate) async fn insert_user(&self, user: NewUser) -> Result<(), StoreError> {
        let mut conn = self.conns.lease().await?;
        let inserted = within(
            self.conns.limit(),
            insert_user_query(&user, self.clock.millis()).execute(&mut *conn),
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
        users::find(&self.conns, username).await
    }

    pub(crate) async fn update_password_hash(
        &self,
        id: &str,
        hash: String,
        version: i64,
    ) -> Result<(), StoreError> {
        let mut conn = self.conns.lease().await?;
        let updated = within(
            self.conns.limit(),
            password_hash_query(id, &hash, version, false, self.clock.millis()).execute(&mut *conn),
        )
        .await?;
        conn.finish();
        updated?;
        Ok(())
    }

    pub(crate) async fn max_hash_iterations(&self) -> Result<u32, StoreError> {
        users::max_hash_iterations(&self.conns).await
    }

    pub(crate) async fn insert_session(&self, session: NewSession) -> Result<bool, StoreError> {
        let mut conn = self.conns.lease().await?;
        let insert =
            session::bind_new_session(sqlx::query(session::sql::INSERT_SESSION_LOCKING), &session);
        let inserted = within(self.conns.limit(), insert.execute(&mut *conn)).await?;
        conn.finish();
        Ok(inserted?.rows_affected() == 1)
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

    /// The update takes the user's row lock first, as a password change does: a
    /// Login's insert (FOR SHARE) committed before, and its session is ended here,
    /// or it waits, and then finds the new version.
    pub(crate) async fn disable_user(
        &self,
        id: &str,
        reason: &str,
        now: i64,
    ) -> Result<Change<Revoked>, StoreError> {
        in_transaction!(self, |tx| ops::disable(tx, id, reason, now).await?)
    }

    pub(crate) async fn enable_user(&self, id: &str, now: i64) -> Result<Change<()>, StoreError> {
        in_transaction!(self, |tx| ops::enable(tx, id, now).await?)
    }

    pub(crate) async fn delete_user(
        &self,
        id: &str,
        now: i64,
    ) -> Result<Change<Revoked>, StoreError> {
        in_transaction!(self, |tx| ops::delete(tx, id, now).await?)
    }

    pub(crate) async fn purge_cutoffs(&self, before: i64, limit: i64) -> Result<u64, StoreError> {
        in_transaction!(self, |tx| ops::purge_cutoffs(tx, before, limit).await?)
    }

    pub(crate) async fn end_sessions_of(
        &self,
        user_id: &str,
        ids: Vec<String>,
        now: i64,
    ) -> Result<Vec<String>, StoreError> {
        in_transaction!(self, |tx| ops::end_sessions_of(tx, user_id, &ids, now)
            .await?)
    }

    /// The update takes the user's row lock first, as a password change does.
    pub(crate) async fn set_password(
        &self,
        user_id: &str,
        hash: String,
        end_sessions: bool,
        now: i64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        in_transaction!(self, |tx| ops::set_password(
            tx,
            user_id,
            &hash,
            end_sessions,
            now
        )
        .await?)
    }

    pub(crate) async fn factor_write(&self, w: FactorWrite) -> Result<FactorAnswer, StoreError> {
        in_transaction!(self, |tx| ops::factor_write(tx, &w).await?)
    }

    pub(crate) fn readers(&self) -> &Connections<Postgres> {
        &self.conns
    }

    pub(crate) async fn accounts_page(
        &self,
        query: &PageQuery,
        now: i64,
    ) -> Result<Vec<Account>, StoreError> {
        admin::page(&self.conns, admin::sql::PAGE_POSTGRES, query, now).await
    }

    pub(crate) async fn probe(&self) -> Result<u32, StoreError> {
        self.max_hash_iterations().await
    }

    pub(crate) async fn close(&self) {
        self.conns.close().await;
    }
}
