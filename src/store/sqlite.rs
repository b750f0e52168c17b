//! SQLite: WAL, `synchronous=FULL`, a pool of read-only connections, and one writer
//! task that owns the only write connection.
//!
//! SQLite allows one writer at a time, and every commit costs an fsync. Instead of
//! letting requests contend for the write lock (and wait in `busy_timeout`), writes
//! go through a channel to the writer task, which takes everything queued (after
//! letting the requests about to run queue theirs) and commits it in one
//! transaction: one fsync for many registrations (group commit). A write is
//! acknowledged only after its transaction commits, so an acknowledged registration
//! survives a crash or a power loss. Readers never wait for the writer (WAL).
//!
//! Every read and every write is bounded (`connection::operation_limit` of
//! `AUTHD_DB_STATEMENT_TIMEOUT`): a disk that stalls makes requests fail with
//! UNAVAILABLE instead of hanging. A write given up on may still commit later (the
//! writer finishes what it started), as with any database that stops answering.
//!
//! The database holds password hashes: `connection` opens it (file permissions, WAL,
//! migrations). The reads are written once for both backends (`users`, `session`,
//! `admin`, `factor`) and run on the reader pool, but for the reads of users by
//! name, which are gathered into batches (`sqlite_lookups`); what is here is the
//! writer task and `SqliteStore`'s implementation of `backend::Backend` (each kind of
//! write is `writes`'s, the transaction of a batch `sqlite_writes`'s, sending runs of
//! inserts as `sqlite_runs` does).

use super::{
    admin::{self, Account, PageQuery},
    backend::{Backend, Op, WriterSnapshot},
    connection::{
        Connections, SqliteSettings, open_sqlite_readers, open_sqlite_writer, operation_limit,
        within,
    },
    db::Conns,
    error::{StoreError, closed},
    session::NewSession,
    sqlite_lookups::Lookups,
    sqlite_runs::take_queued,
    sqlite_writes::{Reply, apply},
    users::{self, NewUser, Rehash, User},
    writes::{Answer, Write},
};
use crate::{clock::Clock, credentials::Username, metrics::Metrics};
use futures_util::future::BoxFuture;
use prometheus::Histogram;
use sqlx::{Connection as _, Sqlite, SqliteConnection};
use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

#[derive(Default)]
struct WriterStats {
    transactions: AtomicU64,
    writes: AtomicU64,
    largest_batch: AtomicU64,
}

/// What the writer runs to answer a ping once what came before has committed.
const PING: &str = "SELECT 1";

enum Command {
    Write {
        write: Write,
        reply: oneshot::Sender<Result<Answer, StoreError>>,
    },
    /// Answered by the writer once it has committed what came before.
    Ping(oneshot::Sender<Result<(), StoreError>>),
    /// Commit what came before, close the connection, stop.
    Close(oneshot::Sender<()>),
}

pub struct SqliteStore {
    /// The read-only connections.
    readers: Arc<Connections<Sqlite>>,
    /// Reads of users by name, gathered (`sqlite_lookups`).
    lookups: Lookups,
    lookups_task: Mutex<Option<JoinHandle<()>>>,
    writer: mpsc::Sender<Command>,
    writer_task: Mutex<Option<JoinHandle<()>>>,
    stats: Arc<WriterStats>,
    /// Longest authd waits for a read, or for the writer to answer.
    limit: Duration,
}

/// What the writer task records: the size and the duration of each transaction.
struct WriterMetrics {
    batch_size: Histogram,
    commit: Histogram,
}

