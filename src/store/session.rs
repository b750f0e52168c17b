//! Sessions in the store: the rows, the statements, and the rotation rule.
//!
//! Both backends run the same statements, through the same code (`db`). The one
//! read, [`ended_since`], runs on either backend's connections; the writes
//! ([`rotate`], [`end_by_digest`], [`end_by_id`], [`end_user_sessions`], [`purge`];
//! Login's insert is bound by [`new_session_args`]) run inside one transaction per
//! operation: SQLite's batching writer (which runs every write of a batch in its
//! transaction, one after the other) and a PostgreSQL transaction. Races between
//! requests, on one replica or many, are decided by the database: every change is a
//! conditional `UPDATE … WHERE refresh_digest = …` (or `ended_at IS NULL`) whose
//! count of affected rows says whether this request won.
//!
//! Refresh tokens are never stored: only their keys (the session's time of issue
//! and their SHA-256 digest, in hex, in the `refresh_digest` column; see
//! `refresh`), and each session's rotation key, which derives a session's next
//! token from the one presented (`refresh`): so a Refresh repeated with the token
//! just rotated (a retry, or two requests at once) is answered with the same next
//! token. Exactly one request performs a rotation (its conditional `UPDATE` affects
//! the row); the others find the token one step back and are given the winner's
//! result.

use super::{
    db::{Arg, Conn, Conns, Row, Statement},
    error::StoreError,
};
use crate::refresh::{RefreshToken, RotationKey};

/// Why a session ended: the `end_reason` column and the `reason` label of
/// `authd_sessions_ended_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    Logout,
    Reuse,
    PasswordChange,
    Expired,
    /// An administrator disabled the account.
    Disabled,
    /// An administrator ended it (EndSessions, SetPassword).
    Admin,
}

impl EndReason {
    pub const ALL: [EndReason; 6] = [
        EndReason::Logout,
        EndReason::Reuse,
        EndReason::PasswordChange,
        EndReason::Expired,
        EndReason::Disabled,
        EndReason::Admin,
    ];

    pub fn label(self) -> &'static str {
        match self {
            EndReason::Logout => "logout",
            EndReason::Reuse => "reuse",
            EndReason::PasswordChange => "password_change",
            EndReason::Expired => "expired",
            EndReason::Disabled => "disabled",
            EndReason::Admin => "admin",
        }
    }
}

/// A session about to be stored (by Login).
#[derive(Debug, Clone)]
pub struct NewSession {
    pub id: String,
    pub user_id: String,
    /// The user's password version the login verified: the session is stored only
    /// while it is still the user's.
    pub password_version: i64,
    pub rotation_key: RotationKey,
    /// The refresh token's store key ([`RefreshToken::store_key`]), for the
    /// `refresh_digest` column.
    pub refresh_digest: String,
    pub created_at: i64,
    pub expires_at: i64,
    /// The address of the client that logged in, when known.
    pub client_addr: Option<String>,
    /// How the user signed in (RFC 8176 values, space-separated): `pwd`, `pwd otp`.
    pub amr: String,
}

/// A Refresh, as the store runs it.
#[derive(Debug, Clone)]
pub struct Rotation {
    /// The refresh token presented.
    pub presented: RefreshToken,
    /// Unix milliseconds, now.
    pub now: i64,
    /// How long after a rotation the token it replaced may be presented again and
    /// be answered with the same next token (the retry rule).
    pub grace_ms: i64,
}

/// A live session after a rotation.
#[derive(Debug, Clone)]
pub struct LiveSession {
    pub id: String,
    pub user_id: String,
    pub username: String,
    /// Unix milliseconds.
    pub expires_at: i64,
    /// How the user signed in, as stored with the session (`pwd`, `pwd otp`).
    pub amr: String,
}

