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
//! writer task (what it writes is `sqlite_writes`, sending runs of inserts as
//! `sqlite_runs` does).

use super::{
    StoreError,
    admin::{self, Account, Change, PageQuery, Revoked},
    connection::{
        Connections, SqliteSettings, open_sqlite_readers, open_sqlite_writer, operation_limit,
        within,
    },
    factor::{FactorAnswer, FactorWrite},
    session::{Ended, LoggedOut, NewSession, Purged, Refreshed, Rotation},
    sqlite_lookups::Lookups,
    sqlite_writes::{Answer, Reply, Write, apply},
    users::{self, NewUser, User},
};
use crate::{clock::Clock, credentials::Username, metrics::Metrics};
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

/// Counters of the writer task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterSnapshot {
    /// Transactions committed.
    pub transactions: u64,
    /// Writes (inserts and updates) acknowledged by those transactions.
    pub writes: u64,
    /// The largest number of writes in one transaction.
    pub largest_batch: u64,
}

#[derive(Default)]
struct WriterStats {
    transactions: AtomicU64,
    writes: AtomicU64,
    largest_batch: AtomicU64,
}

/// What the writer runs to answer a ping once what came before has committed.
const PING: &str = "SELECT 1";

/// The value of a writer answer of the kind `$kind`; any other kind is a bug,
/// reported as an internal error.
macro_rules! answered {
    ($answer:expr, $kind:ident) => {
        match $answer {
            Answer::$kind(value) => Ok(value),
            _ => Err(unexpected()),
        }
    };
}

