//! Account events: the transactional outbox (docs/events.md). Every change to an
//! account writes its event in the transaction of the change ([`record`], called
//! by `writes` for each write that changed something, and by the inserts of new
//! users), so an event exists exactly when its change committed.
//!
//! Positions come from the database (SQLite's `AUTOINCREMENT`, a PostgreSQL
//! sequence) and only grow. Readers must never pass a position while a lower one
//! may still commit: SQLite's one writer commits in position order, so every
//! committed position is final; on PostgreSQL sequence values commit out of order
//! under concurrent writers, and [`Frontier`] says how far a reader may go.
//!
//! # The PostgreSQL frontier: a transaction-id watermark
//!
//! Every event row is inserted after its transaction changed a row (the change it
//! reports), so the transaction has its id before it takes a position. A reader
//! reads the sequence's last value `L`, then (in a later statement) the current
//! snapshot `S`: every transaction that took a position up to `L` had its id before
//! `S` was taken, so it had ended before `S` or is one of `S`'s in-progress ids
//! (`pg_snapshot_xip`). Once each of those is visible (ended: committed or rolled
//! back) to a newer snapshot, every position up to `L` is committed and readable,
//! or gone for good; the reader may pass `L` then, not before. A transaction held
//! open holds every stream at the positions before its own, however long it takes
//! (authd's own are bounded by `AUTHD_DB_STATEMENT_TIMEOUT`), and no event is ever
//! skipped; a per-gap wait bounded by the longest transaction would guess that
//! bound, and a guess too short loses events. The watermark costs one query per
//! poll while other transactions are in flight, none when none are.

use super::{
    db::{Conn, Conns, Row, Statement},
    error::StoreError,
    users::NewUser,
};
use serde_json::{Value, json};

/// The kinds of events (the `kind` column, the stream's and webhooks' `type`).
pub mod kind {
    pub const REGISTERED: &str = "user.registered";
    pub const PASSWORD_CHANGED: &str = "user.password_changed";
    /// An administrator set the password (`authd admin set-password`).
    pub const PASSWORD_SET: &str = "user.password_set";
    pub const DISABLED: &str = "user.disabled";
    pub const ENABLED: &str = "user.enabled";
    pub const DELETED: &str = "user.deleted";
    pub const SESSIONS_ENDED: &str = "user.sessions_ended";
    pub const SECOND_FACTOR_ADDED: &str = "user.second_factor_added";
    pub const SECOND_FACTOR_REMOVED: &str = "user.second_factor_removed";
    /// The only kind that carries a secret: the reset token, for the subscriber
    /// that delivers it to the user.
    pub const RESET_REQUESTED: &str = "user.password_reset_requested";
    pub const RESET_COMPLETED: &str = "user.password_reset_completed";
    /// Service accounts' changes (docs/service-accounts.md); the event's `user_id`
    /// is the account's id.
    pub const SERVICE_CREATED: &str = "service_account.created";
    pub const SERVICE_DISABLED: &str = "service_account.disabled";
    pub const SERVICE_DELETED: &str = "service_account.deleted";
    pub const SERVICE_CREDENTIAL_ADDED: &str = "service_account.credential_added";
    pub const SERVICE_CREDENTIAL_REMOVED: &str = "service_account.credential_removed";

    /// Every kind, in the order docs/events.md lists them.
    pub const ALL: [&str; 16] = [
        REGISTERED,
        PASSWORD_CHANGED,
        PASSWORD_SET,
        DISABLED,
        ENABLED,
        DELETED,
        SESSIONS_ENDED,
        SECOND_FACTOR_ADDED,
        SECOND_FACTOR_REMOVED,
        RESET_REQUESTED,
        RESET_COMPLETED,
        SERVICE_CREATED,
        SERVICE_DISABLED,
        SERVICE_DELETED,
        SERVICE_CREDENTIAL_ADDED,
        SERVICE_CREDENTIAL_REMOVED,
    ];
}

/// An event as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub position: i64,
    /// Unix milliseconds, when its change was made.
    pub at: i64,
    pub user_id: String,
    pub kind: String,
    /// What changed, a JSON object.
    pub data: String,
}

