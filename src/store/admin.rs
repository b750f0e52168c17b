//! What the admin API reads and changes in the store: accounts as an administrator
//! sees them, pages of them, disabling, enabling and deleting one, and the per-user
//! token cutoffs every replica's revocation poller reads.
//!
//! The reads run on either backend's [`Conns`]; the writes ([`disable`], [`enable`],
//! [`delete`], [`end_sessions_of`], [`set_password`], [`purge_cutoffs`]) on a
//! [`Conn`] inside one transaction the backend holds, as the session writes do. Each write decides its
//! race in the database:
//! - disabling takes the next `password_version` in the same statement that marks
//!   the account, so a Login or a ChangePassword already past its hash stores
//!   nothing (theirs are conditional on the version they verified), and ends every
//!   live session and writes the user's cutoff in the same transaction;
//! - deleting removes the account, its sessions and their retired refresh tokens,
//!   and writes the cutoff (the tokens outlive the rows);
//! - enabling clears the mark and nothing else: the cutoff stays, so a token issued
//!   before the account was disabled never works again.
//!
//! Pages of users are in byte order of the (lowercase ASCII) username, through an
//! index in that order on both backends: SQLite's NOCASE equals it for lowercase
//! names, PostgreSQL uses `COLLATE "C"` (a locale's order would not keep a prefix
//! in one range).

use super::{
    db::{Conn, Conns, Row, Statement},
    error::StoreError,
    session::{EndReason, end_user_sessions},
};

/// The admin statements. `$N` placeholders are understood by both backends; the
/// page query differs only in its collation.
pub(super) mod sql {
    // Each statement of an account reads its columns, with its live sessions (at
    // `$1`) and the start of its newest stored session.
    pub const ACCOUNT_BY_ID: &str = "SELECT id, username, created_at, updated_at, disabled_at, disabled_reason, \
         (SELECT COUNT(*) FROM sessions s WHERE s.user_id = users.id \
            AND s.ended_at IS NULL AND s.expires_at > $1) AS live_sessions, \
         (SELECT MAX(s.created_at) FROM sessions s WHERE s.user_id = users.id) \
            AS last_login_at \
         FROM users WHERE id = $2";
    pub const ACCOUNT_BY_USERNAME: &str = "SELECT id, username, created_at, updated_at, disabled_at, disabled_reason, \
         (SELECT COUNT(*) FROM sessions s WHERE s.user_id = users.id \
            AND s.ended_at IS NULL AND s.expires_at > $1) AS live_sessions, \
         (SELECT MAX(s.created_at) FROM sessions s WHERE s.user_id = users.id) \
            AS last_login_at \
         FROM users WHERE username = $2";
    /// A page after `$2`, within [`$3`, `$4`), by the disabled filter `$5` (0: any,
    /// 1: disabled only, 2: in use only), at most `$6`.
    pub const PAGE_SQLITE: &str = "SELECT id, username, created_at, updated_at, disabled_at, disabled_reason, \
         (SELECT COUNT(*) FROM sessions s WHERE s.user_id = users.id \
            AND s.ended_at IS NULL AND s.expires_at > $1) AS live_sessions, \
         (SELECT MAX(s.created_at) FROM sessions s WHERE s.user_id = users.id) \
            AS last_login_at \
         FROM users WHERE username > $2 AND username >= $3 AND username < $4 \
         AND ($5 = 0 OR ($5 = 1 AND disabled_at IS NOT NULL) \
              OR ($5 = 2 AND disabled_at IS NULL)) \
         ORDER BY username LIMIT $6";
    pub const PAGE_POSTGRES: &str = "SELECT id, username, created_at, updated_at, disabled_at, disabled_reason, \
         (SELECT COUNT(*) FROM sessions s WHERE s.user_id = users.id \
            AND s.ended_at IS NULL AND s.expires_at > $1) AS live_sessions, \
         (SELECT MAX(s.created_at) FROM sessions s WHERE s.user_id = users.id) \
            AS last_login_at \
         FROM users WHERE username COLLATE \"C\" > $2 AND username COLLATE \"C\" >= $3 \
         AND username COLLATE \"C\" < $4 \
         AND ($5 = 0 OR ($5 = 1 AND disabled_at IS NOT NULL) \
              OR ($5 = 2 AND disabled_at IS NULL)) \
         ORDER BY username COLLATE \"C\" LIMIT $6";
    /// Marks the account and takes the next password version, if it is in use.
    pub const DISABLE: &str = "UPDATE users SET disabled_at = $1, disabled_reason = $2, \
         password_version = password_version + 1, updated_at = $1 \
         WHERE id = $3 AND disabled_at IS NULL";
    pub const ENABLE: &str = "UPDATE users SET disabled_at = NULL, disabled_reason = NULL, \
         updated_at = $1 WHERE id = $2 AND disabled_at IS NOT NULL";
    /// The later of the stored cutoff and this one.
    pub const CUTOFF: &str = "INSERT INTO user_cutoffs (user_id, cutoff_at) VALUES ($1, $2) \
         ON CONFLICT (user_id) DO UPDATE SET cutoff_at = excluded.cutoff_at \
         WHERE user_cutoffs.cutoff_at < excluded.cutoff_at";
    pub const DELETE_RETIRED: &str = "DELETE FROM retired_refresh_tokens WHERE session_id IN \
         (SELECT id FROM sessions WHERE user_id = $1)";
    pub const DELETE_SESSIONS: &str = "DELETE FROM sessions WHERE user_id = $1";
    pub const DELETE_USER: &str = "DELETE FROM users WHERE id = $1";
    /// Keyset pages of cutoffs, through the index on `cutoff_at`.
    pub const CUTOFFS_SINCE: &str = "SELECT user_id, cutoff_at FROM user_cutoffs \
         WHERE cutoff_at > $1 OR (cutoff_at = $1 AND user_id > $2) \
         ORDER BY cutoff_at, user_id LIMIT $3";
    /// A user's live sessions at `$2`, newest first.
    pub const LIVE_SESSIONS: &str = "SELECT id, created_at, rotated_at, expires_at, client_addr \
         FROM sessions WHERE user_id = $1 AND ended_at IS NULL AND expires_at > $2 \
         ORDER BY created_at DESC, id DESC LIMIT $3";
    /// Ends one live session, if it is the user's.
    pub const END_NAMED: &str = "UPDATE sessions SET ended_at = $1, end_reason = $2 \
         WHERE id = $3 AND user_id = $4 AND ended_at IS NULL AND expires_at > $1";
    /// An administrator's new password: the next version, whatever the current one.
    pub const SET_PASSWORD: &str = "UPDATE users SET password_hash = $1, \
         password_hash_ext = $4, password_version = password_version + 1, updated_at = $2 WHERE id = $3";
    pub const PURGE_CUTOFFS: &str = "DELETE FROM user_cutoffs WHERE user_id IN \
         (SELECT user_id FROM user_cutoffs WHERE cutoff_at <= $1 LIMIT $2)";
}