/// A writer answer of the wrong kind: a bug, reported as an internal error.
fn unexpected() -> StoreError {
    StoreError::Other(anyhow::anyhow!(
        "the SQLite writer answered another kind of write"
    ))
}

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
    /// The writer reads `clock` for the time of a user's creation and of a rehash.
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

    pub(crate) async fn insert_user(&self, user: NewUser) -> Result<(), StoreError> {
        self.write(Write::Insert(user)).await.map(drop)
    }

    pub(crate) async fn insert_session(&self, session: NewSession) -> Result<bool, StoreError> {
        answered!(self.write(Write::InsertSession(session)).await?, Wrote)
    }

    pub(crate) async fn rotate(&self, rotation: Rotation) -> Result<Refreshed, StoreError> {
        answered!(self.write(Write::Rotate(rotation)).await?, Refreshed)
    }

    pub(crate) async fn end_by_digest(
        &self,
        digest: &str,
        all: bool,
        now: i64,
        grace_ms: i64,
    ) -> Result<LoggedOut, StoreError> {
        let write = Write::EndByDigest {
            digest: digest.to_owned(),
            all,
            now,
            grace_ms,
        };
        answered!(self.write(write).await?, LoggedOut)
    }

    pub(crate) async fn end_by_id(
        &self,
        id: &str,
        user_id: &str,
        all: bool,
        now: i64,
    ) -> Result<Option<Ended>, StoreError> {
        let write = Write::EndById {
            id: id.to_owned(),
            user_id: user_id.to_owned(),
            all,
            now,
        };
        answered!(self.write(write).await?, Ended)
    }

    pub(crate) async fn change_password(
        &self,
        id: &str,
        hash: String,
        version: i64,
        now: i64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        let write = Write::ChangePassword {
            id: id.to_owned(),
            hash,
            version,
            now,
        };
        answered!(self.write(write).await?, EndedIds)
    }

    pub(crate) async fn purge(
        &self,
        now: i64,
        ended_before: i64,
        limit: i64,
    ) -> Result<Purged, StoreError> {
        let write = Write::Purge {
            now,
            ended_before,
            limit,
        };
        answered!(self.write(write).await?, Purged)
    }

    pub(crate) async fn disable_user(
        &self,
        id: &str,
        reason: &str,
        now: i64,
    ) -> Result<Change<Revoked>, StoreError> {
        let write = Write::Disable {
            id: id.to_owned(),
            reason: reason.to_owned(),
            now,
        };
        answered!(self.write(write).await?, Revoked)
    }

    pub(crate) async fn enable_user(&self, id: &str, now: i64) -> Result<Change<()>, StoreError> {
        let write = Write::Enable {
            id: id.to_owned(),
            now,
        };
        answered!(self.write(write).await?, Enabled)
    }

    pub(crate) async fn delete_user(
        &self,
        id: &str,
        now: i64,
    ) -> Result<Change<Revoked>, StoreError> {
        let write = Write::Delete {
            id: id.to_owned(),
            now,
        };
        answered!(self.write(write).await?, Revoked)
    }

    pub(crate) async fn purge_cutoffs(&self, before: i64, limit: i64) -> Result<u64, StoreError> {
        answered!(
            self.write(Write::PurgeCutoffs { before, limit }).await?,
            Count
        )
    }

    pub(crate) async fn end_sessions_of(
        &self,
        user_id: &str,
        ids: Vec<String>,
        now: i64,
    ) -> Result<Vec<String>, StoreError> {
        let write = Write::EndSessionsOf {
            user_id: user_id.to_owned(),
            ids,
            now,
        };
        answered!(self.write(write).await?, Ids)
    }

    pub(crate) async fn set_password(
        &self,
        user_id: &str,
        hash: String,
        end_sessions: bool,
        now: i64,
    ) -> Result<Option<Vec<String>>, StoreError> {
        let write = Write::SetPassword {
            user_id: user_id.to_owned(),
            hash,
            end_sessions,
            now,
        };
        answered!(self.write(write).await?, EndedIds)
    }

    pub(crate) async fn factor_write(&self, w: FactorWrite) -> Result<FactorAnswer, StoreError> {
        answered!(self.write(Write::Factor(w)).await?, Factor)
    }

    pub(crate) fn readers(&self) -> &Connections<Sqlite> {
        &self.readers
    }

    pub(crate) async fn accounts_page(
        &self,
        query: &PageQuery,
        now: i64,
    ) -> Result<Vec<Account>, StoreError> {
        admin::page(&self.readers, admin::sql::PAGE_SQLITE, query, now).await
    }

    pub(crate) async fn update_password_hash(
        &self,
        id: &str,
        hash: String,
        version: i64,
    ) -> Result<(), StoreError> {
        self.write(Write::UpdateHash {
            id: id.to_owned(),
            hash,
            version,
        })
        .await
        .map(drop)
    }

    pub(crate) async fn find_user(&self, username: &Username) -> Result<Option<User>, StoreError> {
        self.lookups.find(username).await
    }

    pub(crate) async fn max_hash_iterations(&self) -> Result<u32, StoreError> {
        users::max_hash_iterations(&self.readers).await
    }

    /// A read through the reader pool, then a round trip through the writer (which
    /// answers once it has committed what was queued before).
    pub(crate) async fn probe(&self) -> Result<u32, StoreError> {
        let max = self.max_hash_iterations().await?;
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

    pub(crate) async fn close(&self) {
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

    pub(crate) fn writer_stats(&self) -> WriterSnapshot {
        WriterSnapshot {
            transactions: self.stats.transactions.load(Ordering::Relaxed),
            writes: self.stats.writes.load(Ordering::Relaxed),
            largest_batch: self.stats.largest_batch.load(Ordering::Relaxed),
        }
    }
}

pub(super) fn closed() -> StoreError {
    StoreError::Unavailable("the database is closed (shutting down)".into())
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

/// Waits for at least one item of `queue`, lets the requests the runtime is about to
/// run queue theirs (one yield), and takes what is queued, up to `max` in `into`:
/// what the writer commits and the lookups read together. `false` once every
/// sender is gone.
pub(super) async fn take_queued<T>(
    queue: &mut mpsc::Receiver<T>,
    into: &mut Vec<T>,
    max: usize,
) -> bool {
    if queue.recv_many(into, max).await == 0 {
        return false;
    }
    tokio::task::yield_now().await;
    while into.len() < max
        && let Ok(item) = queue.try_recv()
    {
        into.push(item);
    }
    true
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
        let stats = store.writer_stats();
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

    #[tokio::test(flavor = "current_thread")]
    async fn a_batch_commits_many_writes_in_one_transaction() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let store = open_with(&dir, &metrics).await;
        let results =
            join_all((0..100).map(|i| store.insert_user(user(i, &format!("user{i}"))))).await;
        assert!(results.iter().all(Result::is_ok));
        let stats = store.writer_stats();
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
        let stats = store.writer_stats();
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
