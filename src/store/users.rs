//! Users in the store: the rows, their statements, and the reads, written once for
//! both backends.
//!
//! The writes are built here ([`new_user_args`], [`change_password`],
//! [`rehash`])
//! and run by each backend its own way (SQLite's batching writer, a PostgreSQL pooled
//! connection); the reads ([`find`], [`find_by_id`], [`max_hash_iterations`]) run on
//! either backend's [`Conns`] (SQLite gathers its reads by name: `sqlite_lookups`).
//! Usernames are stored lowercased, so the UNIQUE (username) constraint is
//! case-insensitive. A password change takes the next `password_version`, and
//! writes only if the version is still the one verified; a rehash keeps it, and
//! writes only if the version and both hash columns are still the ones verified.

use super::{
    db::{Arg, Conns, Row, Statement},
    error::StoreError,
};
use crate::credentials::Username;

/// The users' statements. `$N` placeholders are PostgreSQL's and are also understood
/// by SQLite, so each statement is written once.
pub(super) mod sql {
    /// The user, its cutoff, and whether its second factor is on.
    pub const FIND_USER: &str = "SELECT u.id, u.username, u.password_hash, u.password_hash_ext, u.password_version, \
         u.disabled_at, c.cutoff_at, (SELECT COUNT(*) FROM totp_factors f \
         WHERE f.user_id = u.id AND f.enabled_at IS NOT NULL) AS factors \
         FROM users u LEFT JOIN user_cutoffs c ON c.user_id = u.id WHERE u.username = $1";
    /// [`FIND_USER`] by id.
    pub const FIND_USER_BY_ID: &str = "SELECT u.id, u.username, u.password_hash, u.password_hash_ext, u.password_version, \
         u.disabled_at, c.cutoff_at, (SELECT COUNT(*) FROM totp_factors f \
         WHERE f.user_id = u.id AND f.enabled_at IS NOT NULL) AS factors \
         FROM users u LEFT JOIN user_cutoffs c ON c.user_id = u.id WHERE u.id = $1";
    /// Usernames are stored lowercased, so the UNIQUE (username) conflict is
    /// case-insensitive. A conflict inserts nothing: zero rows affected.
    pub const INSERT_USER: &str = "INSERT INTO users \
         (id, username, password_hash, password_hash_ext, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (username) DO NOTHING";
    /// A rehash: the same password, so the same version, and only if the user's
    /// hashes are still the ones verified (a rehash never undoes a password change,
    /// and of concurrent first logins one rehash is stored). Both columns: an
    /// Argon2id hash behind a marker, or a PBKDF2 hash and no ext hash.
    /// `IS NOT DISTINCT FROM` compares NULLs as equal on both backends (SQLite 3.39
    /// and later).
    pub const REHASH: &str = "UPDATE users SET password_hash = $1, password_hash_ext = $7, \
         updated_at = $2 WHERE id = $3 AND password_version = $4 AND password_hash = $5 \
         AND password_hash_ext IS NOT DISTINCT FROM $6";
    /// A new password: a new version, only if the old one is still the one verified.
    pub const CHANGE_PASSWORD: &str = "UPDATE users \
         SET password_hash = $1, password_hash_ext = $5, password_version = password_version + 1, updated_at = $2 \
         WHERE id = $3 AND password_version = $4";
    /// Read through the index on the generated `hash_iterations` column.
    pub const MAX_HASH_ITERATIONS: &str = "SELECT MAX(hash_iterations) FROM users";
}

/// The highest stored iteration count, as the rest of authd counts them.
fn iterations_from_column(max: Option<i64>) -> u32 {
    max.map_or(0, |n| u32::try_from(n.max(0)).unwrap_or(u32::MAX))
}

/// `user`'s values as the arguments of `INSERT_USER`, those of `$1` to `$6`.
pub(super) fn new_user_args(user: &NewUser, now: i64) -> [Arg<'_>; 6] {
    [
        user.id.as_str().into(),
        user.username.as_str().into(),
        user.password_hash.as_str().into(),
        user.password_hash_ext.as_deref().into(),
        now.into(),
        now.into(),
    ]
}

/// A new password of user `id`, whose password is at `version`: it takes the
/// next version. `ext` is the ext column's new value (`None` clears it).
pub(super) fn change_password<'a>(
    id: &'a str,
    hash: &'a str,
    ext: Option<&'a str>,
    version: i64,
    now: i64,
) -> Statement<'a> {
    Statement::new(sql::CHANGE_PASSWORD)
        .bind(hash)
        .bind(now)
        .bind(id)
        .bind(version)
        .bind(ext)
}

