//! What an administrator does to accounts (the admin API, docs/admin.md): read
//! them, page through them, disable, enable and delete them; and how every
//! replica learns the token cutoffs those actions write.
//!
//! Disabling and deleting act on the live tokens within the revocation bound:
//! the replica that acts refuses them at once (the cutoff and the ended sessions go
//! into its set), the others when their poller reads the cutoff
//! (`AUTHD_REVOCATION_DELAY`). One cutoff per user, however many sessions it had.
//! A Login, Refresh or ChangePassword already in flight loses against them in the
//! database (see `store::admin`), so nothing started before the action survives it.

use super::{
    Accounts,
    upkeep::{POLL_LOOKBACK_MS, POLL_PAGE},
};
use crate::{
    credentials::Password,
    error::Error,
    store::{
        Account, AccountKey, Change, EndReason, ImportRecord, Imported, PageQuery, Revoked,
        SessionInfo,
    },
};
use std::time::Instant;

/// The most sessions ListSessions returns, and EndSessions ends by name.
pub const MAX_SESSIONS: i64 = 1000;

/// What an administrator's change came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    /// The account after the change.
    pub account: Account,
    /// Whether it changed anything (disabling a disabled account does not).
    pub changed: bool,
    /// Sessions the change ended (disabling) or deleted (deleting).
    pub sessions_ended: usize,
}

/// A new session's id: a UUIDv7 of `now`, or of the millisecond after the user's
/// cutoff when that is later (a replica whose clock is behind the one that wrote
/// the cutoff), so that the session's tokens are never taken for ones the cutoff
/// refuses.
pub(super) fn session_id_after(now: i64, cutoff: Option<i64>) -> String {
    let at = match cutoff {
        Some(cutoff) if cutoff >= now => cutoff.saturating_add(1),
        _ => now,
    };
    super::uuid_v7(at).to_string()
}

/// The id of a new user made at `now` (Unix milliseconds).
pub fn new_user_id(now: i64) -> String {
    super::uuid_v7(now).to_string()
}

impl Accounts {
    /// Stores a batch of imported users in one transaction: what each came to.
    pub async fn import_users(&self, records: Vec<ImportRecord>) -> Result<Vec<Imported>, Error> {
        Ok(self.store.import_users(records).await?)
    }

    /// The account `key` names.
    pub async fn account(&self, key: &AccountKey) -> Result<Account, Error> {
        (self.store.account(key, self.clock.millis()).await?).ok_or(Error::NoSuchUser)
    }

    /// A page of accounts in username order.
    pub async fn accounts_page(&self, query: &PageQuery) -> Result<Vec<Account>, Error> {
        Ok(self.store.accounts_page(query, self.clock.millis()).await?)
    }

    /// Disables the account: its password works for nothing (a Login answers as a
    /// wrong password does), its sessions end, and every token of them is refused.
    pub async fn disable_user(&self, key: &AccountKey, reason: &str) -> Result<Changed, Error> {
        let id = self.account(key).await?.id;
        let now = self.clock.millis();
        let outcome = self.store.disable_user(&id, reason, now).await?;
        let (changed, sessions_ended) = match outcome {
            Change::Done(revoked) => {
                let n = self.revoke(&id, &revoked, now);
                self.counters.ended(EndReason::Disabled, n);
                (true, n)
            }
            Change::AlreadySo => (false, 0),
            Change::NoSuchUser => return Err(Error::NoSuchUser),
        };
        let account = self.account(&AccountKey::Id(id)).await?;
        Ok(Changed {
            account,
            changed,
            sessions_ended,
        })
    }

    /// Enables the account again: its password works again. Tokens issued before it
    /// was disabled stay refused.
    pub async fn enable_user(&self, key: &AccountKey) -> Result<Changed, Error> {
        let id = self.account(key).await?.id;
        let changed = match self.store.enable_user(&id, self.clock.millis()).await? {
            Change::Done(()) => true,
            Change::AlreadySo => false,
            Change::NoSuchUser => return Err(Error::NoSuchUser),
        };
        let account = self.account(&AccountKey::Id(id)).await?;
        Ok(Changed {
            account,
            changed,
            sessions_ended: 0,
        })
    }

    /// Deletes the account, its sessions and their refresh tokens; its tokens are
    /// refused, and its username may be registered again (a new user, a new id).
    /// Returns the account as it was.
    pub async fn delete_user(&self, key: &AccountKey) -> Result<Changed, Error> {
        let account = self.account(key).await?;
        let now = self.clock.millis();
        match self.store.delete_user(&account.id, now).await? {
            Change::Done(revoked) => {
                let sessions_ended = self.revoke(&account.id, &revoked, now);
                Ok(Changed {
                    account,
                    changed: true,
                    sessions_ended,
                })
            }
            Change::AlreadySo | Change::NoSuchUser => Err(Error::NoSuchUser),
        }
    }