/// What a Refresh came to.
#[derive(Debug, Clone)]
pub enum Refreshed {
    /// The next refresh token is in place. `replay`: it was put in place moments
    /// ago, by the rotation this request repeats (the retry rule); nothing changed.
    Rotated {
        session: LiveSession,
        refresh_token: RefreshToken,
        replay: bool,
    },
    /// The token had been rotated already: the session is ended (by this request
    /// when `ended_now`, else it had ended before).
    Reused { session_id: String, ended_now: bool },
    /// Refused without ending anything: why, for the log.
    Refused(&'static str),
}

/// Sessions one request ended.
#[derive(Debug, Clone, Default)]
pub struct Ended {
    /// The sessions this request ended (empty when they had ended already).
    pub ended_now: Vec<String>,
    /// The session the request named (ended now or before).
    pub named: Option<String>,
}

/// What a Logout by refresh token came to.
#[derive(Debug, Clone)]
pub enum LoggedOut {
    /// The token was the session's current one: the sessions ended.
    Ended(Ended),
    /// The token had been rotated out: the reuse rule ended its session (by this
    /// request when `ended_now`), and nothing else.
    Reused { session_id: String, ended_now: bool },
    /// A token of no live session (unknown, ended, expired), or one rotated out
    /// within the retry grace: nothing ends. Why, for the log.
    Refused(&'static str),
}

/// A session that ended: what the revocation pollers read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndedSession {
    pub id: String,
    /// Unix milliseconds.
    pub ended_at: i64,
}

/// What one purge pass deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Purged {
    /// Sessions that reached their end without being ended.
    pub expired: u64,
    /// Sessions ended long enough ago that no access token of theirs is valid.
    pub ended: u64,
}

pub(super) mod sql {
    /// Login's session, stored only while the user's password is at the version
    /// verified. SQLite's one writer runs it alone; PostgreSQL's form locks the user's
    /// row (FOR SHARE) so that a password change either waits for this insert to
    /// commit (and then ends the session) or commits first (and this row no
    /// longer matches).
    pub const INSERT_SESSION: &str = "INSERT INTO sessions \
         (id, user_id, rotation_key, refresh_digest, created_at, expires_at, client_addr, amr) \
         SELECT $1, $2, $3, $4, $5, $6, $8, $9 FROM users WHERE id = $2 AND password_version = $7";
    pub const INSERT_SESSION_LOCKING: &str = "INSERT INTO sessions \
         (id, user_id, rotation_key, refresh_digest, created_at, expires_at, client_addr, amr) \
         SELECT $1, $2, $3, $4, $5, $6, $8, $9 FROM users WHERE id = $2 AND password_version = $7 \
         FOR SHARE";
    /// The session a refresh token works for now, with its user's name (one
    /// statement, so a Refresh makes no second round trip for it).
    pub const FIND_CURRENT: &str = "SELECT s.id AS id, s.user_id AS user_id, \
         s.rotation_key AS rotation_key, s.expires_at AS expires_at, s.amr AS amr, \
         COALESCE(u.username, '') AS username \
         FROM sessions s LEFT JOIN users u ON u.id = s.user_id \
         WHERE s.refresh_digest = $1 AND s.ended_at IS NULL";
    /// Before a rotation from the current token: the previous one is retired.
    pub const RETIRE_PREVIOUS: &str = "INSERT INTO retired_refresh_tokens (digest, session_id) \
         SELECT previous_digest, id FROM sessions \
         WHERE refresh_digest = $1 AND previous_digest IS NOT NULL AND ended_at IS NULL \
         ON CONFLICT DO NOTHING";
    /// The conditional update that decides a race: one request affects the row.
    pub const ROTATE_CURRENT: &str = "UPDATE sessions \
         SET previous_digest = refresh_digest, refresh_digest = $1, rotated_at = $2 \
         WHERE id = $3 AND refresh_digest = $4 AND ended_at IS NULL AND expires_at > $2";
    /// The session whose previous refresh token this is, with its user's name.
    pub const FIND_BY_PREVIOUS: &str = "SELECT s.id AS id, s.user_id AS user_id, \
         s.rotation_key AS rotation_key, s.refresh_digest AS refresh_digest, \
         s.rotated_at AS rotated_at, s.ended_at AS ended_at, s.expires_at AS expires_at, \
         s.amr AS amr, COALESCE(u.username, '') AS username \
         FROM sessions s LEFT JOIN users u ON u.id = s.user_id \
         WHERE s.previous_digest = $1";
    pub const FIND_RETIRED: &str =
        "SELECT session_id FROM retired_refresh_tokens WHERE digest = $1";
    pub const END_SESSION: &str = "UPDATE sessions SET ended_at = $1, end_reason = $2 \
         WHERE id = $3 AND ended_at IS NULL";
    pub const END_USER_SESSIONS: &str = "UPDATE sessions SET ended_at = $1, end_reason = $2 \
         WHERE user_id = $3 AND ended_at IS NULL AND expires_at > $1 RETURNING id";
    pub const SESSION_STATE: &str =
        "SELECT user_id, ended_at, expires_at FROM sessions WHERE id = $1";
    /// Keyset pages of ended sessions, through the index on `ended_at`.
    pub const ENDED_SINCE: &str = "SELECT id, ended_at FROM sessions \
         WHERE ended_at IS NOT NULL AND (ended_at > $1 OR (ended_at = $1 AND id > $2)) \
         ORDER BY ended_at, id LIMIT $3";
    pub const PURGE_EXPIRED: &str = "DELETE FROM sessions WHERE id IN \
         (SELECT id FROM sessions WHERE ended_at IS NULL AND expires_at <= $1 LIMIT $2)";
    pub const PURGE_ENDED: &str = "DELETE FROM sessions WHERE id IN \
         (SELECT id FROM sessions WHERE ended_at <= $1 LIMIT $2)";
}

