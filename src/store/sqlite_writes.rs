//! The transaction in which the SQLite writer task applies a batch of writes
//! (`sqlite` queues them and answers; each kind of write is `writes`'s).

use super::{
    db::Conn,
    error::StoreError,
    events::{NewEvent, registered},
    sqlite_runs,
    writes::{Answer, Write, apply_one},
};
use sqlx::SqliteConnection;
use tokio::sync::oneshot;

/// Where a write's answer goes.
pub(super) type Reply = oneshot::Sender<Result<Answer, StoreError>>;

/// Runs every write of the batch inside one transaction, in order. A duplicate
/// username is an outcome of that write alone (the insert does nothing), not a
/// failure of the batch, so two registrations of one name in the same batch give
/// exactly one winner. Consecutive session inserts, and consecutive user inserts,
/// go to the connection's thread as runs (`sqlite_runs`).
pub(super) async fn apply(
    conn: &mut SqliteConnection,
    batch: &[(Write, Reply)],
    now: i64,
) -> Result<Vec<Result<Answer, StoreError>>, sqlx::Error> {
    sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
    let mut outcomes = Vec::with_capacity(batch.len());
    let mut rest = batch;
    while let Some((write, _)) = rest.first() {
        let taken = match write {
            Write::InsertSession(_) => {
                let sessions = run_of(rest, |write| match write {
                    Write::InsertSession(session) => Some(session),
                    _ => None,
                });
                let stored = sqlite_runs::insert_sessions(conn, &sessions).await?;
                outcomes.extend(stored.into_iter().map(|s| Ok(Answer::Wrote(s))));
                sessions.len()
            }
            Write::Insert(_) => {
                let users = run_of(rest, |write| match write {
                    Write::Insert(user) => Some(user),
                    _ => None,
                });
                let inserted = sqlite_runs::insert_users(conn, &users, now).await?;
                let events: Vec<NewEvent> = (users.iter().zip(&inserted))
                    .filter(|(_, inserted)| **inserted)
                    .map(|(user, _)| registered(user))
                    .collect();
                sqlite_runs::insert_events(conn, &events, now).await?;
                outcomes.extend(inserted.into_iter().map(|inserted| match inserted {
                    true => Ok(Answer::Done),
                    false => Err(StoreError::Duplicate),
                }));
                users.len()
            }
            write => {
                outcomes.push(apply_one(&mut Conn::Sqlite(&mut *conn), write, now).await?);
                1
            }
        };
        rest = &rest[taken..];
    }
    sqlx::query("COMMIT").execute(&mut *conn).await?;
    Ok(outcomes)
}

/// The writes at the start of `writes` that `pick` takes, up to the first it does not.
fn run_of<'a, T>(
    writes: &'a [(Write, Reply)],
    pick: impl Fn(&'a Write) -> Option<&'a T>,
) -> Vec<&'a T> {
    writes.iter().map_while(|(write, _)| pick(write)).collect()
}
