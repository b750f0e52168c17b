//! Users imported with the password hashes they already have (the admin API's
//! ImportUsers, docs/migration.md): a batch of records written in the transaction
//! its backend holds (SQLite's writer batch, a PostgreSQL transaction), and what
//! each came to.
//!
//! A record is stored with a marker in `password_hash` and its foreign hash in
//! `password_hash_ext` (`password::stored`). The batch goes as multi-row inserts
//! that skip any row whose username or id is taken (`ON CONFLICT DO NOTHING`) and
//! return the ids they stored; the records not stored are then read back by name and
//! id in as few statements, to tell a re-run of the same import (the same user, the
//! same hash: unchanged) from a different user (a conflict). The texts are made once
//! for runs of 1, 2, 4, … [`LONGEST`] rows, so the statement cache holds a few of
//! them; a batch is sent as the longest that fit, then the rest.
//!
//! The caller checks the records (usernames parsed, hashes within their caps, no two
//! of a batch with one name or id) before they come here.

use super::db::{Arg, Conn, Statement};
use crate::credentials::Username;
use std::{collections::HashMap, sync::LazyLock};

/// The most rows in one statement.
pub(super) const LONGEST: usize = 64;

/// One user to import, checked.
#[derive(Debug, Clone)]
pub struct ImportRecord {
    pub id: String,
    /// The id was given by the importer (not made by authd): it must match too for
    /// the record to be the same user as one stored.
    pub id_given: bool,
    pub username: Username,
    /// A marker (`password::stored::marker`).
    pub password_hash: String,
    /// The foreign hash as given.
    pub password_hash_ext: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// When the account is imported disabled: the time and the reason.
    pub disabled: Option<(i64, String)>,
}

/// What a record came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Imported {
    /// Stored now.
    Created,
    /// The same user, with the same hash, was stored before.
    Unchanged,
    /// Another user has this username or id: nothing stored.
    Conflict {
        /// The id of the user in the way.
        existing_id: String,
        /// Whether that user has the record's username (else its id).
        by_username: bool,
    },
}

/// The columns of an imported row, `$1` to `$8` of each row's values.
const COLUMNS: usize = 8;
const INSERT_HEAD: &str = "INSERT INTO users (id, username, password_hash, password_hash_ext, \
     created_at, updated_at, disabled_at, disabled_reason) VALUES ";
const INSERT_TAIL: &str = " ON CONFLICT DO NOTHING RETURNING id";

/// The insert of `n` rows, for n = 1, 2, 4, … [`LONGEST`].
static INSERTS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    texts(|n| {
        let rows: Vec<String> = (0..n)
            .map(|k| {
                let params: Vec<String> = (1..=COLUMNS)
                    .map(|i| format!("${}", k * COLUMNS + i))
                    .collect();
                format!("({})", params.join(", "))
            })
            .collect();
        format!("{INSERT_HEAD}{}{INSERT_TAIL}", rows.join(", "))
    })
});

/// The users of `n` usernames ($1 to $n) or `n` ids ($n+1 to $2n).
static LOOKUPS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    texts(|n| {
        let names: Vec<String> = (1..=n).map(|i| format!("${i}")).collect();
        let ids: Vec<String> = (n + 1..=2 * n).map(|i| format!("${i}")).collect();
        format!(
            "SELECT id, username, password_hash_ext FROM users \
             WHERE username IN ({}) OR id IN ({})",
            names.join(", "),
            ids.join(", ")
        )
    })
});

/// `make(n)` for n = 1, 2, 4, … [`LONGEST`], made once for the program's life.
fn texts(make: impl Fn(usize) -> String) -> Vec<&'static str> {
    let mut texts = Vec::new();
    let mut n = 1;
    while n <= LONGEST {
        texts.push(&*make(n).leak());
        n *= 2;
    }
    texts
}