/// Sessions ended after `after` (ended_at, id), in that order, at most `limit`: what
/// the revocation pollers read, on `conns` (PostgreSQL's pool, SQLite's readers).
pub(super) async fn ended_since(
    conns: Conns<'_>,
    after: (i64, &str),
    limit: i64,
) -> Result<Vec<EndedSession>, StoreError> {
    let statement = (Statement::new(sql::ENDED_SINCE))
        .bind(after.0)
        .bind(after.1)
        .bind(limit);
    let ended = conns
        .fetch_all(statement)
        .await?
        .iter()
        .map(|row| {
            Ok(EndedSession {
                id: row.get("id")?,
                ended_at: row.get("ended_at")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?;
    Ok(ended)
}

/// `s`'s values as the arguments of a form of `INSERT_SESSION`, those of `$1` to
/// `$9`.
pub(super) fn new_session_args(s: &NewSession) -> [Arg<'_>; 9] {
    [
        s.id.as_str().into(),
        s.user_id.as_str().into(),
        s.rotation_key.to_hex().into(),
        s.refresh_digest.as_str().into(),
        s.created_at.into(),
        s.expires_at.into(),
        s.password_version.into(),
        s.client_addr.as_deref().into(),
        s.amr.as_str().into(),
    ]
}

// The session writes. Each runs inside a transaction its caller holds. Login's
// insert is not one of them: SQLite's writer sends runs of it (`sqlite_runs`),
// PostgreSQL its locking form alone.

/// The live session a `FIND_CURRENT` or `FIND_BY_PREVIOUS` row describes.
fn live(row: &Row) -> Result<LiveSession, sqlx::Error> {
    let id: String = row.get("id")?;
    let user_id: String = row.get("user_id")?;
    let expires_at: i64 = row.get("expires_at")?;
    let amr: String = row.get("amr")?;
    let username: String = row.get("username")?;
    Ok(LiveSession {
        id,
        user_id,
        username,
        expires_at,
        amr,
    })
}

fn rotation_key(row: &Row) -> Result<RotationKey, sqlx::Error> {
    let text: String = row.get("rotation_key")?;
    RotationKey::from_hex(&text)
        .ok_or_else(|| sqlx::Error::Decode("a session's rotation key is not 64 hex digits".into()))
}

async fn end_one(
    conn: &mut Conn<'_>,
    id: &str,
    reason: EndReason,
    now: i64,
) -> Result<bool, sqlx::Error> {
    let done = conn
        .execute(
            Statement::new(sql::END_SESSION)
                .bind(now)
                .bind(reason.label())
                .bind(id),
        )
        .await?;
    Ok(done == 1)
}

pub(super) async fn rotate(conn: &mut Conn<'_>, r: &Rotation) -> Result<Refreshed, sqlx::Error> {
    let presented = r.presented.store_key();
    // 1. The token that works now: rotate from it, if this request wins.
    let current = conn
        .fetch_optional(Statement::new(sql::FIND_CURRENT).bind(presented.as_str()))
        .await?;
    if let Some(row) = current {
        let expires_at: i64 = row.get("expires_at")?;
        if expires_at <= r.now {
            return Ok(Refreshed::Refused("the session has expired"));
        }
        let id: String = row.get("id")?;
        let next = r.presented.next(&rotation_key(&row)?);
        conn.execute(Statement::new(sql::RETIRE_PREVIOUS).bind(presented.as_str()))
            .await?;
        let won = conn
            .execute(
                Statement::new(sql::ROTATE_CURRENT)
                    .bind(next.store_key())
                    .bind(r.now)
                    .bind(id.as_str())
                    .bind(presented.as_str()),
            )
            .await?
            == 1;
        if won {
            return Ok(Refreshed::Rotated {
                session: live(&row)?,
                refresh_token: next,
                replay: false,
            });
        }
        // Another request rotated it first: it is the previous token now.
    }
    // 2. The token just rotated: the same answer within the grace, else reuse.
    let previous = conn
        .fetch_optional(Statement::new(sql::FIND_BY_PREVIOUS).bind(presented.as_str()))
        .await?;
    if let Some(row) = previous {
        let id: String = row.get("id")?;
        let rotated_at: Option<i64> = row.get("rotated_at")?;
        let ended_at: Option<i64> = row.get("ended_at")?;
        let expires_at: i64 = row.get("expires_at")?;
        if ended_at.is_some() {
            return Ok(Refreshed::Reused {
                session_id: id,
                ended_now: false,
            });
        }
        if expires_at <= r.now {
            return Ok(Refreshed::Refused("the session has expired"));
        }
        let within_grace = rotated_at.is_some_and(|at| r.now.saturating_sub(at) <= r.grace_ms);
        if within_grace {
            let next = r.presented.next(&rotation_key(&row)?);
            let current: String = row.get("refresh_digest")?;
            if next.store_key() == current {
                return Ok(Refreshed::Rotated {
                    session: live(&row)?,
                    refresh_token: next,
                    replay: true,
                });
            }
            return Ok(Refreshed::Refused(
                "the refresh token does not lead to the session's current one",
            ));
        }
        let ended_now = end_one(conn, &id, EndReason::Reuse, r.now).await?;
        return Ok(Refreshed::Reused {
            session_id: id,
            ended_now,
        });
    }
    // 3. A token rotated out before that: reuse.
    let retired: Option<String> = conn
        .fetch_optional(Statement::new(sql::FIND_RETIRED).bind(presented.as_str()))
        .await?
        .map(|row| row.first())
        .transpose()?;
    if let Some(id) = retired {
        let ended_now = end_one(conn, &id, EndReason::Reuse, r.now).await?;
        return Ok(Refreshed::Reused {
            session_id: id,
            ended_now,
        });
    }
    Ok(Refreshed::Refused("unknown refresh token"))
}

pub(super) async fn end_user_sessions(
    conn: &mut Conn<'_>,
    user_id: &str,
    reason: EndReason,
    now: i64,
) -> Result<Vec<String>, sqlx::Error> {
    let statement = Statement::new(sql::END_USER_SESSIONS)
        .bind(now)
        .bind(reason.label())
        .bind(user_id);
    conn.fetch_column(statement).await
}

/// Logout by refresh token. Only the current token of a live session ends
/// sessions (with `all`, all of its user's); a token rotated out ends its own
/// session by the reuse rule and nothing else (within the retry grace, not
/// even that); any other ends nothing.
pub(super) async fn end_by_digest(
    conn: &mut Conn<'_>,
    digest: &str,
    all: bool,
    now: i64,
    grace_ms: i64,
) -> Result<LoggedOut, sqlx::Error> {
    let current = conn
        .fetch_optional(Statement::new(sql::FIND_CURRENT).bind(digest))
        .await?;
    if let Some(row) = current {
        let expires_at: i64 = row.get("expires_at")?;
        if expires_at <= now {
            return Ok(LoggedOut::Refused("the session has expired"));
        }
        let (id, user_id) = (row.get("id")?, row.get("user_id")?);
        return Ok(LoggedOut::Ended(
            end_named(conn, id, user_id, all, now).await?,
        ));
    }
    let previous = conn
        .fetch_optional(Statement::new(sql::FIND_BY_PREVIOUS).bind(digest))
        .await?;
    let session = if let Some(row) = previous {
        let id: String = row.get("id")?;
        let rotated_at: Option<i64> = row.get("rotated_at")?;
        let ended_at: Option<i64> = row.get("ended_at")?;
        let expires_at: i64 = row.get("expires_at")?;
        if ended_at.is_some() {
            return Ok(LoggedOut::Refused("a refresh token of an ended session"));
        }
        if expires_at <= now {
            return Ok(LoggedOut::Refused("the session has expired"));
        }
        // Within the grace it may be the owner's retry (as Refresh reads it):
        // refused, but not punished.
        if rotated_at.is_some_and(|at| now.saturating_sub(at) <= grace_ms) {
            return Ok(LoggedOut::Refused("a refresh token rotated moments ago"));
        }
        id
    } else {
        let retired: Option<String> = conn
            .fetch_optional(Statement::new(sql::FIND_RETIRED).bind(digest))
            .await?
            .map(|row| row.first())
            .transpose()?;
        match retired {
            Some(id) => id,
            None => return Ok(LoggedOut::Refused("unknown refresh token")),
        }
    };
    let ended_now = end_one(conn, &session, EndReason::Reuse, now).await?;
    Ok(LoggedOut::Reused {
        session_id: session,
        ended_now,
    })
}

/// Logout by access token (its signature and expiry already verified): its
/// session, or all of its user's, only while that session is live. `None`:
/// the session has ended, expired or is gone, and nothing ends. A token that
/// names no session (issued before sessions) can only end them all.
pub(super) async fn end_by_id(
    conn: &mut Conn<'_>,
    id: &str,
    user_id: &str,
    all: bool,
    now: i64,
) -> Result<Option<Ended>, sqlx::Error> {
    if id.is_empty() {
        return end_named(conn, String::new(), user_id.to_owned(), all, now)
            .await
            .map(|ended| all.then_some(ended));
    }
    let Some(row) = conn
        .fetch_optional(Statement::new(sql::SESSION_STATE).bind(id))
        .await?
    else {
        return Ok(None);
    };
    let owner: String = row.get("user_id")?;
    let ended_at: Option<i64> = row.get("ended_at")?;
    let expires_at: i64 = row.get("expires_at")?;
    if ended_at.is_some() || expires_at <= now {
        return Ok(None);
    }
    end_named(conn, id.to_owned(), owner, all, now)
        .await
        .map(Some)
}

async fn end_named(
    conn: &mut Conn<'_>,
    id: String,
    user_id: String,
    all: bool,
    now: i64,
) -> Result<Ended, sqlx::Error> {
    let ended_now = if all {
        end_user_sessions(conn, &user_id, EndReason::Logout, now).await?
    } else if end_one(conn, &id, EndReason::Logout, now).await? {
        vec![id.clone()]
    } else {
        Vec::new()
    };
    Ok(Ended {
        ended_now,
        named: Some(id),
    })
}

pub(super) async fn purge(
    conn: &mut Conn<'_>,
    now: i64,
    ended_before: i64,
    limit: i64,
) -> Result<Purged, sqlx::Error> {
    let expired = conn
        .execute(Statement::new(sql::PURGE_EXPIRED).bind(now).bind(limit))
        .await?;
    let ended = conn
        .execute(
            Statement::new(sql::PURGE_ENDED)
                .bind(ended_before)
                .bind(limit),
        )
        .await?;
    Ok(Purged { expired, ended })
}
