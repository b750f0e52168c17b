//! What a backend is: the [`Backend`] trait, every operation of the store, which
//! SQLite (`sqlite`) and PostgreSQL (`postgres`) each implement.
//!
//! A backend supplies what only it knows: where its reads run ([`Backend::conns`]),
//! how a write is applied in a transaction ([`Backend::apply`]: SQLite's writer
//! batches them, PostgreSQL gives each its own), its inserts and rehashes, a page of
//! accounts (the collation differs), the probe, closing. The rest is written here
//! once, over those: each read a function of `users`, `session`, `admin` or
//! `factor` on the backend's connections, each write one [`Write`] and the kind of
//! its answer.
//!
//! Every operation is a boxed future (`Op`): `Store` holds its backend as a trait
//! object, and an operation's future (a pool's lease, a query, a timeout) is
//! kilobytes, which every request future awaiting it would otherwise hold inline.

use super::{
    admin::{self, Account, AccountKey, Change, Cutoff, PageQuery, Revoked, SessionInfo},
    db::Conns,
    error::StoreError,
    events::{self, Event, Frontier, WebhookWrite},
    factor::{self, Factor, FactorAnswer, FactorWrite, LiveChallenge},
    import::{ImportRecord, Imported},
    reset::{self, ResetAnswer, ResetWrite},
    service::{self, ServiceAccount, ServiceAnswer, ServiceKey, ServiceWrite},
    session::{self, Ended, EndedSession, LoggedOut, NewSession, Purged, Refreshed, Rotation},
    users::{self, NewUser, Rehash, User},
    writes::{Answer, Answered, Write},
};
use crate::credentials::Username;
use futures_util::future::BoxFuture;

/// A store operation under way.
pub(super) type Op<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// Counters of SQLite's writer task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterSnapshot {
    /// Transactions committed.
    pub transactions: u64,
    /// Writes (inserts and updates) acknowledged by those transactions.
    pub writes: u64,
    /// The largest number of writes in one transaction.
    pub largest_batch: u64,
}

/// The operations of a storage backend.
pub(super) trait Backend: Send + Sync {
    /// The `backend` label of the store's metrics.
    fn name(&self) -> &'static str;

    /// The `db.system` of the store's spans (OpenTelemetry's names).
    fn db_system(&self) -> &'static str;

    /// Whether other processes may write to this database.
    fn is_shared(&self) -> bool;

    /// The connections reads run on.
    fn conns(&self) -> Conns<'_>;

    /// Applies `write` in a transaction, once it commits.
    fn apply(&self, write: Write) -> Op<'_, Answer>;

    /// Stores a new user; [`StoreError::Duplicate`] when the username is taken.
    fn insert_user(&self, user: NewUser) -> Op<'_, ()>;

    /// The user named `username`.
    fn find_user<'a>(&'a self, username: &'a Username) -> Op<'a, Option<User>>;

    /// A rehash of the same password, if the user's hashes are still the ones
    /// verified; whether it was stored.
    fn update_password_hash(&self, rehash: Rehash) -> Op<'_, bool>;

    /// Login's session, if the user's password is still at the version verified.
    fn insert_session(&self, session: NewSession) -> Op<'_, bool>;

    /// A page of accounts in username order (byte order).
    fn accounts_page<'a>(&'a self, query: &'a PageQuery, now: i64) -> Op<'a, Vec<Account>>;

    /// Whether the database answers as requests see it; the highest iteration count.
    fn probe(&self) -> Op<'_, u32>;

    /// Commits everything queued and closes the connections.
    fn close(&self) -> BoxFuture<'_, ()>;

    /// The SQLite writer's counters; `None` for other backends.
    fn writer_stats(&self) -> Option<WriterSnapshot> {
        None
    }

