//! Where users are kept. [`Store`] is the one type the use cases see; which
//! database sits behind it (SQLite or PostgreSQL) is chosen by the URL at start.
//!
//! Both backends implement one trait (`backend::Backend`), every operation of the
//! store, and run the same statements through the same code (`db`); they differ in
//! how they write: SQLite through one batching writer task, PostgreSQL through its
//! pool, with uniqueness enforced by the database.
//!
//! Errors are classified once (`error`): a uniqueness conflict is
//! [`StoreError::Duplicate`], a database that cannot be reached is
//! [`StoreError::Unavailable`], the rest is unexpected and carries its cause for the
//! log.
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
//! Each file imports only files listed after it (and `error` and `db`, which every
//! file below `backend` may use); none imports this one.
//!
//! - this file: [`Store`], and the metrics and spans of every operation.
//! - `backend`: the `Backend` trait, every operation, which each backend implements;
//!   the reads and writes that are the same on both, written once over it.
//! - `sqlite`: the reader pool and the one batching writer task.
//! - `sqlite_lookups`: reads of users by name, gathered into batches.
//! - `sqlite_writes`: the transaction of the writer task's batch.
//! - `sqlite_runs`: runs of one statement sent to a connection as one query: the
//!   writer's consecutive inserts, the gathered reads of users.
//! - `postgres`: operations on a PostgreSQL pool, each write in a transaction.
//! - `writes`: each kind of write, what it came to, and how one is applied on a
//!   connection (both backends).
//! - `reset`: self-service password resets: the request, the completion that
//!   consumes it, and their events.
//! - `events`: the outbox: account events written in the transaction of their
//!   change, read in position order up to the frontier no lower position can
//!   still commit behind; retention; webhook endpoints' delivery state.
//! - `admin`: accounts as the admin API sees and changes them, and the per-user
//!   token cutoffs.
//! - `import`: users imported with the hashes they have, a batch in one
//!   transaction.
//! - `factor`: the second factor: TOTP factors, recovery codes, Login's challenges.
//! - `service`: service accounts and their credentials; their writes cut tokens
//!   off through the per-user cutoffs.
//! - `connection`: the backend choice and its settings, connect options, and the
//!   pools operations take a bounded connection from.
//! - `schema`: the migrations' two ledgers and the compatibility levels: what a
//!   release may run on, and whether a rollback is safe.
//! - `kept`: SQLite's read-only connections, lent without sqlx's pool checks.
//! - `users`: users' rows and statements, and their reads, written once for both
//!   backends.
//! - `session`: sessions' rows, statements and the rotation rule.
//! - `db`: the one executor type of every statement: a statement and its
//!   arguments, run on a connection of either backend or on a backend's pool; rows
//!   read by column.
//! - `error`: [`StoreError`], and how a database's errors are classified.

mod admin;
mod backend;
mod connection;
mod db;
mod error;
mod events;
mod factor;
mod import;
mod kept;
mod postgres;
mod reset;
mod schema;
mod service;
mod session;
mod sqlite;
mod sqlite_lookups;
mod sqlite_runs;
mod sqlite_writes;
mod users;
mod writes;

pub use admin::{Account, AccountKey, Change, Cutoff, PageQuery, Revoked, SessionInfo};
pub use backend::WriterSnapshot;
pub use connection::{PostgresSettings, SqliteSettings, StoreSettings};
pub use error::StoreError;
pub use events::{Event, Frontier, kind as event_kind};
pub use factor::{Factor, FactorAnswer, FactorWrite, LiveChallenge, Proof, Proved, Purpose};
pub use import::{ImportRecord, Imported};
pub use reset::{ResetAnswer, ResetWrite};
pub use schema::{EXT_HASH_LEVEL, RELEASES, SchemaState};
pub use service::{
    Added, CredentialKind, ServiceAccount, ServiceAnswer, ServiceCredential, ServiceKey,
    ServiceWrite,
};
pub use session::{
    EndReason, Ended, EndedSession, LiveSession, LoggedOut, NewSession, Purged, Refreshed, Rotation,
};
pub use users::{NewUser, Rehash, User};