/// An account as the admin API shows it. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub id: String,
    pub username: String,
    pub created_at: i64,
    pub updated_at: i64,
    /// When and why it was disabled; `None` while it is in use.
    pub disabled: Option<(i64, String)>,
    /// Sessions not ended and not expired.
    pub live_sessions: i64,
    /// When its newest stored session started (sessions are deleted once they ended
    /// or expired and no token of theirs can be valid).
    pub last_login_at: Option<i64>,
}

/// Which account: by id or by username (lowercased, as stored).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccountKey {
    Id(String),
    Username(String),
}

/// Which accounts a page holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageQuery {
    /// The page starts after this username ("" for the first page).
    pub after: String,
    /// Only usernames that start with this ("" for every one).
    pub prefix: String,
    /// `Some(true)`: only disabled accounts; `Some(false)`: only those in use.
    pub disabled: Option<bool>,
    pub limit: i64,
}

impl PageQuery {
    /// The range of usernames the prefix allows, in byte order: [prefix, the
    /// prefix with its last byte one more). Usernames are ASCII below 0x7f.
    fn bounds(&self) -> (String, String) {
        let mut upper = self.prefix.clone().into_bytes();
        match upper.last_mut() {
            Some(last) => *last = last.saturating_add(1),
            None => upper.push(0x7f),
        }
        (
            self.prefix.clone(),
            String::from_utf8(upper).unwrap_or_else(|_| "\u{7f}".to_owned()),
        )
    }

    fn filter(&self) -> i64 {
        match self.disabled {
            None => 0,
            Some(true) => 1,
            Some(false) => 2,
        }
    }
}

/// A per-user cutoff: tokens of sessions of `user_id` started at or before
/// `cutoff_at` (Unix milliseconds) are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cutoff {
    pub user_id: String,
    pub cutoff_at: i64,
}

/// A live session as the admin API shows it. Times are Unix milliseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionInfo {
    pub id: String,
    pub started_at: i64,
    pub refreshed_at: Option<i64>,
    pub expires_at: i64,
    pub client_addr: Option<String>,
}

/// What disabling or deleting an account came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    /// The sessions it ended (disabling) or deleted (deleting).
    pub sessions: Vec<String>,
    /// The cutoff it wrote.
    pub cutoff_at: i64,
}