/// An event about to be written, in the transaction of its change.
#[derive(Debug, Clone)]
pub(super) struct NewEvent {
    pub user_id: String,
    pub kind: &'static str,
    pub data: Value,
}

impl NewEvent {
    pub(super) fn new(user_id: &str, kind: &'static str, data: Value) -> Self {
        Self {
            user_id: user_id.to_owned(),
            kind,
            data,
        }
    }

    /// The sessions of `user_id` that ended for `reason`; `None` when none did.
    pub(super) fn sessions_ended(user_id: &str, reason: &str, ids: &[String]) -> Option<Self> {
        (!ids.is_empty()).then(|| {
            Self::new(
                user_id,
                kind::SESSIONS_ENDED,
                json!({ "reason": reason, "sessions": ids }),
            )
        })
    }
}

/// The event of a new user's registration.
pub(super) fn registered(user: &NewUser) -> NewEvent {
    NewEvent::new(
        &user.id,
        kind::REGISTERED,
        json!({ "username": user.username.as_str(), "source": "register" }),
    )
}

pub(super) mod sql {
    pub const INSERT: &str =
        "INSERT INTO account_events (at, user_id, kind, data) VALUES ($1, $2, $3, $4)";
    /// An event of the user whose session `$2` is.
    pub const INSERT_FOR_SESSION: &str = "INSERT INTO account_events (at, user_id, kind, data) \
         SELECT $1, user_id, $3, $4 FROM sessions WHERE id = $2";
    pub const AFTER: &str = "SELECT position, at, user_id, kind, data FROM account_events \
         WHERE position > $1 AND position <= $2 ORDER BY position LIMIT $3";
    pub const PRUNED: &str = "SELECT through FROM account_events_pruned";
    pub const LAST_SQLITE: &str = "SELECT COALESCE(MAX(position), 0) FROM account_events";
    pub const LAST_POSTGRES: &str =
        "SELECT COALESCE(pg_sequence_last_value('account_events_position_seq'), 0)";
    pub const SNAPSHOT: &str = "SELECT pg_current_snapshot()::text";
    /// Whether every transaction in progress in snapshot `$1` has ended.
    pub const SETTLED: &str = "SELECT COALESCE(bool_and(pg_visible_in_snapshot(x, \
         pg_current_snapshot())), TRUE) FROM pg_snapshot_xip($1::text::pg_snapshot) AS x";
    /// The highest position retention deletes: the newest event older than `$1`,
    /// or the one `$2` events below the newest.
    pub const PRUNE_TARGET: &str = "SELECT COALESCE(MAX(p), 0) FROM (\
         SELECT MAX(position) AS p FROM account_events WHERE at < $1 \
         UNION ALL SELECT MAX(position) - $2 FROM account_events) AS t";
    pub const PRUNE: &str = "DELETE FROM account_events WHERE position IN \
         (SELECT position FROM account_events WHERE position <= $1 ORDER BY position LIMIT $2) \
         RETURNING position";
    /// A new user (`users::sql::INSERT_USER`) and its event, in one statement:
    /// the event is written when the user is.
    pub const INSERT_USER_POSTGRES: &str = "WITH u AS (INSERT INTO users \
         (id, username, password_hash, password_hash_ext, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (username) DO NOTHING RETURNING id) \
         INSERT INTO account_events (at, user_id, kind, data) SELECT $5, id, $7, $8 FROM u";
    pub const WEBHOOK_NEW: &str = "INSERT INTO webhook_deliveries \
         (endpoint, position, attempts, updated_at, owner, lease_until) \
         VALUES ($1, $2, 0, $3, $4, $5) ON CONFLICT (endpoint) DO NOTHING";
    pub const WEBHOOK_LEASE: &str = "UPDATE webhook_deliveries SET owner = $2, lease_until = $4 \
         WHERE endpoint = $1 AND (owner = $2 OR lease_until <= $3) RETURNING position";
    pub const WEBHOOK_RECORD: &str = "UPDATE webhook_deliveries SET position = $3, attempts = $4, \
         updated_at = $5, lease_until = $6 WHERE endpoint = $1 AND owner = $2";
    pub const WEBHOOK_RELEASE: &str =
        "UPDATE webhook_deliveries SET lease_until = 0 WHERE endpoint = $1 AND owner = $2";
    pub const MARK_PRUNED: &str =
        "UPDATE account_events_pruned SET through = $1 WHERE through < $1";
}

