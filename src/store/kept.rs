//! A pool of connections kept as they are between operations: SQLite's read-only
//! connections.
//!
//! sqlx's pool checks a connection on the way out (a ping before it is lent) and on
//! the way back (another ping, in a task of its own), which for a database across a
//! network tells a dead connection from a live one. A SQLite connection is a file
//! handle served by a thread of its own: each ping is a round trip to that thread
//! and back, two thread wake-ups that cost more than the indexed read they
//! surround (on one core, a third of a Login's time outside its hash). [`Kept`]
//! lends its connections without either check: at most `max` exist, opened on
//! demand, the wait for one bounded by the acquire timeout; a connection whose
//! operation finished goes back as it is, one whose operation did not (it timed
//! out, or its caller went away mid-read) is closed, as `connection::Lease` does
//! with sqlx's pool.

use sqlx::{ConnectOptions, Connection, Database};
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicUsize, Ordering},
};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The connect options of `DB`'s connections.
type Options<DB> = <<DB as Database>::Connection as Connection>::Options;

/// Up to `max` connections of `DB`, opened on demand and lent one operation at a
/// time.
pub(super) struct Kept<DB: Database> {
    /// Connections no operation holds, the most recently given back last; `None`
    /// once the pool is closed (one lock, so a connection given back as the pool
    /// closes is either closed with the idle ones or by its giver, never kept).
    idle: Mutex<Option<Vec<DB::Connection>>>,
    /// One per connection that may exist: held by each lent connection.
    permits: Arc<Semaphore>,
    max: usize,
    /// Connections that exist (idle or lent).
    open: AtomicUsize,
    options: Options<DB>,
    acquire_timeout: Duration,
}

impl<DB: Database> Kept<DB> {
    /// A pool of at most `max` connections opened with `options`, one opened now
    /// (so that a database that cannot be opened fails at start).
    pub(super) async fn open(
        options: Options<DB>,
        max: usize,
        acquire_timeout: Duration,
    ) -> Result<Self, sqlx::Error> {
        let first = options.connect().await?;
        let max = max.max(1);
        Ok(Self {
            idle: Mutex::new(Some(vec![first])),
            permits: Arc::new(Semaphore::new(max)),
            max,
            open: AtomicUsize::new(1),
            options,
            acquire_timeout,
        })
    }

    /// The most connections that may exist.
    pub(super) fn max(&self) -> usize {
        self.max
    }

    /// (connections that exist, of which idle).
    pub(super) fn sizes(&self) -> (usize, usize) {
        let idle = self.lock().as_ref().map_or(0, Vec::len);
        (self.open.load(Ordering::Relaxed).max(idle), idle)
    }

    /// A connection, idle or newly opened, once fewer than `max` are lent; waits
    /// at most the acquire timeout for that.
    pub(super) async fn acquire(self: &Arc<Self>) -> Result<Lent<DB>, sqlx::Error> {
        let permit =
            tokio::time::timeout(self.acquire_timeout, self.permits.clone().acquire_owned())
                .await
                .map_err(|_| sqlx::Error::PoolTimedOut)?
                .map_err(|_| sqlx::Error::PoolClosed)?;
        let idle = match self.lock().as_mut() {
            Some(idle) => idle.pop(),
            None => return Err(sqlx::Error::PoolClosed),
        };
        let conn = match idle {
            Some(conn) => conn,
            None => {
                let conn = self.options.connect().await?;
                self.open.fetch_add(1, Ordering::Relaxed);
                conn
            }
        };
        Ok(Lent {
            conn,
            pool: self.clone(),
            _permit: permit,
        })
    }

