//! Each kind of write the store makes in a transaction, what it came to, and how one
//! is applied on a connection ([`apply_one`]): the same for both backends, SQLite's
//! writer task applying many in the transaction of its batch (`sqlite_writes`),
//! PostgreSQL each in a transaction of its own (`postgres`).

use super::{
    admin::{self, Change, Revoked},
    db::{Conn, Statement},
    error::StoreError,
    events::{self, NewEvent, WebhookWrite, kind},
    factor::{self, FactorAnswer, FactorWrite},
    import::{self, ImportRecord, Imported},
    reset::{self, ResetAnswer, ResetWrite},
    service::{self, ServiceAnswer, ServiceWrite},
    session::{self, EndReason, Ended, LoggedOut, NewSession, Purged, Refreshed, Rotation},
    users::{self, NewUser, Rehash},
};
use serde_json::json;

/// A write: applied by SQLite's writer task in the batch it takes, by PostgreSQL in
/// a transaction of its own.
pub(super) enum Write {
    Insert(NewUser),
    /// Answered `Wrote(false)` when the user's hashes are no longer the ones
    /// verified.
    Rehash(Rehash),
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
        ext: Option<String>,
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
        ext: Option<String>,
        end_sessions: bool,
        now: i64,
    },
    Factor(FactorWrite),
    /// A batch of imported users, in one transaction.
    Import(Vec<ImportRecord>),
    /// A change of service accounts (`service`).
    Service(ServiceWrite),
    /// One pass of the events' retention (`events::prune`).
    PruneEvents {
        before: i64,
        keep: i64,
        limit: i64,
    },
    /// A password reset's request or completion (`reset`).
    Reset(ResetWrite),
    /// A webhook endpoint's delivery state (`events::webhook`).
    Webhook(WebhookWrite),
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
    Imported(Vec<Imported>),
    Service(ServiceAnswer),
    Reset(ResetAnswer),
    /// A webhook write's position, or none.
    Position(Option<i64>),
}

/// The value an [`Answer`] holds for one kind of write.
pub(super) trait Answered: Sized {
    fn from_answer(answer: Answer) -> Option<Self>;
}

impl Answer {
    /// The value of this answer, of the kind its write gives; another kind is a bug,
    /// reported as an internal error.
    pub(super) fn take<T: Answered>(self) -> Result<T, StoreError> {
        T::from_answer(self).ok_or_else(|| {
            StoreError::Other(anyhow::anyhow!("a write was answered with another kind"))
        })
    }
}

impl Answered for () {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Done => Some(()),
            _ => None,
        }
    }
}