impl SqliteStore {
    /// The writer reads `clock` for the time of a write (a user's creation, a rehash,
    /// a session's end).
    pub(crate) async fn open(
        settings: SqliteSettings,
        metrics: &Metrics,
        clock: Arc<dyn Clock>,
    ) -> anyhow::Result<Self> {
        // The writer connection comes first: it creates the file and migrates it.
        let conn = open_sqlite_writer(&settings).await?;
        let readers = open_sqlite_readers(&settings).await?;
        let (tx, rx) = mpsc::channel(4096);
        let stats = Arc::new(WriterStats::default());
        let writer_metrics = WriterMetrics {
            batch_size: metrics.store.sqlite_batch_size.clone(),
            commit: metrics.store.sqlite_commit.clone(),
        };
        let task = tokio::spawn(run_writer(
            conn,
            rx,
            settings.max_batch.max(1),
            stats.clone(),
            writer_metrics,
            clock,
        ));
        let readers = Arc::new(Connections::new(
            readers,
            metrics,
            "sqlite",
            settings.statement_timeout,
        ));
        let limit = operation_limit(settings.statement_timeout);
        let (lookups, lookups_task) = Lookups::start(readers.clone(), limit);
        Ok(Self {
            readers,
            lookups,
            lookups_task: Mutex::new(Some(lookups_task)),
            writer: tx,
            writer_task: Mutex::new(Some(task)),
            stats,
            limit: operation_limit(settings.statement_timeout),
        })
    }

    async fn write(&self, write: Write) -> Result<Answer, StoreError> {
        let (reply, result) = oneshot::channel();
        within(self.limit, async {
            self.writer
                .send(Command::Write { write, reply })
                .await
                .map_err(|_| closed())?;
            result.await.unwrap_or_else(|_| Err(closed()))
        })
        .await?
    }

    /// A read through the reader pool, then a round trip through the writer (which
    /// answers once it has committed what was queued before).
    async fn probe_now(&self) -> Result<u32, StoreError> {
        let max = users::max_hash_iterations(self.conns()).await?;
        let (reply, result) = oneshot::channel();
        within(self.limit, async {
            self.writer
                .send(Command::Ping(reply))
                .await
                .map_err(|_| closed())?;
            result.await.unwrap_or_else(|_| Err(closed()))
        })
        .await??;
        Ok(max)
    }

    async fn close_now(&self) {
        let task = self.writer_task.lock().expect("writer task lock").take();
        let Some(task) = task else { return };
        let (reply, done) = oneshot::channel();
        if self.writer.send(Command::Close(reply)).await.is_ok() {
            let _ = done.await;
        }
        if let Err(e) = task.await {
            tracing::error!(error = %e, "the SQLite writer task failed");
        }
        // Lookups still queued are refused; batches under way finish or fail as the
        // readers close.
        let gathering = self.lookups_task.lock().expect("lookups task lock").take();
        if let Some(gathering) = gathering {
            gathering.abort();
            let _ = gathering.await;
        }
        self.readers.close().await;
    }
}

impl Backend for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn db_system(&self) -> &'static str {
        "sqlite"
    }

    /// A SQLite file has one process, which knows all it writes.
    fn is_shared(&self) -> bool {
        false
    }

    fn conns(&self) -> Conns<'_> {
        Conns::Sqlite(&self.readers)
    }

    /// Queued to the writer task, which applies it in its next batch's transaction.
    fn apply(&self, write: Write) -> Op<'_, Answer> {
        Box::pin(self.write(write))
    }

    fn insert_user(&self, user: NewUser) -> Op<'_, ()> {
        Box::pin(async move { self.write(Write::Insert(user)).await.map(drop) })
    }

    /// Gathered with the other lookups queued meanwhile (`sqlite_lookups`).
    fn find_user<'a>(&'a self, username: &'a Username) -> Op<'a, Option<User>> {
        Box::pin(self.lookups.find(username))
    }

    fn update_password_hash(&self, rehash: Rehash) -> Op<'_, bool> {
        Box::pin(async move { self.write(Write::Rehash(rehash)).await?.take() })
    }

    fn insert_session(&self, session: NewSession) -> Op<'_, bool> {
        Box::pin(async move { self.write(Write::InsertSession(session)).await?.take() })
    }

    fn accounts_page<'a>(&'a self, query: &'a PageQuery, now: i64) -> Op<'a, Vec<Account>> {
        Box::pin(admin::page(
            self.conns(),
            admin::sql::PAGE_SQLITE,
            query,
            now,
        ))
    }

    fn probe(&self) -> Op<'_, u32> {
        Box::pin(self.probe_now())
    }

    fn close(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.close_now())
    }

    fn writer_stats(&self) -> Option<WriterSnapshot> {
        Some(WriterSnapshot {
            transactions: self.stats.transactions.load(Ordering::Relaxed),
            writes: self.stats.writes.load(Ordering::Relaxed),
            largest_batch: self.stats.largest_batch.load(Ordering::Relaxed),
        })
    }
}