/// Writes `event` at `now`, in the transaction `conn` holds.
pub(super) async fn record(
    conn: &mut Conn<'_>,
    event: &NewEvent,
    now: i64,
) -> Result<(), sqlx::Error> {
    conn.execute(
        Statement::new(sql::INSERT)
            .bind(now)
            .bind(event.user_id.as_str())
            .bind(event.kind)
            .bind(event.data.to_string()),
    )
    .await?;
    Ok(())
}

/// Writes an event of `kind` for the user of session `session_id`.
pub(super) async fn record_for_session(
    conn: &mut Conn<'_>,
    session_id: &str,
    kind: &'static str,
    data: Value,
    now: i64,
) -> Result<(), sqlx::Error> {
    conn.execute(
        Statement::new(sql::INSERT_FOR_SESSION)
            .bind(now)
            .bind(session_id)
            .bind(kind)
            .bind(data.to_string()),
    )
    .await?;
    Ok(())
}

fn event_from_row(row: &Row) -> Result<Event, sqlx::Error> {
    Ok(Event {
        position: row.get("position")?,
        at: row.get("at")?,
        user_id: row.get("user_id")?,
        kind: row.get("kind")?,
        data: row.get("data")?,
    })
}

/// The events after `after` up to `upto`, in position order, at most `limit`.
pub(super) async fn after(
    conns: Conns<'_>,
    after: i64,
    upto: i64,
    limit: i64,
) -> Result<Vec<Event>, StoreError> {
    let statement = Statement::new(sql::AFTER)
        .bind(after)
        .bind(upto)
        .bind(limit);
    let rows = conns.fetch_all(statement).await?;
    Ok(rows
        .iter()
        .map(event_from_row)
        .collect::<Result<_, sqlx::Error>>()?)
}

/// The highest position retention has deleted (0: none).
pub(super) async fn pruned(conns: Conns<'_>) -> Result<i64, StoreError> {
    Ok(conns
        .fetch_one(Statement::new(sql::PRUNED))
        .await?
        .first()?)
}

/// How far a reader may read now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frontier {
    /// The highest position given out.
    pub last: i64,
    /// PostgreSQL: the snapshot taken after `last` was read, whose transactions in
    /// progress must end before a reader passes a position up to `last`; `None`
    /// when there were none (or on SQLite): `last` may be passed now.
    pub pending: Option<String>,
}

/// The frontier on `conns`' backend.
pub(super) async fn frontier(conns: Conns<'_>) -> Result<Frontier, StoreError> {
    match conns {
        Conns::Sqlite(_) => frontier_sqlite(conns).await,
        Conns::Postgres(_) => frontier_postgres(conns).await,
    }
}

/// SQLite's frontier: the last committed position, final.
async fn frontier_sqlite(conns: Conns<'_>) -> Result<Frontier, StoreError> {
    let last = conns
        .fetch_one(Statement::new(sql::LAST_SQLITE))
        .await?
        .first()?;
    Ok(Frontier {
        last,
        pending: None,
    })
}

/// PostgreSQL's frontier: the sequence's last value, then the snapshot (in that
/// order: see the module's documentation).
async fn frontier_postgres(conns: Conns<'_>) -> Result<Frontier, StoreError> {
    let last: i64 = conns
        .fetch_one(Statement::new(sql::LAST_POSTGRES))
        .await?
        .first()?;
    let snapshot: String = conns
        .fetch_one(Statement::new(sql::SNAPSHOT))
        .await?
        .first()?;
    Ok(Frontier {
        last,
        pending: (!snapshot_idle(&snapshot)).then_some(snapshot),
    })
}