    /// The highest PBKDF2 iteration count of any stored hash.
    fn max_hash_iterations(&self) -> Op<'_, u32> {
        Box::pin(users::max_hash_iterations(self.conns()))
    }

    /// The user of id `id`.
    fn find_user_by_id<'a>(&'a self, id: &'a str) -> Op<'a, Option<User>> {
        Box::pin(users::find_by_id(self.conns(), id))
    }

    /// Sessions ended after `after`, at most `limit`.
    fn ended_since<'a>(&'a self, after: (i64, &'a str), limit: i64) -> Op<'a, Vec<EndedSession>> {
        Box::pin(session::ended_since(self.conns(), after, limit))
    }

    /// The account `key` names, its live sessions counted at `now`.
    fn account<'a>(&'a self, key: &'a AccountKey, now: i64) -> Op<'a, Option<Account>> {
        Box::pin(admin::account(self.conns(), key, now))
    }

    /// Cutoffs written after `after`, at most `limit`.
    fn cutoffs_since<'a>(&'a self, after: (i64, &'a str), limit: i64) -> Op<'a, Vec<Cutoff>> {
        Box::pin(admin::cutoffs_since(self.conns(), after, limit))
    }

    /// The live sessions of `user_id` at `now`, at most `limit`.
    fn live_sessions<'a>(
        &'a self,
        user_id: &'a str,
        now: i64,
        limit: i64,
    ) -> Op<'a, Vec<SessionInfo>> {
        Box::pin(admin::live_sessions(self.conns(), user_id, now, limit))
    }

    /// The TOTP factor of `user_id`.
    fn factor<'a>(&'a self, user_id: &'a str) -> Op<'a, Option<Factor>> {
        Box::pin(factor::factor(self.conns(), user_id))
    }

    /// The Login challenge of `digest`, if live at `now` with attempts left.
    fn live_challenge<'a>(
        &'a self,
        digest: &'a str,
        now: i64,
        max: i64,
    ) -> Op<'a, Option<LiveChallenge>> {
        Box::pin(factor::live_challenge(self.conns(), digest, now, max))
    }

    /// A Refresh (`session::rotate`).
    fn rotate(&self, rotation: Rotation) -> Op<'_, Refreshed> {
        applied(self, Write::Rotate(rotation))
    }

    /// Logout by a refresh token's digest (`session::end_by_digest`).
    fn end_by_digest(&self, digest: &str, all: bool, now: i64, grace_ms: i64) -> Op<'_, LoggedOut> {
        let digest = digest.to_owned();
        applied(
            self,
            Write::EndByDigest {
                digest,
                all,
                now,
                grace_ms,
            },
        )
    }

    /// Logout by a session id (`session::end_by_id`).
    fn end_by_id(&self, id: &str, user_id: &str, all: bool, now: i64) -> Op<'_, Option<Ended>> {
        let (id, user_id) = (id.to_owned(), user_id.to_owned());
        applied(
            self,
            Write::EndById {
                id,
                user_id,
                all,
                now,
            },
        )
    }

    /// A new password, if still at `version`, and every session ended.
    fn change_password(
        &self,
        id: &str,
        hash: String,
        ext: Option<String>,
        version: i64,
        now: i64,
    ) -> Op<'_, Option<Vec<String>>> {
        let id = id.to_owned();
        applied(
            self,
            Write::ChangePassword {
                id,
                hash,
                ext,
                version,
                now,
            },
        )
    }

    /// Deletes expired and long-ended sessions (`session::purge`).
    fn purge(&self, now: i64, ended_before: i64, limit: i64) -> Op<'_, Purged> {
        applied(
            self,
            Write::Purge {
                now,
                ended_before,
                limit,
            },
        )
    }

    /// Disables an account (`admin::disable`).
    fn disable_user(&self, id: &str, reason: &str, now: i64) -> Op<'_, Change<Revoked>> {
        let (id, reason) = (id.to_owned(), reason.to_owned());
        applied(self, Write::Disable { id, reason, now })
    }

    /// Enables an account again (`admin::enable`).
    fn enable_user(&self, id: &str, now: i64) -> Op<'_, Change<()>> {
        applied(
            self,
            Write::Enable {
                id: id.to_owned(),
                now,
            },
        )
    }

    /// Deletes an account (`admin::delete`).
    fn delete_user(&self, id: &str, now: i64) -> Op<'_, Change<Revoked>> {
        applied(
            self,
            Write::Delete {
                id: id.to_owned(),
                now,
            },
        )
    }

    /// Deletes old cutoffs (`admin::purge_cutoffs`).
    fn purge_cutoffs(&self, before: i64, limit: i64) -> Op<'_, u64> {
        applied(self, Write::PurgeCutoffs { before, limit })
    }

    /// Ends the named live sessions of a user (`admin::end_sessions_of`).
    fn end_sessions_of(&self, user_id: &str, ids: Vec<String>, now: i64) -> Op<'_, Vec<String>> {
        let user_id = user_id.to_owned();
        applied(self, Write::EndSessionsOf { user_id, ids, now })
    }

    /// An administrator's new password (`admin::set_password`).
    fn set_password(
        &self,
        user_id: &str,
        hash: String,
        ext: Option<String>,
        end_sessions: bool,
        now: i64,
    ) -> Op<'_, Option<Vec<String>>> {
        let user_id = user_id.to_owned();
        applied(
            self,
            Write::SetPassword {
                user_id,
                hash,
                ext,
                end_sessions,
                now,
            },
        )
    }

    /// A batch of imported users, in one transaction (`import::import`).
    fn import_users(&self, records: Vec<ImportRecord>) -> Op<'_, Vec<Imported>> {
        applied(self, Write::Import(records))
    }

    /// The service account `key` names.
    fn service_account<'a>(&'a self, key: &'a ServiceKey) -> Op<'a, Option<ServiceAccount>> {
        Box::pin(service::account(self.conns(), key))
    }

    /// Service accounts in name order after `after`, at most `limit`.
    fn service_accounts_page<'a>(
        &'a self,
        after: &'a str,
        limit: i64,
    ) -> Op<'a, Vec<ServiceAccount>> {
        Box::pin(service::page(self.conns(), after, limit))
    }

    /// The service account a certificate identity or an external subject is bound to.
    fn service_account_by_identity<'a>(
        &'a self,
        issuer: Option<&'a str>,
        identity: &'a str,
    ) -> Op<'a, Option<ServiceAccount>> {
        Box::pin(service::by_identity(self.conns(), issuer, identity))
    }

    /// A write of service accounts (`service::service_write`).
    fn service_write(&self, write: ServiceWrite) -> Op<'_, ServiceAnswer> {
        applied(self, Write::Service(write))
    }

    /// Events after `after` up to `upto`, at most `limit` (`events::after`).
    fn events_after(&self, after: i64, upto: i64, limit: i64) -> Op<'_, Vec<Event>> {
        Box::pin(events::after(self.conns(), after, upto, limit))
    }

    /// The highest position retention deleted.
    fn events_pruned(&self) -> Op<'_, i64> {
        Box::pin(events::pruned(self.conns()))
    }

    /// How far readers may read (`events::Frontier`).
    fn event_frontier(&self) -> Op<'_, Frontier> {
        Box::pin(events::frontier(self.conns()))
    }

    /// Whether the transactions in progress in a frontier's snapshot have ended.
    fn events_settled<'a>(&'a self, snapshot: &'a str) -> Op<'a, bool> {
        Box::pin(events::settled(self.conns(), snapshot))
    }

    /// One pass of retention (`events::prune`).
    fn prune_events(&self, before: i64, keep: i64, limit: i64) -> Op<'_, u64> {
        applied(
            self,
            Write::PruneEvents {
                before,
                keep,
                limit,
            },
        )
    }

    /// A webhook endpoint's delivery state (`events::webhook`).
    fn webhook_write(&self, write: WebhookWrite) -> Op<'_, Option<i64>> {
        applied(self, Write::Webhook(write))
    }

    /// The user of the live reset `digest` (`reset::live`).
    fn live_reset<'a>(&'a self, digest: &'a str, now: i64) -> Op<'a, Option<String>> {
        Box::pin(reset::live(self.conns(), digest, now))
    }

    /// A password reset's write (`reset::apply`).
    fn reset_write(&self, write: ResetWrite) -> Op<'_, ResetAnswer> {
        applied(self, Write::Reset(write))
    }

    /// A write of the second factor (`factor::factor_write`).
    fn factor_write(&self, write: FactorWrite) -> Op<'_, FactorAnswer> {
        applied(self, Write::Factor(write))
    }
}

/// `write` applied by `backend`, its answer of the kind `T`.
fn applied<B: Backend + ?Sized, T: Answered + Send>(backend: &B, write: Write) -> Op<'_, T> {
    Box::pin(async move { backend.apply(write).await?.take() })
}
