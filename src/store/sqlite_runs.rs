//! Runs of one statement sent to a SQLite connection's thread as one query: the
//! writer's consecutive inserts of one kind, and the gathered reads of users by
//! name (`sqlite_lookups`).
//!
//! sqlx serves each SQLite connection from a thread of its own, and each query is a
//! round trip to that thread: the writer task wakes it, it runs the statement and
//! wakes the task back. With one insert per query a batch of logins costs two
//! thread wake-ups per login on the server's core, more than the insert itself. A
//! query may hold several statements (sqlx's SQLite driver prepares them once, runs
//! them in order in one round trip and reports each one's changes), so a run of
//! consecutive session inserts, or of user inserts, goes as one query of up to
//! [`LONGEST`] copies of the one statement, each with its own parameters. SQLite's
//! work is that of the single inserts, in the same order and the same transaction.
//! Reads of users by name go the same way, each statement's row (or none) told
//! apart by the end of that statement.
//!
//! What a run holds is what was queued: [`take_queued`] is how the writer and the
//! lookups gather it.
//!
//! The texts are made once, for runs of 1, 2, 4, … [`LONGEST`] statements, so the
//! connection's statement cache holds a few of them; a run is sent as the longest of
//! those that fit, then the rest.

use super::{
    db::{Arg, Row, SqliteQuery},
    events::{self, NewEvent},
    session::{NewSession, new_session_args, sql::INSERT_SESSION},
    users::{
        NewUser, User, new_user_args,
        sql::{FIND_USER, INSERT_USER},
        user_from_row,
    },
};
use futures_util::TryStreamExt as _;
use sqlx::{AssertSqlSafe, Either, Executor as _, SqliteConnection};
use std::sync::{Arc, LazyLock};
use tokio::sync::mpsc;

/// The most statements in one query.
pub(super) const LONGEST: usize = 32;

/// The texts of `statement` repeated 1, 2, 4, … [`LONGEST`] times, indexed by the
/// power of two.
struct Repeated {
    texts: Vec<Arc<str>>,
}

impl Repeated {
    /// Copies of `statement`, whose parameters are `$1` to `$params`.
    fn new(statement: &str, params: usize) -> Self {
        let mut texts = Vec::new();
        let mut n = 1;
        while n <= LONGEST {
            texts.push(repeat(statement, params, n).into());
            n *= 2;
        }
        Self { texts }
    }

    /// The queries that run one statement for each of `items` (its values bound by
    /// `bind`), in order, each with how many statements it holds.
    fn queries<'a, T>(
        &'a self,
        items: &'a [T],
        bind: impl Fn(SqliteQuery, &T) -> SqliteQuery + 'a,
    ) -> impl Iterator<Item = (SqliteQuery, usize)> + 'a {
        let mut rest = items;
        std::iter::from_fn(move || {
            if rest.is_empty() {
                return None;
            }
            let (text, n) = self.longest_for(rest.len());
            let (these, after) = rest.split_at(n);
            rest = after;
            let query = (these.iter()).fold(sqlx::query(AssertSqlSafe(text)), &bind);
            Some((query, n))
        })
    }

    /// The longest text for at most `n` statements (`n` ≥ 1), and how many it holds.
    fn longest_for(&self, n: usize) -> (Arc<str>, usize) {
        let power = n.min(LONGEST).ilog2() as usize;
        (self.texts[power].clone(), 1 << power)
    }
}

/// `n` copies of `statement`, the k-th (from 0) with its parameters `$i` renamed
/// `$(k × params + i)`: sqlx binds a `$i` of any statement of a query to the query's
/// i-th argument.
fn repeat(statement: &str, params: usize, n: usize) -> String {
    let mut text = String::with_capacity((statement.len() + 8) * n);
    for k in 0..n {
        let mut rest = statement;
        while let Some(at) = rest.find('$') {
            text.push_str(&rest[..=at]);
            rest = &rest[at + 1..];
            let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
            let i: usize = rest[..digits].parse().expect("a numbered parameter");
            assert!(
                (1..=params).contains(&i),
                "parameter ${i} of {params} in {statement}"
            );
            text.push_str(&(k * params + i).to_string());
            rest = &rest[digits..];
        }
        text.push_str(rest);
        text.push_str(";\n");
    }
    text
}