    /// Closes the idle connections and every lent one as it comes back; lends no more.
    pub(super) async fn close(&self) {
        self.permits.close();
        let idle = self.lock().take().unwrap_or_default();
        for conn in idle {
            self.open.fetch_sub(1, Ordering::Relaxed);
            let _ = conn.close().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Vec<DB::Connection>>> {
        // The list is only pushed to and popped from: a panic elsewhere leaves it whole.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A connection lent by [`Kept`] to one operation.
pub(super) struct Lent<DB: Database> {
    pub(super) conn: DB::Connection,
    pool: Arc<Kept<DB>>,
    _permit: OwnedSemaphorePermit,
}

impl<DB: Database> Lent<DB> {
    /// The operation is over: the connection goes back as it is (closed instead
    /// once the pool is).
    pub(super) fn give_back(self) {
        let mut idle = self.pool.lock();
        let Some(kept) = idle.as_mut() else {
            drop(idle);
            return self.discard();
        };
        kept.push(self.conn);
    }

    /// The operation did not finish: the connection is dropped (its thread ends
    /// once it is done with what it was asked), and a fresh one opened when needed.
    pub(super) fn discard(self) {
        self.pool.open.fetch_sub(1, Ordering::Relaxed);
        drop(self.conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sqlx::{Sqlite, sqlite::SqliteConnectOptions};

    async fn readers(dir: &tempfile::TempDir, max: usize) -> Arc<Kept<Sqlite>> {
        readers_waiting(dir, max, Duration::from_millis(50)).await
    }

    async fn readers_waiting(
        dir: &tempfile::TempDir,
        max: usize,
        wait: Duration,
    ) -> Arc<Kept<Sqlite>> {
        let options = SqliteConnectOptions::new()
            .filename(dir.path().join("k.db"))
            .create_if_missing(true);
        Arc::new(Kept::open(options, max, wait).await.unwrap())
    }

    async fn answers(lent: &mut Lent<Sqlite>) -> i64 {
        sqlx::query_scalar("SELECT 7")
            .fetch_one(&mut lent.conn)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn at_most_max_connections_are_lent_and_the_wait_for_one_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let kept = readers(&dir, 2).await;
        let mut a = kept.acquire().await.unwrap();
        let mut b = kept.acquire().await.unwrap();
        assert_eq!(kept.sizes(), (2, 0), "the second was opened on demand");
        assert_eq!((answers(&mut a).await, answers(&mut b).await), (7, 7));
        // No permit is ever freed while both are lent: the wait ends at the timeout.
        assert!(matches!(
            kept.acquire().await,
            Err(sqlx::Error::PoolTimedOut)
        ));
        a.give_back();
        assert_eq!(kept.sizes(), (2, 1));
        let mut c = kept.acquire().await.unwrap();
        assert_eq!(
            kept.sizes(),
            (2, 0),
            "the idle one was lent again, none opened"
        );
        assert_eq!(answers(&mut c).await, 7);
        b.give_back();
        c.give_back();
        assert_eq!(kept.sizes(), (2, 2));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn many_reads_at_once_share_at_most_max_connections() {
        let dir = tempfile::tempdir().unwrap();
        // A wait long enough for 50 reads in turn on a slow machine: the bound on
        // connections is what is asserted, not how fast they are lent.
        let kept = readers_waiting(&dir, 3, Duration::from_secs(60)).await;
        let reads = (0..50).map(|_| {
            let kept = kept.clone();
            tokio::spawn(async move {
                let mut lent = kept.acquire().await.unwrap();
                let seen = kept.sizes().0;
                let answer = answers(&mut lent).await;
                lent.give_back();
                (answer, seen)
            })
        });
        for read in futures::future::join_all(reads).await {
            let (answer, seen) = read.unwrap();
            assert_eq!(answer, 7);
            assert!(seen <= 3, "{seen} connections open");
        }
        let (open, idle) = kept.sizes();
        assert!(open <= 3 && idle == open, "{open} open, {idle} idle");
    }

    #[tokio::test]
    async fn a_connection_whose_operation_did_not_finish_is_closed_not_lent_again() {
        let dir = tempfile::tempdir().unwrap();
        let kept = readers(&dir, 1).await;
        let lent = kept.acquire().await.unwrap();
        lent.discard();
        assert_eq!(kept.sizes(), (0, 0));
        // Its permit came back: a fresh connection is opened in its place.
        let mut fresh = kept.acquire().await.unwrap();
        assert_eq!(answers(&mut fresh).await, 7);
        assert_eq!(kept.sizes(), (1, 0));
        fresh.give_back();
    }

    #[tokio::test]
    async fn a_closed_pool_lends_nothing_and_closes_what_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let kept = readers(&dir, 2).await;
        let lent = kept.acquire().await.unwrap();
        kept.close().await;
        assert!(matches!(kept.acquire().await, Err(sqlx::Error::PoolClosed)));
        assert_eq!(
            kept.sizes(),
            (1, 0),
            "the idle one closed, the lent one not yet"
        );
        lent.give_back();
        assert_eq!(kept.sizes(), (0, 0));
    }
}