/// Whether a snapshot (`xmin:xmax:xip,…`) lists no transaction in progress.
fn snapshot_idle(snapshot: &str) -> bool {
    snapshot.split(':').nth(2).is_none_or(str::is_empty)
}

/// Whether every transaction in progress in `snapshot` has ended.
pub(super) async fn settled(conns: Conns<'_>, snapshot: &str) -> Result<bool, StoreError> {
    Ok(conns
        .fetch_one(Statement::new(sql::SETTLED).bind(snapshot))
        .await?
        .first()?)
}

/// One pass of retention: deletes up to `limit` events older than `before` or
/// more than `keep` below the newest, oldest first; how many it deleted.
pub(super) async fn prune(
    conn: &mut Conn<'_>,
    before: i64,
    keep: i64,
    limit: i64,
) -> Result<u64, sqlx::Error> {
    let target: i64 = conn
        .fetch_one(Statement::new(sql::PRUNE_TARGET).bind(before).bind(keep))
        .await?
        .first()?;
    if target <= 0 {
        return Ok(0);
    }
    let deleted: Vec<i64> = conn
        .fetch_column(Statement::new(sql::PRUNE).bind(target).bind(limit))
        .await?;
    // Everything up to the last deleted is gone (a position between two deleted
    // ones was never committed).
    if let Some(through) = deleted.iter().copied().max() {
        conn.execute(Statement::new(sql::MARK_PRUNED).bind(through))
            .await?;
    }
    Ok(deleted.len() as u64)
}

/// A webhook endpoint's delivery state (`webhook_deliveries`).
#[derive(Debug, Clone)]
pub(super) enum WebhookWrite {
    /// Takes (or renews) the endpoint's lease for `owner` until `until`; a new
    /// endpoint starts after `start`. Answers the position delivered up to, or
    /// nothing while another owner holds it.
    Lease {
        endpoint: String,
        owner: String,
        start: i64,
        now: i64,
        until: i64,
    },
    /// Records how far `owner` got; `false` when it no longer holds the lease.
    Record {
        endpoint: String,
        owner: String,
        position: i64,
        attempts: i64,
        now: i64,
        until: i64,
    },
    Release {
        endpoint: String,
        owner: String,
    },
}

/// Applies a webhook write: the position (`Lease`), or whether it wrote.
pub(super) async fn webhook(
    conn: &mut Conn<'_>,
    write: &WebhookWrite,
) -> Result<Option<i64>, sqlx::Error> {
    match write {
        WebhookWrite::Lease {
            endpoint,
            owner,
            start,
            now,
            until,
        } => {
            conn.execute(
                Statement::new(sql::WEBHOOK_NEW)
                    .bind(endpoint.as_str())
                    .bind(*start)
                    .bind(*now)
                    .bind(owner.as_str())
                    .bind(*until),
            )
            .await?;
            let row = conn
                .fetch_optional(
                    Statement::new(sql::WEBHOOK_LEASE)
                        .bind(endpoint.as_str())
                        .bind(owner.as_str())
                        .bind(*now)
                        .bind(*until),
                )
                .await?;
            row.map(|row| row.first()).transpose()
        }
        WebhookWrite::Record {
            endpoint,
            owner,
            position,
            attempts,
            now,
            until,
        } => {
            let done = conn
                .execute(
                    Statement::new(sql::WEBHOOK_RECORD)
                        .bind(endpoint.as_str())
                        .bind(owner.as_str())
                        .bind(*position)
                        .bind(*attempts)
                        .bind(*now)
                        .bind(*until),
                )
                .await?;
            Ok((done == 1).then_some(*position))
        }
        WebhookWrite::Release { endpoint, owner } => {
            conn.execute(
                Statement::new(sql::WEBHOOK_RELEASE)
                    .bind(endpoint.as_str())
                    .bind(owner.as_str()),
            )
            .await?;
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_without_transactions_in_progress_is_idle() {
        assert!(snapshot_idle("100:100:"));
        assert!(!snapshot_idle("100:105:100,103"));
    }
}