/// The outcome of a change to an account that may not exist or not be in the state
/// the change needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<T> {
    Done(T),
    /// Disabling a disabled account, enabling one in use.
    AlreadySo,
    NoSuchUser,
}

fn account_from_row(row: &Row) -> Result<Account, sqlx::Error> {
    let disabled_at: Option<i64> = row.get("disabled_at")?;
    let reason: Option<String> = row.get("disabled_reason")?;
    Ok(Account {
        id: row.get("id")?,
        username: row.get("username")?,
        created_at: row.get("created_at")?,
        updated_at: row.get("updated_at")?,
        disabled: disabled_at.map(|at| (at, reason.unwrap_or_default())),
        live_sessions: row.get("live_sessions")?,
        last_login_at: row.get("last_login_at")?,
    })
}

/// The account `key` names, read on `conns`, its live sessions counted at `now`.
pub(super) async fn account(
    conns: Conns<'_>,
    key: &AccountKey,
    now: i64,
) -> Result<Option<Account>, StoreError> {
    let (statement, value) = match key {
        AccountKey::Id(id) => (sql::ACCOUNT_BY_ID, id.as_str()),
        AccountKey::Username(name) => (sql::ACCOUNT_BY_USERNAME, name.as_str()),
    };
    let row = (conns.fetch_optional(Statement::new(statement).bind(now).bind(value))).await?;
    Ok(row.as_ref().map(account_from_row).transpose()?)
}

/// A page of accounts in username order, with `statement` (the backend's form of
/// the page query).
pub(super) async fn page(
    conns: Conns<'_>,
    statement: &'static str,
    query: &PageQuery,
    now: i64,
) -> Result<Vec<Account>, StoreError> {
    let (low, high) = query.bounds();
    let read = Statement::new(statement)
        .bind(now)
        .bind(query.after.as_str())
        .bind(low.as_str())
        .bind(high.as_str())
        .bind(query.filter())
        .bind(query.limit);
    let rows = conns.fetch_all(read).await?;
    Ok(rows
        .iter()
        .map(account_from_row)
        .collect::<Result<_, sqlx::Error>>()?)
}