static SESSIONS: LazyLock<Repeated> = LazyLock::new(|| Repeated::new(INSERT_SESSION, 9));
static USERS: LazyLock<Repeated> = LazyLock::new(|| Repeated::new(INSERT_USER, 6));
static LOOKUPS: LazyLock<Repeated> = LazyLock::new(|| Repeated::new(FIND_USER, 1));
static EVENTS: LazyLock<Repeated> = LazyLock::new(|| Repeated::new(events::sql::INSERT, 4));

/// Runs `inserts` (each bound as the next statement's arguments by `bind`) in
/// queries of `repeated`, and returns the rows each statement changed, in order.
async fn run<T>(
    conn: &mut SqliteConnection,
    repeated: &Repeated,
    inserts: &[&T],
    bind: impl Fn(SqliteQuery, &T) -> SqliteQuery,
) -> Result<Vec<u64>, sqlx::Error> {
    let mut changed = Vec::with_capacity(inserts.len());
    for (query, n) in repeated.queries(inserts, |q, insert| bind(q, insert)) {
        let done: Vec<_> = conn.execute_many(query).try_collect().await?;
        ran_all(done.len(), n)?;
        changed.extend(done.iter().map(|d| d.rows_affected()));
    }
    Ok(changed)
}

/// `query` with `args` as its next arguments.
fn bind<'a>(query: SqliteQuery, args: impl IntoIterator<Item = Arg<'a>>) -> SqliteQuery {
    (args.into_iter()).fold(query, |q, arg| arg.bind_sqlite(q))
}

/// A run's query ran `ran` of its `n` statements: all of them, or an error (the
/// outcomes would no longer match the writes).
fn ran_all(ran: usize, n: usize) -> Result<(), sqlx::Error> {
    if ran == n {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(format!(
            "SQLite ran {ran} of the {n} statements of a run"
        )))
    }
}

/// Inserts each session of `sessions` while its user's password is at the version
/// verified (`INSERT_SESSION`); `true` for each one stored.
pub(super) async fn insert_sessions(
    conn: &mut SqliteConnection,
    sessions: &[&NewSession],
) -> Result<Vec<bool>, sqlx::Error> {
    let changed = run(conn, &SESSIONS, sessions, |q, s| {
        bind(q, new_session_args(s))
    })
    .await?;
    Ok(changed.into_iter().map(|n| n == 1).collect())
}

/// Inserts each user of `users` unless its username is taken (`INSERT_USER`);
/// `true` for each one inserted.
pub(super) async fn insert_users(
    conn: &mut SqliteConnection,
    users: &[&NewUser],
    now: i64,
) -> Result<Vec<bool>, sqlx::Error> {
    let changed = run(conn, &USERS, users, |q, u| bind(q, new_user_args(u, now))).await?;
    Ok(changed.into_iter().map(|n| n == 1).collect())
}

/// Writes `events` at `now`, in order (the outbox rows of a run of inserts).
pub(super) async fn insert_events(
    conn: &mut SqliteConnection,
    events: &[NewEvent],
    now: i64,
) -> Result<(), sqlx::Error> {
    let events: Vec<&NewEvent> = events.iter().collect();
    run(conn, &EVENTS, &events, |q, e| {
        q.bind(now)
            .bind(e.user_id.clone())
            .bind(e.kind)
            .bind(e.data.to_string())
    })
    .await?;
    Ok(())
}

