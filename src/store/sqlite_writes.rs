//! What the SQLite writer task writes: each kind of write, what it came to, and the
//! transaction that applies a batch of them (`sqlite` queues them and answers).

use super::{
    StoreError, admin,
    admin::{Change, Revoked},
    factor,
    factor::{FactorAnswer, FactorWrite},
    session::{EndReason, Ended, LoggedOut, NewSession, Purged, Refreshed, Rotation, session_ops},
    sqlite_runs,
    users::{NewUser, password_hash_query},
};
use sqlx::SqliteConnection;
use tokio::sync::oneshot;

/// Where a write's answer goes.
pub(super) type Reply = oneshot::Sender<Result<Answer, StoreError>>;

/// A write the writer task applies, in the batch it takes.
pub(super) enum Write {
    Insert(NewUser),
    UpdateHash {
        id: String,
        hash: String,
        version: i64,
    },
    InsertSession(NewSession),
    Rotate(Rotation),
    EndByDigest {
        digest: String,
        all: bool,
        now: i64,
        grace_ms: i64,
    },
    EndById {
        id: String,
        user_id: String,
        all: bool,
        now: i64,
    },
    /// A new hash, and every session of the user ended, in one transaction.
    ChangePassword {
        id: String,
        hash: String,
        version: i64,
        now: i64,
    },
    Purge {
        now: i64,
        ended_before: i64,
        limit: i64,
    },
    Disable {
        id: String,
        reason: String,
        now: i64,
    },
    Enable {
        id: String,
        now: i64,
    },
    Delete {
        id: String,
        now: i64,
    },
    PurgeCutoffs {
        before: i64,
        limit: i64,
    },
    EndSessionsOf {
        user_id: String,
        ids: Vec<String>,
        now: i64,
    },
    SetPassword {
        user_id: String,
        hash: String,
        end_sessions: bool,
        now: i64,
    },
    Factor(FactorWrite),
}

/// What a write came to, for the caller to unwrap (each write has one kind).
pub(super) enum Answer {
    Done,
    /// Whether a conditional write wrote.
    Wrote(bool),
    Refreshed(Refreshed),
    LoggedOut(LoggedOut),
    Ended(Option<Ended>),
    EndedIds(Option<Vec<String>>),
    Purged(Purged),
    Revoked(Change<Revoked>),
    Enabled(Change<()>),
    Count(u64),
    Ids(Vec<String>),
    Factor(FactorAnswer),
}

/// The session statements on the writer's connection.
mod ops {
    super::session_ops!(sqlx::SqliteConnection, sqlx::sqlite::SqliteRow);
    super::admin::admin_ops!(sqlx::SqliteConnection);
    super::factor::factor_ops!(sqlx::SqliteConnection);
}

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
                outcomes.extend(inserted.into_iter().map(|inserted| match inserted {
                    true => Ok(Answer::Done),
                    false => Err(StoreError::Duplicate),
                }));
                users.len()
            }
            write => {
                outcomes.push(apply_one(conn, write, now).await?);
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

/// One write of a kind that goes alone.
async fn apply_one(
    conn: &mut SqliteConnection,
    write: &Write,
    now: i64,
) -> Result<Result<Answer, StoreError>, sqlx::Error> {
    Ok(match write {
        Write::Insert(_) | Write::InsertSession(_) => {
            unreachable!("inserts go in runs (`apply`)")
        }
        Write::UpdateHash { id, hash, version } => {
            password_hash_query(id, hash, *version, false, now)
                .execute(&mut *conn)
                .await?;
            Ok(Answer::Done)
        }
        Write::Rotate(rotation) => Ok(Answer::Refreshed(ops::rotate(conn, rotation).await?)),
        Write::EndByDigest {
            digest,
            all,
            now,
            grace_ms,
        } => Ok(Answer::LoggedOut(
            ops::end_by_digest(conn, digest, *all, *now, *grace_ms).await?,
        )),
        Write::EndById {
            id,
            user_id,
            all,
            now,
        } => Ok(Answer::Ended(
            ops::end_by_id(conn, id, user_id, *all, *now).await?,
        )),
        Write::ChangePassword {
            id,
            hash,
            version,
            now,
        } => {
            let changed = password_hash_query(id, hash, *version, true, *now)
                .execute(&mut *conn)
                .await?
                .rows_affected()
                == 1;
            Ok(Answer::EndedIds(if changed {
                Some(ops::end_user_sessions(conn, id, EndReason::PasswordChange, *now).await?)
            } else {
                None
            }))
        }
        Write::Purge {
            now,
            ended_before,
            limit,
        } => Ok(Answer::Purged(
            ops::purge(conn, *now, *ended_before, *limit).await?,
        )),
        Write::Disable { id, reason, now } => {
            Ok(Answer::Revoked(ops::disable(conn, id, reason, *now).await?))
        }
        Write::Enable { id, now } => Ok(Answer::Enabled(ops::enable(conn, id, *now).await?)),
        Write::Delete { id, now } => Ok(Answer::Revoked(ops::delete(conn, id, *now).await?)),
        Write::PurgeCutoffs { before, limit } => Ok(Answer::Count(
            ops::purge_cutoffs(conn, *before, *limit).await?,
        )),
        Write::EndSessionsOf { user_id, ids, now } => Ok(Answer::Ids(
            ops::end_sessions_of(conn, user_id, ids, *now).await?,
        )),
        Write::SetPassword {
            user_id,
            hash,
            end_sessions,
            now,
        } => Ok(Answer::EndedIds(
            ops::set_password(conn, user_id, hash, *end_sessions, *now).await?,
        )),
        Write::Factor(w) => Ok(Answer::Factor(ops::factor_write(conn, w).await?)),
    })
}
