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
//! answering. Connecting and migrating are `connection`'s; the reads and the
//! writes are written once for both backends (`users`, `session`, `admin`,
//! `factor`, `writes`); what is here is how PostgreSQL runs them: each write in a
//! transaction of its own ([`PostgresStore::transaction`]), the inserts alone.

use super::{
    admin::{self, Account, PageQuery},
    backend::{Backend, Op},
    connection::{Connections, PostgresSettings, connect_postgres, migrate_postgres, within},
    db::{Conn, Conns, Statement},
    error::StoreError,
    events::{self, registered},
    session::{NewSession, new_session_args, sql::INSERT_SESSION_LOCKING},
    users::{self, NewUser, Rehash, User, new_user_args},
    writes::{Answer, Write, apply_one},
};
use crate::{clock::Clock, credentials::Username, metrics::Metrics};
use futures_util::future::BoxFuture;
use sqlx::{Connection, Postgres};
use std::sync::Arc;

pub struct PostgresStore {
    conns: Connections<Postgres>,
    /// The time of a write: a user's creation, a rehash, a session's end.
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

    /// Applies `write` in a transaction on a pooled connection, bounded by the
    /// operation limit, and commits it. A write that changes a user's password or
    /// state takes the user's row lock first: a Login's insert (which locks it FOR
    /// SHARE) either committed before, and its session is ended by the write, or
    /// waits, and then finds the new version.
    async fn transaction(&self, write: Write) -> Result<Answer, StoreError> {
        let mut conn = self.conns.lease().await?;
        let result = within(self.conns.limit(), async {
            let mut transaction = conn.begin().await?;
            let answer = apply_one(
                &mut Conn::Postgres(&mut transaction),
                &write,
                self.clock.millis(),
            )
            .await?;
            transaction.commit().await?;
            Ok::<_, sqlx::Error>(answer)
        })
        .await?;
        conn.finish();
        result?
    }

    async fn insert(&self, user: NewUser) -> Result<(), StoreError> {
        // The user and its event in one statement (`events`).
        let event = registered(&user);
        let statement = Statement::new(events::sql::INSERT_USER_POSTGRES)
            .bind_all(new_user_args(&user, self.clock.millis()))
            .bind(event.kind)
            .bind(event.data.to_string());
        let inserted = self.conns().execute(statement).await?;
        if inserted == 1 {
            Ok(())
        } else {
            Err(StoreError::Duplicate)
        }
    }
}

impl Backend for PostgresStore {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn db_system(&self) -> &'static str {
        "postgresql"
    }

    /// Shared by replicas.
    fn is_shared(&self) -> bool {
        true
    }

    fn conns(&self) -> Conns<'_> {
        Conns::Postgres(&self.conns)
    }

    fn apply(&self, write: Write) -> Op<'_, Answer> {
        Box::pin(self.transaction(write))
    }

    fn insert_user(&self, user: NewUser) -> Op<'_, ()> {
        Box::pin(self.insert(user))
    }

    fn find_user<'a>(&'a self, username: &'a Username) -> Op<'a, Option<User>> {
        Box::pin(users::find(self.conns(), username))
    }

    /// One statement, alone: a failure changes nothing else.
    fn update_password_hash(&self, rehash: Rehash) -> Op<'_, bool> {
        Box::pin(async move {
            let statement = users::rehash(&rehash, self.clock.millis());
            Ok(self.conns().execute(statement).await? == 1)
        })
    }

    /// The locking form of Login's insert (see `session::sql`).
    fn insert_session(&self, session: NewSession) -> Op<'_, bool> {
        Box::pin(async move {
            let statement =
                Statement::new(INSERT_SESSION_LOCKING).bind_all(new_session_args(&session));
            Ok(self.conns().execute(statement).await? == 1)
        })
    }

    fn accounts_page<'a>(&'a self, query: &'a PageQuery, now: i64) -> Op<'a, Vec<Account>> {
        Box::pin(admin::page(
            self.conns(),
            admin::sql::PAGE_POSTGRES,
            query,
            now,
        ))
    }

    fn probe(&self) -> Op<'_, u32> {
        self.max_hash_iterations()
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.conns.close())
    }
}