/// The user named by each of `names` (`FIND_USER`), in order.
pub(super) async fn find_users(
    conn: &mut SqliteConnection,
    names: &[&str],
) -> Result<Vec<Option<User>>, sqlx::Error> {
    let mut users = Vec::with_capacity(names.len());
    for (query, n) in LOOKUPS.queries(names, |q, name| q.bind(*name)) {
        let mut steps = conn.fetch_many(query);
        let (mut found, before) = (None, users.len());
        while let Some(step) = steps.try_next().await? {
            match step {
                // A username is unique: one row at most per statement.
                Either::Right(row) => found = Some(user_from_row(&Row::Sqlite(row))?),
                Either::Left(_) => users.push(found.take()),
            }
        }
        ran_all(users.len() - before, n)?;
    }
    Ok(users)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        credentials::Username,
        refresh::RotationKey,
        store::{
            StoreError,
            backend::Backend as _,
            sqlite::tests::{open, settings, user},
        },
    };
    use futures::future::{BoxFuture, FutureExt as _, join_all};
    use sqlx::{ConnectOptions as _, Connection as _, sqlite::SqliteConnectOptions};

    #[test]
    fn each_copy_numbers_its_parameters_after_those_of_the_copies_before() {
        assert_eq!(
            repeat("INSERT INTO t VALUES ($1, $2, $1)", 2, 3),
            "INSERT INTO t VALUES ($1, $2, $1);\n\
             INSERT INTO t VALUES ($3, $4, $3);\n\
             INSERT INTO t VALUES ($5, $6, $5);\n"
        );
        // `$10` is parameter ten, not `$1` followed by a zero.
        assert_eq!(
            repeat("SELECT $10, $1", 10, 2),
            "SELECT $10, $1;\nSELECT $20, $11;\n"
        );
    }

    #[test]
    fn a_run_goes_as_the_longest_texts_that_fit() {
        let repeated = Repeated::new("SELECT $1", 1);
        let sizes = |mut n: usize| {
            let mut sizes = Vec::new();
            while n > 0 {
                let (text, k) = repeated.longest_for(n);
                assert_eq!(text.matches("SELECT").count(), k);
                sizes.push(k);
                n -= k;
            }
            sizes
        };
        assert_eq!(sizes(1), [1]);
        assert_eq!(sizes(7), [4, 2, 1]);
        assert_eq!(sizes(32), [32]);
        assert_eq!(sizes(70), [32, 32, 4, 2]);
    }

    fn session(i: usize, user_id: &str, password_version: i64) -> NewSession {
        NewSession {
            id: format!("s-{i:03}"),
            user_id: user_id.to_owned(),
            password_version,
            rotation_key: RotationKey::random(),
            refresh_digest: format!("d-{i:03}"),
            created_at: 1,
            expires_at: i64::MAX,
            client_addr: Some("127.0.0.1".into()),
            amr: "pwd".into(),
        }
    }

    // On a current-thread runtime every write is queued before the writer runs: 70
    // writes, in two transactions (64 and 6), whose runs of session inserts are broken
    // by user inserts. Each write gets its own outcome, in order: a session whose
    // password version is not the user's is not stored, a taken username is refused,
    // and the rest are stored.
    #[tokio::test(flavor = "current_thread")]
    async fn every_write_of_a_run_has_its_own_outcome() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(&dir).await;
        store.insert_user(user(0, "alice")).await.unwrap();
        let alice = store
            .find_user(&Username::parse("alice").unwrap())
            .await
            .unwrap()
            .unwrap();
        let before = store.writer_stats().unwrap();
        let (store, alice) = (&store, &alice);
        let writes: Vec<BoxFuture<'_, (bool, bool)>> = (0..70)
            .map(|i| match i % 10 {
                9 => {
                    let name = if i % 20 == 9 {
                        "alice".into()
                    } else {
                        format!("new{i}")
                    };
                    let registered = store.insert_user(user(100 + i, &name));
                    async move {
                        match registered.await {
                            Ok(()) => (true, i % 20 != 9),
                            Err(StoreError::Duplicate) => (false, i % 20 != 9),
                            Err(e) => panic!("{e}"),
                        }
                    }
                    .boxed()
                }
                _ => {
                    let version = alice.password_version + i64::from(i % 3 == 0);
                    let stored = store.insert_session(session(i, &alice.id, version));
                    async move { (stored.await.unwrap(), i % 3 != 0) }.boxed()
                }
            })
            .collect();
        let outcomes = join_all(writes).await;
        for (i, (got, expected)) in outcomes.iter().enumerate() {
            assert_eq!(got, expected, "write {i}");
        }
        let after = store.writer_stats().unwrap();
        assert_eq!(after.writes - before.writes, 70);
        assert_eq!(after.transactions - before.transactions, 2);

        let options = SqliteConnectOptions::new().filename(&settings(&dir).path);
        let mut conn = options.connect().await.unwrap();
        let stored: Vec<String> = sqlx::query_scalar("SELECT id FROM sessions ORDER BY id")
            .fetch_all(&mut conn)
            .await
            .unwrap();
        let expected: Vec<String> = (0..70)
            .filter(|i| i % 10 != 9 && i % 3 != 0)
            .map(|i| format!("s-{i:03}"))
            .collect();
        assert_eq!(stored, expected);
        let users: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM users")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(users, 1 + 3, "alice, and new19, new39 and new59");
        conn.close().await.unwrap();
        store.close().await;
    }
}
