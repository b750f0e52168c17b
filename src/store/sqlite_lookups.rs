//! SQLite's reads of a user by name (Login's first step), gathered: the lookups
//! queued while the runtime was busy go to one reader connection's thread as one
//! query (`sqlite_runs`), one round trip for all of them instead of one each.
//!
//! A task takes what is queued (after letting the requests about to run queue
//! theirs, as the writer does), takes a reader connection for it, and answers the
//! batch from a task of its own, so up to as many batches run at once as there are
//! reader connections; while none is free, lookups queue and the next batch is
//! larger. On an idle server a lookup goes alone, at once. Each lookup is bounded as
//! any read is (`connection::operation_limit`), and so is each batch: a batch that
//! does not finish closes its connection and fails its lookups as unavailable. The
//! queue is bounded; a caller waits for room within its own bound.

use super::{
    connection::{Connections, Lease, within},
    error::{StoreError, closed},
    sqlite_runs::{self, LONGEST, take_queued},
    users::User,
};
use crate::credentials::Username;
use sqlx::Sqlite;
use std::{sync::Arc, time::Duration};
use tokio::{
    sync::{mpsc, oneshot},
    task::JoinHandle,
};

/// Lookups waiting for a batch, at most.
const QUEUED: usize = 4096;

struct Lookup {
    username: Username,
    reply: oneshot::Sender<Result<Option<User>, StoreError>>,
}

/// Where lookups are queued; the gathering task ends once this is dropped.
pub(super) struct Lookups {
    queue: mpsc::Sender<Lookup>,
    limit: Duration,
}

impl Lookups {
    /// Starts the gathering task on `readers`; each lookup and each batch bounded by
    /// `limit`.
    pub(super) fn start(
        readers: Arc<Connections<Sqlite>>,
        limit: Duration,
    ) -> (Self, JoinHandle<()>) {
        let (queue, queued) = mpsc::channel(QUEUED);
        let task = tokio::spawn(gather(readers, queued, limit));
        (Self { queue, limit }, task)
    }

    /// The user named `username`, if there is one.
    pub(super) async fn find(&self, username: &Username) -> Result<Option<User>, StoreError> {
        let (reply, answer) = oneshot::channel();
        let lookup = Lookup {
            username: username.clone(),
            reply,
        };
        within(self.limit, async {
            self.queue.send(lookup).await.map_err(|_| closed())?;
            answer.await.unwrap_or_else(|_| Err(closed()))
        })
        .await?
    }
}

async fn gather(
    readers: Arc<Connections<Sqlite>>,
    mut queued: mpsc::Receiver<Lookup>,
    limit: Duration,
) {
    let mut batch = Vec::with_capacity(LONGEST);
    while take_queued(&mut queued, &mut batch, LONGEST).await {
        let lookups = std::mem::replace(&mut batch, Vec::with_capacity(LONGEST));
        match readers.lease().await {
            Ok(conn) => {
                tokio::spawn(answer(conn, lookups, limit));
            }
            Err(e) => fail(lookups, &e),
        }
    }
}

/// Reads the users of `lookups` on `conn` and answers each.
async fn answer(mut conn: Lease<Sqlite>, lookups: Vec<Lookup>, limit: Duration) {
    let names: Vec<&str> = lookups.iter().map(|l| l.username.as_str()).collect();
    let read = within(limit, sqlite_runs::find_users(&mut conn, &names)).await;
    match read {
        Ok(Ok(users)) => {
            conn.finish();
            for (lookup, user) in lookups.into_iter().zip(users) {
                let _ = lookup.reply.send(Ok(user));
            }
        }
        // The connection is dropped, not given back: closed.
        Ok(Err(e)) => fail(lookups, &StoreError::from(e)),
        Err(e) => fail(lookups, &e),
    }
}

/// Answers every lookup of `lookups` with `e` (an unavailable database stays one).
fn fail(lookups: Vec<Lookup>, e: &StoreError) {
    tracing::warn!(error = %e, lookups = lookups.len(), "a batch of user lookups failed");
    for lookup in lookups {
        let _ = (lookup.reply).send(Err(e.for_each_of_many("reading a user failed")));
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        credentials::Username,
        metrics::Metrics,
        store::{
            StoreError,
            backend::Backend as _,
            sqlite::tests::{open, open_with, settings, user},
        },
    };
    use futures::future::join_all;
    use sqlx::{ConnectOptions as _, Connection as _, sqlite::SqliteConnectOptions};

    fn name(i: usize) -> Username {
        Username::parse(&format!("user{i}")).unwrap()
    }

    // On a current-thread runtime all 45 lookups are queued before the gathering task
    // runs: it takes 32 (the most one query holds), then the other 13, one reader
    // connection lent for each batch. Each lookup gets its own user, or none.
    #[tokio::test(flavor = "current_thread")]
    async fn lookups_queued_together_are_read_together_and_answered_each() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Metrics::new();
        let store = open_with(&dir, &metrics).await;
        let registered =
            join_all((0..40).map(|i| store.insert_user(user(i, &format!("user{i}"))))).await;
        assert!(registered.iter().all(Result::is_ok));
        let names: Vec<Username> = (0..45).rev().map(name).collect();
        let found = join_all(names.iter().map(|n| store.find_user(n))).await;
        for (i, found) in (0..45).rev().zip(found) {
            let found = found.unwrap();
            if i < 40 {
                let found = found.unwrap_or_else(|| panic!("user{i} not found"));
                assert_eq!((found.id, found.username), (format!("id-{i}"), name(i)));
            } else {
                assert!(found.is_none(), "user{i}");
            }
        }
        let line = r#"authd_store_pool_acquire_duration_seconds_count{backend="sqlite"} 2"#;
        let text = metrics.render();
        assert!(text.contains(line), "{line} missing in:\n{text}");
        store.close().await;
    }

    // A statement that fails fails every lookup of its batch (none waits forever);
    // its connection is closed, and the lookups after it read again.
    #[tokio::test(flavor = "current_thread")]
    async fn a_batch_that_fails_answers_each_of_its_lookups_with_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        for i in 0..5 {
            store
                .insert_user(user(i, &format!("user{i}")))
                .await
                .unwrap();
        }
        let options = SqliteConnectOptions::new().filename(&settings(&dir).path);
        let mut conn = options.connect().await.unwrap();
        let rename = |from: &str, to: &str| format!("ALTER TABLE {from} RENAME TO {to}");
        sqlx::raw_sql(sqlx::AssertSqlSafe(rename("user_cutoffs", "moved")))
            .execute(&mut conn)
            .await
            .unwrap();
        let names: Vec<Username> = (0..5).map(name).collect();
        let found = join_all(names.iter().map(|n| store.find_user(n))).await;
        for found in &found {
            assert!(matches!(found, Err(StoreError::Other(_))), "{found:?}");
        }
        sqlx::raw_sql(sqlx::AssertSqlSafe(rename("moved", "user_cutoffs")))
            .execute(&mut conn)
            .await
            .unwrap();
        let found = join_all(names.iter().map(|n| store.find_user(n))).await;
        for (i, found) in found.into_iter().enumerate() {
            assert_eq!(found.unwrap().unwrap().id, format!("id-{i}"));
        }
        conn.close().await.unwrap();
        store.close().await;
    }

    #[tokio::test]
    async fn lookups_after_close_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        store.insert_user(user(1, "user1")).await.unwrap();
        store.close().await;
        assert!(matches!(
            store.find_user(&name(1)).await,
            Err(StoreError::Unavailable(_))
        ));
    }
}