async fn run_writer(
    mut conn: SqliteConnection,
    mut commands: mpsc::Receiver<Command>,
    max_batch: usize,
    stats: Arc<WriterStats>,
    metrics: WriterMetrics,
    clock: Arc<dyn Clock>,
) {
    let mut received = Vec::with_capacity(max_batch);
    let mut batch = Vec::with_capacity(max_batch);
    let mut close_reply = None;
    while close_reply.is_none() {
        // On a busy runtime the writes queued meanwhile join this transaction
        // instead of waiting for the next (one fsync and one write of each page for
        // all of them); on an idle one the commit starts at once.
        if !take_queued(&mut commands, &mut received, max_batch).await {
            break; // every sender is gone
        }
        let mut pings = Vec::new();
        for command in received.drain(..) {
            match command {
                Command::Write { write, reply } => batch.push((write, reply)),
                Command::Ping(reply) => pings.push(reply),
                Command::Close(reply) => {
                    close_reply = Some(reply);
                    break;
                }
            }
        }
        if !batch.is_empty() {
            commit(&mut conn, &mut batch, &stats, &metrics, clock.millis()).await;
        }
        for ping in pings {
            let result = sqlx::query(PING)
                .execute(&mut conn)
                .await
                .map(|_| ())
                .map_err(StoreError::from);
            let _ = ping.send(result);
        }
    }
    // Refuse what arrived after Close, so no caller waits forever.
    commands.close();
    while let Ok(command) = commands.try_recv() {
        if let Command::Write { reply, .. } = command {
            let _ = reply.send(Err(closed()));
        }
    }
    if let Err(e) = conn.close().await {
        tracing::warn!(error = %e, "closing the SQLite write connection failed");
    }
    if let Some(reply) = close_reply {
        let _ = reply.send(());
    }
}

type Pending = (Write, Reply);