    /// The live sessions of user `user_id`, newest first.
    pub async fn sessions_of(&self, user_id: &str) -> Result<Vec<SessionInfo>, Error> {
        let now = self.clock.millis();
        Ok(self.store.live_sessions(user_id, now, MAX_SESSIONS).await?)
    }

    /// Ends the named live sessions of user `user_id` (every one when `ids` is
    /// empty); returns how many it ended. Their tokens are refused here at once,
    /// on other replicas when their poller reads the ends.
    pub async fn end_sessions_of(&self, user_id: &str, ids: Vec<String>) -> Result<usize, Error> {
        let now = self.clock.millis();
        let ended = self.store.end_sessions_of(user_id, ids, now).await?;
        for session in &ended {
            self.revocations.insert(session, now, now);
        }
        self.counters.ended(EndReason::Admin, ended.len());
        Ok(ended.len())
    }

    /// An administrator's new password for user `user_id` (the current one is not
    /// needed; the caller has checked the new one against the rules and the
    /// blocklist), hashed as any other, and every live session ended unless
    /// `keep_sessions`. Returns how many sessions it ended.
    pub async fn set_password(
        &self,
        user_id: &str,
        password: Password,
        keep_sessions: bool,
        deadline: Option<Instant>,
    ) -> Result<usize, Error> {
        let hash = self.hasher.hash(password, deadline).await?;
        let now = self.clock.millis();
        let ended = (self
            .store
            .set_password(
                user_id,
                hash.password_hash,
                hash.password_hash_ext,
                !keep_sessions,
                now,
            )
            .await?)
            .ok_or(Error::NoSuchUser)?;
        for session in &ended {
            self.revocations.insert(session, now, now);
        }
        self.counters.ended(EndReason::Admin, ended.len());
        // The hash replaced may have been the most expensive one stored.
        if let Err(e) = self.refresh_hash_cost().await {
            tracing::warn!(error = %e, "reading the highest stored hash cost failed");
        }
        Ok(ended.len())
    }

    /// Puts what an action revoked into this replica's set at once; returns the
    /// number of sessions.
    fn revoke(&self, user_id: &str, revoked: &Revoked, now: i64) -> usize {
        self.revocations.cut_off(user_id, revoked.cutoff_at, now);
        for id in &revoked.sessions {
            self.revocations.insert(id, now, now);
        }
        revoked.sessions.len()
    }

    /// Reads the cutoffs written (on any replica) since `cursor`, the latest seen.
    /// Reads the store only with `read_store` (see `poll_revocations`).
    pub(super) async fn poll_cutoffs(
        &self,
        cursor: &mut i64,
        read_store: bool,
    ) -> Result<usize, Error> {
        let now = self.clock.millis();
        let mut after = (cursor.saturating_sub(POLL_LOOKBACK_MS), String::new());
        let mut read = 0;
        if !read_store {
            return Ok(0);
        }
        loop {
            let page = (self.store)
                .cutoffs_since((after.0, &after.1), POLL_PAGE)
                .await?;
            for cutoff in &page {
                (self.revocations).cut_off(&cutoff.user_id, cutoff.cutoff_at, now);
            }
            read += page.len();
            let Some(last) = page.last() else { break };
            *cursor = (*cursor).max(last.cutoff_at);
            after = (last.cutoff_at, last.user_id.clone());
            if (page.len() as i64) < POLL_PAGE {
                break;
            }
        }
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start_of(id: &str) -> i64 {
        let (s, n) = uuid::Uuid::parse_str(id)
            .unwrap()
            .get_timestamp()
            .unwrap()
            .to_unix();
        i64::try_from(s).unwrap() * 1000 + i64::from(n / 1_000_000)
    }

    #[test]
    fn a_session_starts_after_its_users_cutoff() {
        let now = 1_765_000_000_000;
        // A cutoff written by a replica whose clock is ahead.
        let ahead = now + 5_000;
        assert_eq!(start_of(&session_id_after(now, Some(ahead))), ahead + 1);
        assert_eq!(start_of(&session_id_after(now, Some(now))), now + 1);
        // An older cutoff, or none: the session starts now.
        let id = session_id_after(now, Some(now - 60_000));
        assert_eq!(start_of(&id), now);
        let id = session_id_after(now, None);
        assert_eq!(start_of(&id), now);
    }
}