use crate::{clock::Clock, credentials::Username, metrics::Metrics, otel};
use backend::{Backend, Op};
use prometheus::{Histogram, IntCounter};
use std::{sync::Arc, time::Instant};
use tokio::sync::watch;

/// The storage backend, chosen by the database URL, and its metrics.
pub struct Store {
    backend: Box<dyn Backend>,
    ops: Operations,
    /// Counts the operations that failed as unavailable; readiness watches it.
    unavailable: watch::Sender<u64>,
    /// Counts the writes this process committed: event streams wake on it.
    written: watch::Sender<u64>,
}

/// The metric handles of one operation, resolved when the store opens, and its name.
struct OperationMetrics {
    name: &'static str,
    duration: Histogram,
    unavailable: IntCounter,
    failed: IntCounter,
}

impl OperationMetrics {
    fn new(metrics: &Metrics, backend: &str, operation: &'static str) -> Self {
        let errors = &metrics.store.operation_errors;
        Self {
            name: operation,
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
    import_users: OperationMetrics,
    read_service: OperationMetrics,
    write_service: OperationMetrics,
    read_events: OperationMetrics,
    prune_events: OperationMetrics,
    read_reset: OperationMetrics,
    write_reset: OperationMetrics,
    webhook_state: OperationMetrics,
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
            import_users: OperationMetrics::new(metrics, backend, "import_users"),
            read_service: OperationMetrics::new(metrics, backend, "read_service"),
            write_service: OperationMetrics::new(metrics, backend, "write_service"),
            read_events: OperationMetrics::new(metrics, backend, "read_events"),
            prune_events: OperationMetrics::new(metrics, backend, "prune_events"),
            read_reset: OperationMetrics::new(metrics, backend, "read_reset"),
            write_reset: OperationMetrics::new(metrics, backend, "write_reset"),
            webhook_state: OperationMetrics::new(metrics, backend, "webhook_state"),
        }
    }
}

impl Store {
    /// Runs one operation of the backend, records its duration and failure, and
    /// announces a failure to reach the database.
    async fn timed<T>(&self, metrics: &OperationMetrics, op: Op<'_, T>) -> Result<T, StoreError> {
        // A latency metric: how long the operation took, not the time of any rule.
        let started = Instant::now();
        let mut span = otel::child(metrics.name);
        span.set("db.system", self.backend.db_system());
        span.set("db.operation.name", metrics.name);
        let result = op.await;
        metrics.record(started, &result);
        match &result {
            Err(StoreError::Unavailable(_)) => span.fail("database unavailable"),
            Err(StoreError::Other(_)) => span.fail("store error"),
            Ok(_) | Err(StoreError::Duplicate) => {}
        }
        drop(span);
        if matches!(result, Err(StoreError::Unavailable(_))) {
            self.unavailable.send_modify(|n| *n = n.wrapping_add(1));
        }
        result
    }

