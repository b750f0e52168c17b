//! Self-service password resets in the store (docs/recovery.md): at most one live
//! reset per user, kept as the digest of its token and the password version it
//! was issued for. A request supersedes the user's earlier reset; a completion
//! consumes the reset (a conditional `DELETE` that one request wins, on any
//! replica), sets the new password if the version is still the one issued for,
//! and ends every session of the user, in one transaction.

use super::{
    db::{Conn, Conns, Statement},
    error::StoreError,
    events::{NewEvent, kind},
    session::{EndReason, end_user_sessions},
    users,
};
use serde_json::json;

pub(super) mod sql {
    /// A new reset of an enabled user still at the version read; it replaces the
    /// user's earlier one.
    pub const REQUEST: &str = "INSERT INTO password_resets \
         (user_id, password_version, digest, created_at, expires_at) \
         SELECT id, password_version, $2, $3, $4 FROM users \
         WHERE id = $1 AND password_version = $5 AND disabled_at IS NULL \
         ON CONFLICT (user_id) DO UPDATE SET password_version = excluded.password_version, \
         digest = excluded.digest, created_at = excluded.created_at, \
         expires_at = excluded.expires_at";
    pub const LIVE: &str = "SELECT r.user_id FROM password_resets r JOIN users u ON u.id = r.user_id \
         WHERE r.digest = $1 AND r.expires_at > $2 AND u.disabled_at IS NULL \
         AND u.password_version = r.password_version";
    pub const CONSUME: &str = "DELETE FROM password_resets WHERE digest = $1 \
         RETURNING user_id, password_version, expires_at";
    pub const PURGE: &str = "DELETE FROM password_resets WHERE user_id IN \
         (SELECT user_id FROM password_resets WHERE expires_at <= $1 LIMIT $2)";
    pub const ENABLED_AT: &str =
        "SELECT id FROM users WHERE id = $1 AND password_version = $2 AND disabled_at IS NULL";
}

/// A write of a password reset, one transaction. No `Debug`: a request holds the
/// token, which is never printed.
#[derive(Clone)]
pub enum ResetWrite {
    /// A new reset for the user, at the password version read.
    Request {
        user_id: String,
        username: String,
        password_version: i64,
        /// The token, for the event that delivers it; never stored.
        token: String,
        digest: String,
        expires_at: i64,
    },
    /// The reset of `digest` used to set a new password.
    Complete {
        digest: String,
        hash: String,
        ext: Option<String>,
    },
    /// Deletes up to `limit` resets expired at `now`.
    Purge { now: i64, limit: i64 },
}

/// What a [`ResetWrite`] came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetAnswer {
    /// A request stored (`true`), or not (the user changed meanwhile).
    Requested(bool),
    /// The new password is set: the user's, and the sessions ended.
    Completed {
        user_id: String,
        sessions: Vec<String>,
    },
    /// No live reset of that digest (unknown, used, expired, superseded, or its
    /// user changed since): nothing changed but the reset's deletion.
    Refused,
    Count(u64),
}

/// The user whose live reset `digest` is, at `now`.
pub(super) async fn live(
    conns: Conns<'_>,
    digest: &str,
    now: i64,
) -> Result<Option<String>, StoreError> {
    let row = conns
        .fetch_optional(Statement::new(sql::LIVE).bind(digest).bind(now))
        .await?;
    Ok(row.map(|row| row.first()).transpose()?)
}

pub(super) async fn apply(
    conn: &mut Conn<'_>,
    write: &ResetWrite,
    now: i64,
) -> Result<ResetAnswer, sqlx::Error> {
    Ok(match write {
        ResetWrite::Request {
            user_id,
            password_version,
            digest,
            expires_at,
            ..
        } => {
            let done = conn
                .execute(
                    Statement::new(sql::REQUEST)
                        .bind(user_id.as_str())
                        .bind(digest.as_str())
                        .bind(now)
                        .bind(*expires_at)
                        .bind(*password_version),
                )
                .await?;
            ResetAnswer::Requested(done == 1)
        }
        ResetWrite::Complete { digest, hash, ext } => {
            let Some(row) = conn
                .fetch_optional(Statement::new(sql::CONSUME).bind(digest.as_str()))
                .await?
            else {
                return Ok(ResetAnswer::Refused);
            };
            let user_id: String = row.get("user_id")?;
            let version: i64 = row.get("password_version")?;
            let expires_at: i64 = row.get("expires_at")?;
            // An expired reset is gone now too; a disabled user's stays refused.
            let enabled = conn
                .fetch_optional(
                    Statement::new(sql::ENABLED_AT)
                        .bind(user_id.as_str())
                        .bind(version),
                )
                .await?
                .is_some();
            if expires_at <= now || !enabled {
                return Ok(ResetAnswer::Refused);
            }
            let changed = conn
                .execute(users::change_password(
                    &user_id,
                    hash,
                    ext.as_deref(),
                    version,
                    now,
                ))
                .await?;
            if changed != 1 {
                return Ok(ResetAnswer::Refused);
            }
            let sessions =
                end_user_sessions(conn, &user_id, EndReason::PasswordChange, now).await?;
            ResetAnswer::Completed { user_id, sessions }
        }
        ResetWrite::Purge { now, limit } => ResetAnswer::Count(
            conn.execute(Statement::new(sql::PURGE).bind(*now).bind(*limit))
                .await?,
        ),
    })
}

/// The events of a reset write that changed something.
pub(super) fn events(write: &ResetWrite, answer: &ResetAnswer) -> Vec<Option<NewEvent>> {
    match (write, answer) {
        (
            ResetWrite::Request {
                user_id,
                username,
                token,
                expires_at,
                ..
            },
            ResetAnswer::Requested(true),
        ) => vec![Some(NewEvent::new(
            user_id,
            kind::RESET_REQUESTED,
            json!({ "username": username, "token": token, "expires_at": expires_at }),
        ))],
        (ResetWrite::Complete { .. }, ResetAnswer::Completed { user_id, sessions }) => vec![
            Some(NewEvent::new(
                user_id,
                kind::RESET_COMPLETED,
                json!({ "sessions_ended": sessions.len() }),
            )),
            NewEvent::sessions_ended(user_id, "password_reset", sessions),
        ],
        _ => vec![],
    }
}