impl Answered for bool {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Wrote(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for Refreshed {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Refreshed(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for LoggedOut {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::LoggedOut(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for Option<Ended> {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Ended(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for Option<Vec<String>> {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::EndedIds(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for Purged {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Purged(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for Change<Revoked> {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Revoked(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for Change<()> {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Enabled(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for u64 {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Count(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for Vec<String> {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Ids(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for Vec<Imported> {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Imported(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for ServiceAnswer {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Service(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for Option<i64> {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Position(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for ResetAnswer {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Reset(v) => Some(v),
            _ => None,
        }
    }
}

impl Answered for FactorAnswer {
    fn from_answer(answer: Answer) -> Option<Self> {
        match answer {
            Answer::Factor(v) => Some(v),
            _ => None,
        }
    }
}

/// Applies one write on `conn`, inside the transaction its caller holds; `now` is
/// the time of a rehash. The inserts are not applied here: SQLite's writer sends
/// runs of them (`sqlite_runs`), PostgreSQL runs its own forms alone.
pub(super) async fn apply_one(
    conn: &mut Conn<'_>,
    write: &Write,
    now: i64,
) -> Result<Result<Answer, StoreError>, sqlx::Error> {
    let answer = change(conn, write, now).await?;
    if let Ok(answer) = &answer {
        for event in events_of(write, answer) {
            match event {
                Outbox::User(event) => events::record(conn, &event, now).await?,
                Outbox::OfSession { sessions, reason } => {
                    let data = json!({ "reason": reason, "sessions": sessions });
                    events::record_for_session(conn, &sessions[0], kind::SESSIONS_ENDED, data, now)
                        .await?
                }
            }
        }
    }
    Ok(answer)
}

/// An event a write's answer calls for.
enum Outbox {
    User(NewEvent),
    /// Sessions of one user that ended, for their user (whom the answer does not
    /// name: the first session's).
    OfSession {
        sessions: Vec<String>,
        reason: &'static str,
    },
}

/// The events of `write`, which came to `answer`: one for each change it made,
/// none when it changed nothing (a refused, repeated or conditional write that
/// lost). Inserts of users record theirs where they run (`sqlite_writes`,
/// `postgres`).
fn events_of(write: &Write, answer: &Answer) -> Vec<Outbox> {
    let user = |event: Option<NewEvent>| event.map(Outbox::User);
    let ended = |user_id: &str, reason: EndReason, ids: &[String]| {
        user(NewEvent::sessions_ended(user_id, reason.label(), ids))
    };
    let reused = |session_id: &str| Outbox::OfSession {
        sessions: vec![session_id.to_owned()],
        reason: EndReason::Reuse.label(),
    };
    let events: Vec<Option<Outbox>> = match (write, answer) {
        (
            Write::Rotate(_),
            Answer::Refreshed(Refreshed::Reused {
                session_id,
                ended_now: true,
            }),
        ) => vec![Some(reused(session_id))],
        (Write::EndByDigest { .. }, Answer::LoggedOut(out)) => match out {
            LoggedOut::Reused {
                session_id,
                ended_now: true,
            } => vec![Some(reused(session_id))],
            LoggedOut::Ended(Ended { ended_now, .. }) if !ended_now.is_empty() => {
                vec![Some(Outbox::OfSession {
                    sessions: ended_now.clone(),
                    reason: EndReason::Logout.label(),
                })]
            }
            _ => vec![],
        },
        (Write::EndById { user_id, .. }, Answer::Ended(Some(Ended { ended_now, .. }))) => {
            vec![ended(user_id, EndReason::Logout, ended_now)]
        }
        (Write::ChangePassword { id, .. }, Answer::EndedIds(Some(ids))) => vec![
            user(Some(NewEvent::new(
                id,
                kind::PASSWORD_CHANGED,
                json!({ "sessions_ended": ids.len() }),
            ))),
            ended(id, EndReason::PasswordChange, ids),
        ],
        (Write::Disable { id, reason, .. }, Answer::Revoked(Change::Done(revoked))) => vec![
            user(Some(NewEvent::new(
                id,
                kind::DISABLED,
                json!({ "reason": reason }),
            ))),
            ended(id, EndReason::Disabled, &revoked.sessions),
        ],
        (Write::Enable { id, .. }, Answer::Enabled(Change::Done(()))) => {
            vec![user(Some(NewEvent::new(id, kind::ENABLED, json!({}))))]
        }
        (Write::Delete { id, .. }, Answer::Revoked(Change::Done(revoked))) => {
            vec![user(Some(NewEvent::new(
                id,
                kind::DELETED,
                json!({ "sessions_ended": revoked.sessions.len() }),
            )))]
        }
        (Write::EndSessionsOf { user_id, .. }, Answer::Ids(ids)) => {
            vec![ended(user_id, EndReason::Admin, ids)]
        }
        (Write::SetPassword { user_id, .. }, Answer::EndedIds(Some(ids))) => vec![
            user(Some(NewEvent::new(
                user_id,
                kind::PASSWORD_SET,
                json!({ "sessions_ended": ids.len() }),
            ))),
            ended(user_id, EndReason::Admin, ids),
        ],
        (Write::Factor(w), Answer::Factor(a)) => vec![user(factor_event(w, a))],
        (Write::Import(records), Answer::Imported(outcomes)) => records
            .iter()
            .zip(outcomes)
            .filter(|(_, outcome)| **outcome == Imported::Created)
            .map(|(r, _)| {
                user(Some(NewEvent::new(
                    &r.id,
                    kind::REGISTERED,
                    json!({
                        "username": r.username.as_str(),
                        "source": "import",
                        "disabled": r.disabled.is_some(),
                    }),
                )))
            })
            .collect(),
        (Write::Reset(w), Answer::Reset(a)) => reset::events(w, a).into_iter().map(user).collect(),
        (Write::Service(w), Answer::Service(a)) => vec![user(service::event(w, a))],
        _ => vec![],
    };
    events.into_iter().flatten().collect()
}

/// The event of a second factor's write: added when confirmed, removed when turned
/// off by its user or an administrator.
fn factor_event(write: &FactorWrite, answer: &FactorAnswer) -> Option<NewEvent> {
    use factor::{Proved, Purpose};
    match (write, answer) {
        (FactorWrite::Confirm { user_id, .. }, FactorAnswer::Wrote(true)) => Some(NewEvent::new(
            user_id,
            kind::SECOND_FACTOR_ADDED,
            json!({ "factor": "totp" }),
        )),
        (
            FactorWrite::Prove {
                user_id,
                purpose: Purpose::Disable,
                ..
            },
            FactorAnswer::Proved(Proved::Accepted),
        ) => Some(NewEvent::new(
            user_id,
            kind::SECOND_FACTOR_REMOVED,
            json!({ "factor": "totp", "by": "user" }),
        )),
        (FactorWrite::Remove { user_id }, FactorAnswer::Wrote(true)) => Some(NewEvent::new(
            user_id,
            kind::SECOND_FACTOR_REMOVED,
            json!({ "factor": "totp", "by": "admin" }),
        )),
        _ => None,
    }
}

/// Applies the change of `write` itself (its events are `apply_one`'s).
async fn change(
    conn: &mut Conn<'_>,
    write: &Write,
    now: i64,
) -> Result<Result<Answer, StoreError>, sqlx::Error> {
    Ok(match write {
        Write::Insert(_) | Write::InsertSession(_) => {
            unreachable!("inserts go in runs or alone, never here")
        }
        Write::Rehash(rehash) => {
            // A rehash that fails (a trigger, a constraint) fails alone: the other
            // writes of SQLite's batch go on, and the login it follows stands.
            conn.execute(Statement::new("SAVEPOINT rehash")).await?;
            match conn.execute(users::rehash(rehash, now)).await {
                Ok(changed) => {
                    conn.execute(Statement::new("RELEASE SAVEPOINT rehash"))
                        .await?;
                    Ok(Answer::Wrote(changed == 1))
                }
                Err(e) => {
                    conn.execute(Statement::new("ROLLBACK TO SAVEPOINT rehash"))
                        .await?;
                    conn.execute(Statement::new("RELEASE SAVEPOINT rehash"))
                        .await?;
                    Err(StoreError::from(e))
                }
            }
        }
        Write::Rotate(rotation) => Ok(Answer::Refreshed(session::rotate(conn, rotation).await?)),
        Write::EndByDigest {
            digest,
            all,
            now,
            grace_ms,
        } => Ok(Answer::LoggedOut(
            session::end_by_digest(conn, digest, *all, *now, *grace_ms).await?,
        )),
        Write::EndById {
            id,
            user_id,
            all,
            now,
        } => Ok(Answer::Ended(
            session::end_by_id(conn, id, user_id, *all, *now).await?,
        )),
        Write::ChangePassword {
            id,
            hash,
            ext,
            version,
            now,
        } => {
            let changed = (conn
                .execute(users::change_password(
                    id,
                    hash,
                    ext.as_deref(),
                    *version,
                    *now,
                ))
                .await?)
                == 1;
            Ok(Answer::EndedIds(if changed {
                Some(session::end_user_sessions(conn, id, EndReason::PasswordChange, *now).await?)
            } else {
                None
            }))
        }
        Write::Purge {
            now,
            ended_before,
            limit,
        } => Ok(Answer::Purged(
            session::purge(conn, *now, *ended_before, *limit).await?,
        )),
        Write::Disable { id, reason, now } => Ok(Answer::Revoked(
            admin::disable(conn, id, reason, *now).await?,
        )),
        Write::Enable { id, now } => Ok(Answer::Enabled(admin::enable(conn, id, *now).await?)),
        Write::Delete { id, now } => Ok(Answer::Revoked(admin::delete(conn, id, *now).await?)),
        Write::PurgeCutoffs { before, limit } => Ok(Answer::Count(
            admin::purge_cutoffs(conn, *before, *limit).await?,
        )),
        Write::EndSessionsOf { user_id, ids, now } => Ok(Answer::Ids(
            admin::end_sessions_of(conn, user_id, ids, *now).await?,
        )),
        Write::SetPassword {
            user_id,
            hash,
            ext,
            end_sessions,
            now,
        } => Ok(Answer::EndedIds(
            admin::set_password(conn, user_id, hash, ext.as_deref(), *end_sessions, *now).await?,
        )),
        Write::Factor(w) => Ok(Answer::Factor(factor::factor_write(conn, w).await?)),
        Write::Import(records) => Ok(Answer::Imported(import::import(conn, records, now).await?)),
        Write::Service(w) => Ok(Answer::Service(service::service_write(conn, w).await?)),
        Write::PruneEvents {
            before,
            keep,
            limit,
        } => Ok(Answer::Count(
            events::prune(conn, *before, *keep, *limit).await?,
        )),
        Write::Reset(w) => Ok(Answer::Reset(reset::apply(conn, w, now).await?)),
        Write::Webhook(w) => Ok(Answer::Position(events::webhook(conn, w).await?)),
    })
}