/// The live sessions of `user_id` at `now`, newest first, at most `limit`.
pub(super) async fn live_sessions(
    conns: Conns<'_>,
    user_id: &str,
    now: i64,
    limit: i64,
) -> Result<Vec<SessionInfo>, StoreError> {
    let query = (Statement::new(sql::LIVE_SESSIONS))
        .bind(user_id)
        .bind(now)
        .bind(limit);
    let rows = conns.fetch_all(query).await?;
    Ok(rows
        .iter()
        .map(|row| {
            Ok(SessionInfo {
                id: row.get("id")?,
                started_at: row.get("created_at")?,
                refreshed_at: row.get("rotated_at")?,
                expires_at: row.get("expires_at")?,
                client_addr: row.get("client_addr")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?)
}

/// Cutoffs written after `after` (cutoff_at, user_id), in that order, at most
/// `limit`: what the revocation pollers read.
pub(super) async fn cutoffs_since(
    conns: Conns<'_>,
    after: (i64, &str),
    limit: i64,
) -> Result<Vec<Cutoff>, StoreError> {
    let query = (Statement::new(sql::CUTOFFS_SINCE))
        .bind(after.0)
        .bind(after.1)
        .bind(limit);
    let rows = conns.fetch_all(query).await?;
    Ok(rows
        .iter()
        .map(|row| {
            Ok(Cutoff {
                user_id: row.get("user_id")?,
                cutoff_at: row.get("cutoff_at")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()?)
}

// The admin writes. Each runs inside a transaction its caller holds.

async fn cutoff(conn: &mut Conn<'_>, user_id: &str, now: i64) -> Result<(), sqlx::Error> {
    let statement = Statement::new(sql::CUTOFF).bind(user_id).bind(now);
    conn.execute(statement).await.map(drop)
}

async fn exists(conn: &mut Conn<'_>, user_id: &str) -> Result<bool, sqlx::Error> {
    let found: Option<String> = conn
        .fetch_optional(Statement::new("SELECT id FROM users WHERE id = $1").bind(user_id))
        .await?
        .map(|row| row.first())
        .transpose()?;
    Ok(found.is_some())
}

pub(super) async fn disable(
    conn: &mut Conn<'_>,
    user_id: &str,
    reason: &str,
    now: i64,
) -> Result<Change<Revoked>, sqlx::Error> {
    let marked = conn
        .execute(
            Statement::new(sql::DISABLE)
                .bind(now)
                .bind(reason)
                .bind(user_id),
        )
        .await?
        == 1;
    if !marked {
        return Ok(if exists(conn, user_id).await? {
            Change::AlreadySo
        } else {
            Change::NoSuchUser
        });
    }
    let sessions = end_user_sessions(conn, user_id, EndReason::Disabled, now).await?;
    cutoff(conn, user_id, now).await?;
    Ok(Change::Done(Revoked {
        sessions,
        cutoff_at: now,
    }))
}

pub(super) async fn enable(
    conn: &mut Conn<'_>,
    user_id: &str,
    now: i64,
) -> Result<Change<()>, sqlx::Error> {
    let cleared = conn
        .execute(Statement::new(sql::ENABLE).bind(now).bind(user_id))
        .await?
        == 1;
    Ok(if cleared {
        Change::Done(())
    } else if exists(conn, user_id).await? {
        Change::AlreadySo
    } else {
        Change::NoSuchUser
    })
}

pub(super) async fn delete(
    conn: &mut Conn<'_>,
    user_id: &str,
    now: i64,
) -> Result<Change<Revoked>, sqlx::Error> {
    let sessions: Vec<String> = conn
        .fetch_column(Statement::new("SELECT id FROM sessions WHERE user_id = $1").bind(user_id))
        .await?;
    conn.execute(Statement::new(sql::DELETE_RETIRED).bind(user_id))
        .await?;
    conn.execute(Statement::new(sql::DELETE_SESSIONS).bind(user_id))
        .await?;
    let deleted = conn
        .execute(Statement::new(sql::DELETE_USER).bind(user_id))
        .await?
        == 1;
    if !deleted {
        return Ok(Change::NoSuchUser);
    }
    cutoff(conn, user_id, now).await?;
    Ok(Change::Done(Revoked {
        sessions,
        cutoff_at: now,
    }))
}

/// Ends the named live sessions of `user_id` (all of them when `ids` is
/// empty); returns those it ended.
pub(super) async fn end_sessions_of(
    conn: &mut Conn<'_>,
    user_id: &str,
    ids: &[String],
    now: i64,
) -> Result<Vec<String>, sqlx::Error> {
    if ids.is_empty() {
        return end_user_sessions(conn, user_id, EndReason::Admin, now).await;
    }
    let mut ended = Vec::new();
    for id in ids {
        let done = conn
            .execute(
                Statement::new(sql::END_NAMED)
                    .bind(now)
                    .bind(EndReason::Admin.label())
                    .bind(id.as_str())
                    .bind(user_id),
            )
            .await?;
        if done == 1 {
            ended.push(id.clone());
        }
    }
    Ok(ended)
}

/// An administrator's new password for `user_id`, and (with
/// `end_sessions`) every live session ended; `None` when there is no such
/// user.
pub(super) async fn set_password(
    conn: &mut Conn<'_>,
    user_id: &str,
    hash: &str,
    ext: Option<&str>,
    end_sessions: bool,
    now: i64,
) -> Result<Option<Vec<String>>, sqlx::Error> {
    let changed = conn
        .execute(
            Statement::new(sql::SET_PASSWORD)
                .bind(hash)
                .bind(now)
                .bind(user_id)
                .bind(ext),
        )
        .await?
        == 1;
    if !changed {
        return Ok(None);
    }
    if !end_sessions {
        return Ok(Some(Vec::new()));
    }
    end_user_sessions(conn, user_id, EndReason::Admin, now)
        .await
        .map(Some)
}

pub(super) async fn purge_cutoffs(
    conn: &mut Conn<'_>,
    before: i64,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    conn.execute(Statement::new(sql::PURGE_CUTOFFS).bind(before).bind(limit))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(prefix: &str) -> PageQuery {
        PageQuery {
            after: String::new(),
            prefix: prefix.into(),
            disabled: None,
            limit: 10,
        }
    }

    #[test]
    fn a_prefix_bounds_a_range_in_byte_order() {
        assert_eq!(query("").bounds(), (String::new(), "\u{7f}".to_owned()));
        assert_eq!(query("ab").bounds(), ("ab".to_owned(), "ac".to_owned()));
        assert_eq!(query("a-").bounds(), ("a-".to_owned(), "a.".to_owned()));
        assert_eq!(query("z").bounds(), ("z".to_owned(), "{".to_owned()));
    }

    #[test]
    fn the_disabled_filter_has_three_values() {
        let mut q = query("");
        assert_eq!(q.filter(), 0);
        q.disabled = Some(true);
        assert_eq!(q.filter(), 1);
        q.disabled = Some(false);
        assert_eq!(q.filter(), 2);
    }
}