/// Splits `items` into runs of 1, 2, 4, … [`LONGEST`]: each the longest that fits.
fn runs<T>(items: &[T]) -> impl Iterator<Item = (usize, &[T])> {
    let mut rest = items;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let power = rest.len().min(LONGEST).ilog2() as usize;
        let (these, after) = rest.split_at(1 << power);
        rest = after;
        Some((power, these))
    })
}

/// Writes `records` on `conn`, inside the transaction its caller holds; `now` is
/// the time of the rows' `updated_at`. Returns what each came to, in order.
pub(super) async fn import(
    conn: &mut Conn<'_>,
    records: &[ImportRecord],
    now: i64,
) -> Result<Vec<Imported>, sqlx::Error> {
    let mut stored: std::collections::HashSet<String> = std::collections::HashSet::new();
    for (power, run) in runs(records) {
        let args = run.iter().flat_map(|r| {
            let (disabled_at, reason) = match &r.disabled {
                Some((at, reason)) => (Some(*at), Some(reason.as_str())),
                None => (None, None),
            };
            [
                Arg::Text(&r.id),
                Arg::Text(r.username.as_str()),
                Arg::Text(&r.password_hash),
                Arg::Text(&r.password_hash_ext),
                Arg::Int(r.created_at),
                Arg::Int(now),
                Arg::MaybeInt(disabled_at),
                Arg::MaybeText(reason),
            ]
        });
        let ids: Vec<String> = conn
            .fetch_column(Statement::new(INSERTS[power]).bind_all(args))
            .await?;
        stored.extend(ids);
    }
    let missed: Vec<&ImportRecord> = (records.iter())
        .filter(|r| !stored.contains(&r.id))
        .collect();
    // The users in the way of the records not stored: by name, and by id.
    let mut by_name: HashMap<String, (String, Option<String>)> = HashMap::new();
    let mut by_id: HashMap<String, (String, Option<String>)> = HashMap::new();
    for (power, run) in runs(&missed) {
        let names = run.iter().map(|r| Arg::Text(r.username.as_str()));
        let ids = run.iter().map(|r| Arg::Text(&r.id));
        let statement = Statement::new(LOOKUPS[power]).bind_all(names).bind_all(ids);
        for row in conn.fetch_all(statement).await? {
            let id: String = row.get("id")?;
            let username: String = row.get("username")?;
            let ext: Option<String> = row.get("password_hash_ext")?;
            by_name.insert(username.to_lowercase(), (id.clone(), ext.clone()));
            by_id.insert(id.clone(), (username.to_lowercase(), ext));
        }
    }
    Ok(records
        .iter()
        .map(|r| {
            if stored.contains(&r.id) {
                return Imported::Created;
            }
            if let Some((id, ext)) = by_name.get(r.username.as_str()) {
                let same = (!r.id_given || *id == r.id)
                    && ext.as_deref() == Some(r.password_hash_ext.as_str());
                return if same {
                    Imported::Unchanged
                } else {
                    Imported::Conflict {
                        existing_id: id.clone(),
                        by_username: true,
                    }
                };
            }
            match by_id.get(&r.id) {
                Some(_) => Imported::Conflict {
                    existing_id: r.id.clone(),
                    by_username: false,
                },
                // Neither stored nor in the way: deleted by another writer meanwhile
                // (PostgreSQL), or two records of one name or id, which the caller
                // never sends; a conflict either way, never a silent loss.
                None => Imported::Conflict {
                    existing_id: String::new(),
                    by_username: true,
                },
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_goes_in_runs_of_powers_of_two() {
        let items: Vec<usize> = (0..(LONGEST * 2 + 7)).collect();
        let sizes: Vec<usize> = runs(&items).map(|(_, run)| run.len()).collect();
        assert_eq!(sizes, [LONGEST, LONGEST, 4, 2, 1]);
        assert!(INSERTS[0].ends_with(
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING RETURNING id"
        ));
        assert!(INSERTS[1].contains("($9, $10, $11, $12, $13, $14, $15, $16)"));
        assert!(LOOKUPS[1].ends_with("username IN ($1, $2) OR id IN ($3, $4)"));
    }
}