    /// Opens the database and brings its schema up to date; records into `metrics`.
    /// The times it writes of its own accord (a user's creation, a rehash, a
    /// session's end) read `clock`; every other operation is given its time by the
    /// caller.
    pub async fn open(
        settings: StoreSettings,
        metrics: &Metrics,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Self> {
        let backend: Box<dyn Backend> = match settings {
            StoreSettings::Sqlite(s) => {
                Box::new(sqlite::SqliteStore::open(s, metrics, clock).await?)
            }
            StoreSettings::Postgres(s) => {
                Box::new(postgres::PostgresStore::open(s, metrics, clock).await?)
            }
        };
        let ops = Operations::new(metrics, backend.name());
        Ok(Self {
            backend,
            ops,
            unavailable: watch::Sender::new(0),
            written: watch::Sender::new(0),
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

    /// How many users' passwords are in `password_hash_ext` (imported hashes behind a
    /// marker), read without changing anything: `authd migrate --check-rollback`.
    pub async fn ext_hash_users(settings: &StoreSettings) -> anyhow::Result<i64> {
        connection::read_ext_users(settings).await
    }

    /// Stores a new user; [`StoreError::Duplicate`] when the username is taken.
    pub async fn insert_user(&self, user: NewUser) -> Result<(), StoreError> {
        self.written(&self.ops.insert_user, self.backend.insert_user(user))
            .await
    }

    pub async fn find_user(&self, username: &Username) -> Result<Option<User>, StoreError> {
        self.timed(&self.ops.find_user, self.backend.find_user(username))
            .await
    }

    /// Stores a rehash of the same password, in one conditional statement: `true`
    /// when stored, `false` (nothing changed) when the user's password version or
    /// either hash column is no longer the one verified (another login's rehash,
    /// on any replica, or a password change came first).
    pub async fn update_password_hash(&self, rehash: Rehash) -> Result<bool, StoreError> {
        self.timed(
            &self.ops.update_password_hash,
            self.backend.update_password_hash(rehash),
        )
        .await
    }

    /// Stores a new session (Login) if the user's password is still at the version
    /// the login verified; `false` (nothing stored) when it is not. Atomic against
    /// a password change on any replica: the session is stored before the change
    /// (which then ends it) or not at all.
    pub async fn insert_session(&self, session: NewSession) -> Result<bool, StoreError> {
        self.timed(
            &self.ops.insert_session,
            self.backend.insert_session(session),
        )
        .await
    }

    /// Runs a Refresh: rotation, the retry rule, or reuse (see `session`).
    pub async fn rotate(&self, rotation: Rotation) -> Result<Refreshed, StoreError> {
        self.written(&self.ops.rotate_session, self.backend.rotate(rotation))
            .await
    }

    /// Logout by a refresh token's digest (see `session` for which tokens end what).
    pub async fn end_by_digest(
        &self,
        digest: &str,
        all: bool,
        now: i64,
        grace_ms: i64,
    ) -> Result<LoggedOut, StoreError> {
        self.written(
            &self.ops.end_sessions,
            self.backend.end_by_digest(digest, all, now, grace_ms),
        )
        .await
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
        self.written(
            &self.ops.end_sessions,
            self.backend.end_by_id(id, user_id, all, now),
        )
        .await
    }

    /// Stores a new password hash, if the password is still at `version` (the one
    /// verified), and ends every session of the user, in one transaction; returns
    /// the sessions ended, or `None` when the password had changed meanwhile.
    pub async fn change_password(
        &self,
        id: &str,
        hash: String,
        ext: Option<String>,
        version: i64,
        now: i64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        self.written(
            &self.ops.change_password,
            self.backend.change_password(id, hash, ext, version, now),
        )
        .await
    }

    /// Sessions ended after `after` (ended_at, id), in that order, at most `limit`
    /// (read through the readers: with SQLite's WAL they see every committed write).
    pub async fn ended_since(
        &self,
        after: (i64, &str),
        limit: i64,
    ) -> Result<Vec<EndedSession>, StoreError> {
        self.timed(
            &self.ops.ended_sessions,
            self.backend.ended_since(after, limit),
        )
        .await
    }

    /// Deletes up to `limit` sessions that expired by `now`, and up to `limit`
    /// that ended by `ended_before`.
    pub async fn purge_sessions(
        &self,
        now: i64,
        ended_before: i64,
        limit: i64,
    ) -> Result<Purged, StoreError> {
        self.timed(
            &self.ops.purge_sessions,
            self.backend.purge(now, ended_before, limit),
        )
        .await
    }

    /// The account `key` names, its live sessions counted at `now`.
    pub async fn account(&self, key: &AccountKey, now: i64) -> Result<Option<Account>, StoreError> {
        self.timed(&self.ops.get_account, self.backend.account(key, now))
            .await
    }

    /// A page of accounts in username order (byte order).
    pub async fn accounts_page(
        &self,
        query: &PageQuery,
        now: i64,
    ) -> Result<Vec<Account>, StoreError> {
        self.timed(
            &self.ops.list_accounts,
            self.backend.accounts_page(query, now),
        )
        .await
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
        self.written(
            &self.ops.disable_user,
            self.backend.disable_user(id, reason, now),
        )
        .await
    }

    /// Enables the account `id` again; its cutoff stays.
    pub async fn enable_user(&self, id: &str, now: i64) -> Result<Change<()>, StoreError> {
        self.written(&self.ops.enable_user, self.backend.enable_user(id, now))
            .await
    }

    /// Deletes the account `id`, its sessions and their refresh tokens, and writes
    /// its token cutoff at `now`, in one transaction.
    pub async fn delete_user(&self, id: &str, now: i64) -> Result<Change<Revoked>, StoreError> {
        self.written(&self.ops.delete_user, self.backend.delete_user(id, now))
            .await
    }

    /// The service account `key` names, with its credentials.
    pub async fn service_account(
        &self,
        key: &ServiceKey,
    ) -> Result<Option<ServiceAccount>, StoreError> {
        self.timed(&self.ops.read_service, self.backend.service_account(key))
            .await
    }

    /// Service accounts in name order after `after`, at most `limit`.
    pub async fn service_accounts_page(
        &self,
        after: &str,
        limit: i64,
    ) -> Result<Vec<ServiceAccount>, StoreError> {
        self.timed(
            &self.ops.read_service,
            self.backend.service_accounts_page(after, limit),
        )
        .await
    }

    /// The service account bound to a certificate identity (`issuer` `None`) or to
    /// an external issuer's subject.
    pub async fn service_account_by_identity(
        &self,
        issuer: Option<&str>,
        identity: &str,
    ) -> Result<Option<ServiceAccount>, StoreError> {
        self.timed(
            &self.ops.read_service,
            self.backend.service_account_by_identity(issuer, identity),
        )
        .await
    }

    /// A change of service accounts, in one transaction.
    pub async fn service_write(&self, write: ServiceWrite) -> Result<ServiceAnswer, StoreError> {
        self.timed(&self.ops.write_service, self.backend.service_write(write))
            .await
    }

    /// Cutoffs written after `after` (cutoff_at, user_id), in that order, at most
    /// `limit`.
    pub async fn cutoffs_since(
        &self,
        after: (i64, &str),
        limit: i64,
    ) -> Result<Vec<Cutoff>, StoreError> {
        self.timed(&self.ops.cutoffs, self.backend.cutoffs_since(after, limit))
            .await
    }

    /// The live sessions of `user_id` at `now`, newest first, at most `limit`.
    pub async fn live_sessions(
        &self,
        user_id: &str,
        now: i64,
        limit: i64,
    ) -> Result<Vec<SessionInfo>, StoreError> {
        self.timed(
            &self.ops.live_sessions,
            self.backend.live_sessions(user_id, now, limit),
        )
        .await
    }

    /// Ends the named live sessions of `user_id` (every one when `ids` is empty);
    /// returns those it ended.
    pub async fn end_sessions_of(
        &self,
        user_id: &str,
        ids: Vec<String>,
        now: i64,
    ) -> Result<Vec<String>, StoreError> {
        self.written(
            &self.ops.end_sessions_of,
            self.backend.end_sessions_of(user_id, ids, now),
        )
        .await
    }

    /// An administrator's new password hash for `user_id` (the next version; `ext`
    /// in the ext column, which `None` clears), and with `end_sessions` every live
    /// session ended, in one transaction; `None` when there is no such user.
    pub async fn set_password(
        &self,
        user_id: &str,
        hash: String,
        ext: Option<String>,
        end_sessions: bool,
        now: i64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        self.written(
            &self.ops.set_password,
            self.backend
                .set_password(user_id, hash, ext, end_sessions, now),
        )
        .await
    }

    /// The user of id `id`.
    pub async fn find_user_by_id(&self, id: &str) -> Result<Option<User>, StoreError> {
        self.timed(&self.ops.find_user_by_id, self.backend.find_user_by_id(id))
            .await
    }

    /// The TOTP factor of `user_id` (on or pending), if any.
    pub async fn factor(&self, user_id: &str) -> Result<Option<Factor>, StoreError> {
        self.timed(&self.ops.read_factor, self.backend.factor(user_id))
            .await
    }

    /// The Login challenge of `digest`, if it is live at `now` with fewer than `max`
    /// attempts taken.
    pub async fn live_challenge(
        &self,
        digest: &str,
        now: i64,
        max: i64,
    ) -> Result<Option<LiveChallenge>, StoreError> {
        self.timed(
            &self.ops.read_challenge,
            self.backend.live_challenge(digest, now, max),
        )
        .await
    }

    /// A write of the second factor, in one transaction (see `factor`).
    pub async fn factor_write(&self, write: FactorWrite) -> Result<FactorAnswer, StoreError> {
        self.written(&self.ops.write_factor, self.backend.factor_write(write))
            .await
    }

    /// Stores a batch of imported users in one transaction (on SQLite, in the
    /// writer's): what each record came to, in order.
    pub async fn import_users(
        &self,
        records: Vec<ImportRecord>,
    ) -> Result<Vec<Imported>, StoreError> {
        self.written(&self.ops.import_users, self.backend.import_users(records))
            .await
    }

    /// Deletes up to `limit` cutoffs written at or before `before`.
    pub async fn purge_cutoffs(&self, before: i64, limit: i64) -> Result<u64, StoreError> {
        self.timed(
            &self.ops.purge_cutoffs,
            self.backend.purge_cutoffs(before, limit),
        )
        .await
    }

    /// The highest PBKDF2 iteration count of any stored hash (0 with no users).
    pub async fn max_hash_iterations(&self) -> Result<u32, StoreError> {
        self.timed(
            &self.ops.max_hash_iterations,
            self.backend.max_hash_iterations(),
        )
        .await
    }

    /// Checks that the database answers a real query the way requests run theirs
    /// (same pool, same limits, the users table), and on SQLite that the writer
    /// commits: for readiness. Returns what the query read, the highest stored
    /// iteration count.
    pub async fn probe(&self) -> Result<u32, StoreError> {
        self.timed(&self.ops.probe, self.backend.probe()).await
    }

    /// A receiver whose value changes each time an operation fails because the
    /// database could not be reached or did not answer in time.
    pub fn unavailable_events(&self) -> watch::Receiver<u64> {
        self.unavailable.subscribe()
    }

    /// A receiver whose value changes after each write this process committed
    /// (which may have written events).
    pub fn writes(&self) -> watch::Receiver<u64> {
        self.written.subscribe()
    }

    /// Runs a write and, once it committed, wakes the event streams.
    async fn written<T>(&self, metrics: &OperationMetrics, op: Op<'_, T>) -> Result<T, StoreError> {
        let result = self.timed(metrics, op).await;
        if result.is_ok() {
            self.written.send_modify(|n| *n = n.wrapping_add(1));
        }
        result
    }

    /// The events after `after` up to `upto`, in position order, at most `limit`.
    pub async fn events_after(
        &self,
        after: i64,
        upto: i64,
        limit: i64,
    ) -> Result<Vec<Event>, StoreError> {
        self.timed(
            &self.ops.read_events,
            self.backend.events_after(after, upto, limit),
        )
        .await
    }

    /// The highest event position retention deleted (0: none).
    pub async fn events_pruned(&self) -> Result<i64, StoreError> {
        self.timed(&self.ops.read_events, self.backend.events_pruned())
            .await
    }

    /// How far an event reader may go now (see `events`).
    pub async fn event_frontier(&self) -> Result<Frontier, StoreError> {
        self.timed(&self.ops.read_events, self.backend.event_frontier())
            .await
    }

    /// Whether every transaction in progress in a frontier's snapshot has ended.
    pub async fn events_settled(&self, snapshot: &str) -> Result<bool, StoreError> {
        self.timed(&self.ops.read_events, self.backend.events_settled(snapshot))
            .await
    }

    /// Deletes up to `limit` events written before `before` or more than `keep`
    /// below the newest, oldest first; how many.
    pub async fn prune_events(
        &self,
        before: i64,
        keep: i64,
        limit: i64,
    ) -> Result<u64, StoreError> {
        self.timed(
            &self.ops.prune_events,
            self.backend.prune_events(before, keep, limit),
        )
        .await
    }

    /// The user whose reset `digest` is live at `now`.
    pub async fn live_reset(&self, digest: &str, now: i64) -> Result<Option<String>, StoreError> {
        self.timed(&self.ops.read_reset, self.backend.live_reset(digest, now))
            .await
    }

    /// A password reset's write, in one transaction with its events.
    pub async fn reset_write(&self, write: ResetWrite) -> Result<ResetAnswer, StoreError> {
        self.written(&self.ops.write_reset, self.backend.reset_write(write))
            .await
    }

    /// Takes (or renews) webhook `endpoint`'s lease for `owner` until `until`
    /// (starting a new endpoint after `start`): the position delivered up to, or
    /// `None` while another owner holds it. Not a change of any account: wakes no
    /// stream.
    pub async fn lease_webhook(
        &self,
        endpoint: &str,
        owner: &str,
        start: i64,
        now: i64,
        until: i64,
    ) -> Result<Option<i64>, StoreError> {
        let write = events::WebhookWrite::Lease {
            endpoint: endpoint.to_owned(),
            owner: owner.to_owned(),
            start,
            now,
            until,
        };
        self.timed(&self.ops.webhook_state, self.backend.webhook_write(write))
            .await
    }

    /// Records how far webhook `endpoint` got; `false` when `owner` lost its lease.
    pub async fn record_webhook(
        &self,
        endpoint: &str,
        owner: &str,
        position: i64,
        attempts: i64,
        now: i64,
        until: i64,
    ) -> Result<bool, StoreError> {
        let write = events::WebhookWrite::Record {
            endpoint: endpoint.to_owned(),
            owner: owner.to_owned(),
            position,
            attempts,
            now,
            until,
        };
        let kept = self
            .timed(&self.ops.webhook_state, self.backend.webhook_write(write))
            .await?;
        Ok(kept.is_some())
    }

    /// Gives webhook `endpoint`'s lease back, so another replica (or the next
    /// start) takes it at once.
    pub async fn release_webhook(&self, endpoint: &str, owner: &str) -> Result<(), StoreError> {
        let write = events::WebhookWrite::Release {
            endpoint: endpoint.to_owned(),
            owner: owner.to_owned(),
        };
        self.timed(&self.ops.webhook_state, self.backend.webhook_write(write))
            .await
            .map(|_| ())
    }

    /// Commits everything queued and closes the connections.
    pub async fn close(&self) {
        self.backend.close().await
    }

    /// Whether other processes may write to this database (PostgreSQL, shared by
    /// replicas); a SQLite file has one process, which knows all it writes.
    pub fn is_shared(&self) -> bool {
        self.backend.is_shared()
    }

    /// The SQLite writer's counters; `None` for other backends.
    pub fn writer_stats(&self) -> Option<WriterSnapshot> {
        self.backend.writer_stats()
    }
}