/// Commits a batch in one transaction and answers every write in it.
async fn commit(
    conn: &mut SqliteConnection,
    batch: &mut Vec<Pending>,
    stats: &WriterStats,
    metrics: &WriterMetrics,
    now: i64,
) {
    let size = batch.len() as u64;
    metrics.batch_size.observe(size as f64);
    // A latency metric: how long the commit took, not the time of any rule.
    let started = Instant::now();
    match apply(conn, batch, now).await {
        Ok(outcomes) => {
            metrics.commit.observe(started.elapsed().as_secs_f64());
            stats.transactions.fetch_add(1, Ordering::Relaxed);
            stats.writes.fetch_add(size, Ordering::Relaxed);
            stats.largest_batch.fetch_max(size, Ordering::Relaxed);
            for ((_, reply), outcome) in batch.drain(..).zip(outcomes) {
                let _ = reply.send(outcome);
            }
        }
        Err(e) => {
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
            tracing::error!(error = %e, writes = size, "an SQLite write transaction failed");
            // Every write of the batch fails the same way; StoreError is not Clone.
            let e = StoreError::from(e);
            for (_, reply) in batch.drain(..) {
                let err = e.for_each_of_many("an SQLite write transaction failed");
                let _ = reply.send(Err(err));
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::store::session;
    use futures::future::join_all;

    pub(in crate::store) async fn open(dir: &tempfile::TempDir) -> SqliteStore {
        open_with(dir, &Metrics::new()).await
    }

    pub(in crate::store) async fn open_with(
        dir: &tempfile::TempDir,
        metrics: &Metrics,
    ) -> SqliteStore {
        SqliteStore::open(settings(dir), metrics, Arc::new(crate::clock::SystemClock))
            .await
            .unwrap()
    }

    /// A database in `dir`: two readers, batches of at most 64 writes.
    pub(in crate::store) fn settings(dir: &tempfile::TempDir) -> SqliteSettings {
        SqliteSettings {
            path: dir.path().join("t.db"),
            readers: 2,
            acquire_timeout: Duration::from_secs(5),
            max_batch: 64,
            statement_timeout: Duration::from_secs(5),
        }
    }

    pub(in crate::store) fn user(i: usize, name: &str) -> NewUser {
        NewUser {
            id: format!("id-{i}"),
            username: Username::parse(name).unwrap(),
            password_hash: format!("hash-{i}"),
            password_hash_ext: None,
        }
    }

    // On a current-thread runtime every insert is queued before the writer runs,
    // so they all land in one batch.
    #[tokio::test(flavor = "current_thread")]
    async fn duplicates_within_one_batch_have_exactly_one_winner() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let results = join_all((0..10).map(|i| store.insert_user(user(i, "Same")))).await;
        let winners = results.iter().filter(|r| r.is_ok()).count();
        let duplicates = results
            .iter()
            .filter(|r| matches!(r, Err(StoreError::Duplicate)))
            .count();
        assert_eq!((winners, duplicates), (1, 9), "{results:?}");
        let stats = store.writer_stats().unwrap();
        assert_eq!(stats.transactions, 1);
        assert_eq!(stats.largest_batch, 10);
        let found = store
            .find_user(&Username::parse("SAME").unwrap())
            .await
            .unwrap()
            .unwrap();
        let winner = results.iter().position(|r| r.is_ok()).unwrap();
        assert_eq!(found.id, format!("id-{winner}"));
        store.close().await;
    }

    /// A rehash of user `i` (see [`user`]) from `verified` to `hash`.
    fn rehash(i: usize, verified: &str, hash: &str) -> Rehash {
        Rehash {
            user_id: format!("id-{i}"),
            hash: hash.into(),
            ext: None,
            version: 0,
            verified_hash: verified.into(),
            verified_ext: None,
        }
    }

    // A rehash the database refuses fails alone: the other writes of its batch, a
    // registration and other rehashes, commit in the same transaction.
    #[tokio::test(flavor = "current_thread")]
    async fn a_rehash_that_fails_fails_alone_in_its_batch() {
        use sqlx::{Connection as _, SqliteConnection, sqlite::SqliteConnectOptions};
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        for i in 1..=3 {
            store
                .insert_user(user(i, &format!("user{i}")))
                .await
                .unwrap();
        }
        let options = SqliteConnectOptions::new().filename(dir.path().join("t.db"));
        let mut conn = SqliteConnection::connect_with(&options).await.unwrap();
        sqlx::query(
            "CREATE TRIGGER refuse BEFORE UPDATE OF password_hash ON users \
             WHEN OLD.id = 'id-1' BEGIN SELECT RAISE(ABORT, 'refused'); END",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
        let before = store.writer_stats().unwrap().transactions;
        let (refused, inserted, stale, stored) = tokio::join!(
            store.update_password_hash(rehash(1, "hash-1", "new-1")),
            store.insert_user(user(4, "user4")),
            store.update_password_hash(rehash(2, "not-hash-2", "new-2")),
            store.update_password_hash(rehash(3, "hash-3", "new-3")),
        );
        assert!(matches!(refused, Err(StoreError::Other(_))), "{refused:?}");
        inserted.unwrap();
        assert!(!stale.unwrap(), "the hash verified is no longer the user's");
        assert!(stored.unwrap());
        assert_eq!(store.writer_stats().unwrap().transactions, before + 1);
        for (name, hash) in [
            ("user1", "hash-1"),
            ("user2", "hash-2"),
            ("user3", "new-3"),
            ("user4", "hash-4"),
        ] {
            let found = store.find_user(&Username::parse(name).unwrap()).await;
            assert_eq!(found.unwrap().unwrap().password_hash, hash, "{name}");
        }
        store.close().await;
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_batch_commits_many_writes_in_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let store = open_with(&dir, &metrics).await;
        let results =
            join_all((0..100).map(|i| store.insert_user(user(i, &format!("user{i}"))))).await;
        assert!(results.iter().all(Result::is_ok));
        let stats = store.writer_stats().unwrap();
        assert_eq!(stats.writes, 100);
        // At most 64 per batch: two transactions.
        assert_eq!(stats.transactions, 2);
        let batches = &metrics.store.sqlite_batch_size;
        assert_eq!(batches.get_sample_count(), 2);
        assert_eq!(batches.get_sample_sum(), 100.0);
        assert_eq!(metrics.store.sqlite_commit.get_sample_count(), 2);
        store
            .find_user(&Username::parse("user1").unwrap())
            .await
            .unwrap();
        let text = metrics.render();
        for line in [
            r#"authd_store_pool_acquire_duration_seconds_count{backend="sqlite"} 1"#,
            r#"authd_store_pool_max_connections{backend="sqlite"} 2"#,
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        store.close().await;
    }

    // The second insert comes from a task woken only after the first insert has woken
    // the writer, so it runs after the writer has taken the first: the writer lets
    // it queue its insert (one yield) and commits both at once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_write_queued_while_the_writer_starts_joins_its_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(open(&dir).await);
        let (go, ready) = oneshot::channel::<()>();
        let second = tokio::spawn({
            let store = store.clone();
            async move {
                ready.await.unwrap();
                store.insert_user(user(2, "second")).await
            }
        });
        let first = tokio::spawn({
            let store = store.clone();
            async move {
                let insert = store.insert_user(user(1, "first"));
                tokio::pin!(insert);
                // Queued to the writer (which is woken), not yet answered.
                assert!(futures::poll!(&mut insert).is_pending());
                go.send(()).unwrap();
                insert.await
            }
        });
        first.await.unwrap().unwrap();
        second.await.unwrap().unwrap();
        let stats = store.writer_stats().unwrap();
        assert_eq!((stats.writes, stats.transactions), (2, 1), "{stats:?}");
        store.close().await;
    }

    /// The indexes on `previous_digest` and `ended_at` hold only the rows that have
    /// one, and every query that needs them still uses them.
    #[tokio::test]
    async fn the_partial_session_indexes_serve_their_queries() {
        use sqlx::Row as _;
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(dir.path().join("t.db"));
        let mut conn = SqliteConnection::connect_with(&options).await.unwrap();
        for (query, index) in [
            (session::sql::FIND_BY_PREVIOUS, "sessions_previous_digest"),
            (session::sql::ENDED_SINCE, "sessions_ended_at"),
            (session::sql::PURGE_ENDED, "sessions_ended_at"),
        ] {
            let plan: Vec<String> =
                sqlx::query(sqlx::AssertSqlSafe(format!("EXPLAIN QUERY PLAN {query}")))
                    .fetch_all(&mut conn)
                    .await
                    .unwrap()
                    .iter()
                    .map(|row| row.get::<String, _>("detail"))
                    .collect();
            assert!(
                plan.iter().any(|step| step.contains(index)),
                "{query}: {plan:?}"
            );
        }
        for index in ["sessions_previous_digest", "sessions_ended_at"] {
            let sql: String = sqlx::query_scalar("SELECT sql FROM sqlite_schema WHERE name = $1")
                .bind(index)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            assert!(sql.contains("IS NOT NULL"), "{sql}");
        }
        conn.close().await.unwrap();
        store.close().await;
    }

    // Only the writer commits, so only its connection checkpoints.
    #[tokio::test]
    async fn the_writer_checkpoints_the_wal_every_ten_thousand_pages() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open_sqlite_writer(&settings(&dir)).await.unwrap();
        let pages: i64 = sqlx::query_scalar("PRAGMA wal_autocheckpoint")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(pages, 10_000);
    }

    #[tokio::test]
    async fn writes_after_close_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        store.insert_user(user(1, "before")).await.unwrap();
        store.close().await;
        assert!(matches!(
            store.insert_user(user(2, "after")).await,
            Err(StoreError::Unavailable(_))
        ));
    }
}