/// `rehash` at `now`: one row changed, or none when the user's hashes are no
/// longer the ones verified.
pub(super) fn rehash(rehash: &Rehash, now: i64) -> Statement<'_> {
    Statement::new(sql::REHASH)
        .bind(rehash.hash.as_str())
        .bind(now)
        .bind(rehash.user_id.as_str())
        .bind(rehash.version)
        .bind(rehash.verified_hash.as_str())
        .bind(rehash.verified_ext.as_deref())
        .bind(rehash.ext.as_deref())
}

/// A new hash of the password a login verified, to store in place of the hashes
/// it was verified against, if they are still the user's.
pub struct Rehash {
    pub user_id: String,
    /// The new `password_hash`: authd's own PBKDF2 hash, or a marker.
    pub hash: String,
    /// The new `password_hash_ext`: the Argon2id hash behind the marker, or `None`.
    pub ext: Option<String>,
    /// The password's version when it was verified (a rehash keeps it).
    pub version: i64,
    /// `password_hash` as it was verified.
    pub verified_hash: String,
    /// `password_hash_ext` as it was verified.
    pub verified_ext: Option<String>,
}

/// The user a `FIND_USER` row describes.
pub(super) fn user_from_row(row: &Row) -> Result<User, sqlx::Error> {
    let disabled_at: Option<i64> = row.get("disabled_at")?;
    let factors: i64 = row.get("factors")?;
    Ok(User {
        id: row.get("id")?,
        username: Username::from_store(row.get("username")?),
        password_hash: row.get("password_hash")?,
        password_hash_ext: row.get("password_hash_ext")?,
        password_version: row.get("password_version")?,
        disabled: disabled_at.is_some(),
        cutoff_at: row.get("cutoff_at")?,
        has_factor: factors > 0,
    })
}

/// A stored user.
#[derive(Debug, Clone)]
pub struct User {
    pub id: String,
    pub username: Username,
    pub password_hash: String,
    /// A hash older releases cannot read, which counts while `password_hash` is a
    /// marker (`password::stored`).
    pub password_hash_ext: Option<String>,
    /// One more at every change of password (and when the account is disabled):
    /// what a login verified.
    pub password_version: i64,
    /// An administrator disabled the account: its password works for nothing.
    pub disabled: bool,
    /// The user's token cutoff (Unix milliseconds), while one is stored: a new
    /// session must start after it.
    pub cutoff_at: Option<i64>,
    /// A second factor is on: a right password alone issues no token.
    pub has_factor: bool,
}

/// A user about to be stored.
#[derive(Debug, Clone)]
pub struct NewUser {
    pub id: String,
    pub username: Username,
    pub password_hash: String,
    /// A hash older releases cannot verify, behind a marker in `password_hash`.
    pub password_hash_ext: Option<String>,
}

/// The user named `username`, read on `conns` (PostgreSQL's pool, SQLite's readers).
pub(super) async fn find(
    conns: Conns<'_>,
    username: &Username,
) -> Result<Option<User>, StoreError> {
    find_by(conns, sql::FIND_USER, username.as_str()).await
}

/// The user of id `id`, read on `conns`.
pub(super) async fn find_by_id(conns: Conns<'_>, id: &str) -> Result<Option<User>, StoreError> {
    find_by(conns, sql::FIND_USER_BY_ID, id).await
}

async fn find_by(
    conns: Conns<'_>,
    statement: &'static str,
    key: &str,
) -> Result<Option<User>, StoreError> {
    let row = conns
        .fetch_optional(Statement::new(statement).bind(key))
        .await?;
    Ok(row.as_ref().map(user_from_row).transpose()?)
}

/// The highest PBKDF2 iteration count of any stored hash (0 with no users), read on
/// `conns`.
pub(super) async fn max_hash_iterations(conns: Conns<'_>) -> Result<u32, StoreError> {
    let row = conns
        .fetch_one(Statement::new(sql::MAX_HASH_ITERATIONS))
        .await?;
    let max: Option<i64> = row.first()?;
    Ok(iterations_from_column(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stored_iteration_count_reads_as_authd_counts_it() {
        assert_eq!(iterations_from_column(None), 0);
        assert_eq!(iterations_from_column(Some(-1)), 0);
        assert_eq!(iterations_from_column(Some(600_000)), 600_000);
        assert_eq!(iterations_from_column(Some(i64::MAX)), u32::MAX);
    }
}
