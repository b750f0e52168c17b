//! The sessions that ended, in memory, so that ValidateToken refuses their access
//! tokens without a database query.
//!
//! An entry matters only while an access token of its session may still be valid:
//! until `ended_at + AUTHD_TOKEN_TTL + CLOCK_SKEW`; then it is forgotten
//! ([`Revocations::forget_expired`], run by the poller). The set is filled at once
//! on the replica that ends a session, and on every replica by the poller, which
//! reads the sessions ended since its last look (see `accounts` and
//! docs/sessions.md).
//!
//! Memory is bounded by `capacity` entries. At the bound the entry that ended first
//! is evicted, and its end becomes the *floor*: every access token issued at or
//! before the floor is refused as revoked. That refuses some tokens of live
//! sessions too (their clients refresh and get new ones), never accepts a token of
//! an ended session: a flood of logouts degrades to more refreshes, not to
//! revoked tokens that work again. The floor stops mattering once every token
//! issued before it has expired.
//!
//! Per-user cutoffs are kept beside the sessions: an administrator who disables or
//! deletes an account refuses every token of a session of that user that started
//! at or before the cutoff (the session's start is read from its UUIDv7 id; a
//! session id that is no UUIDv7 is judged by the token's `iat`). One entry per
//! user, however many sessions it had; they are bounded, kept and evicted the same
//! way (at the bound the oldest cutoff becomes the floor too). Login makes a new
//! session's id start after its user's stored cutoff (`accounts`), so an account
//! enabled again gets working tokens whatever the replicas' clocks say.
//!
//! Reads (every ValidateToken) take a read lock and two hash lookups; writes are
//! rare (a session's end, an administrator's action).

use prometheus::{IntCounter, IntGauge};
use std::{
    collections::{BTreeSet, HashMap},
    sync::RwLock,
    time::Duration,
};

/// How far replicas' clocks may disagree: added to how long an entry is kept.
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);

#[derive(Default)]
struct Inner {
    /// Session id (a UUID) -> when it ended (Unix milliseconds).
    ended: HashMap<u128, i64>,
    /// The same entries, by when they ended: for forgetting and eviction.
    by_end: BTreeSet<(i64, u128)>,
    /// User id -> its cutoff (Unix milliseconds).
    cutoffs: HashMap<String, i64>,
    /// The same entries, by cutoff: for forgetting and eviction.
    by_cutoff: BTreeSet<(i64, String)>,
    /// Tokens issued at or before this (Unix milliseconds) are refused.
    floor: i64,
}

/// The revoked sessions of one replica.
pub struct Revocations {
    inner: RwLock<Inner>,
    capacity: usize,
    cutoff_capacity: usize,
    /// How long after its end a session's entry is kept, in milliseconds.
    keep_ms: i64,
    size: IntGauge,
    evicted: IntCounter,
}

/// A session id as the set keys it; `None` for an id that is no UUID (no session
/// of ours: such a token is refused by nothing here, and named no session).
fn key(session_id: &str) -> Option<u128> {
    uuid::Uuid::try_parse(session_id).ok().map(|u| u.as_u128())
}

/// When a session started, from its UUIDv7 id (Unix milliseconds); `None` for an
/// id that is no UUIDv7.
fn session_start(session_id: &str) -> Option<i64> {
    let id = uuid::Uuid::try_parse(session_id).ok()?;
    if id.get_version_num() != 7 {
        return None;
    }
    let (seconds, nanos) = id.get_timestamp()?.to_unix();
    i64::try_from(seconds)
        .ok()?
        .checked_mul(1000)?
        .checked_add(i64::from(nanos / 1_000_000))
}

impl Revocations {
    /// A set for access tokens that live `token_ttl`, holding at most `capacity`
    /// ended sessions and `cutoff_capacity` per-user cutoffs.
    pub fn new(
        token_ttl: Duration,
        capacity: usize,
        cutoff_capacity: usize,
        size: IntGauge,
        evicted: IntCounter,
    ) -> Self {
        let keep = token_ttl + CLOCK_SKEW;
        Self {
            inner: RwLock::new(Inner::default()),
            capacity: capacity.max(1),
            cutoff_capacity: cutoff_capacity.max(1),
            keep_ms: i64::try_from(keep.as_millis()).unwrap_or(i64::MAX),
            size,
            evicted,
        }
    }

    /// Whether a token of `session_id` of user `user_id`, issued at `issued_at`
    /// (Unix seconds), is refused: its session ended, its session started at or
    /// before its user's cutoff, or it was issued at or before the floor.
    pub fn is_revoked(&self, session_id: &str, user_id: &str, issued_at: u64) -> bool {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let issued_ms = i64::try_from(issued_at.saturating_mul(1000)).unwrap_or(i64::MAX);
        if inner.floor != 0 && issued_ms <= inner.floor {
            return true;
        }
        if let Some(&cutoff) = inner.cutoffs.get(user_id) {
            let started = session_start(session_id).unwrap_or(issued_ms);
            if started <= cutoff {
                return true;
            }
        }
        key(session_id).is_some_and(|k| inner.ended.contains_key(&k))
    }

    /// Whether any of `ids` (users', service accounts' or credentials' ids) has a
    /// cutoff at or after `since` (Unix milliseconds), or the floor is: what was
    /// read of them at `since` may be out of date.
    pub fn cut_since(&self, ids: &[&str], since: i64) -> bool {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        if inner.floor != 0 && inner.floor >= since {
            return true;
        }
        ids.iter()
            .any(|id| inner.cutoffs.get(*id).is_some_and(|&at| at >= since))
    }

    /// Records that every token of a session of `user_id` started at or before
    /// `cutoff_at` (Unix milliseconds) is refused; `now` is the current time, so a
    /// cutoff already past its keep is not added. A later cutoff replaces an
    /// earlier one.
    pub fn cut_off(&self, user_id: &str, cutoff_at: i64, now: i64) {
        if cutoff_at.saturating_add(self.keep_ms) < now {
            return;
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        match inner.cutoffs.get(user_id).copied() {
            Some(known) if known >= cutoff_at => return,
            Some(known) => {
                inner.by_cutoff.remove(&(known, user_id.to_owned()));
                inner.cutoffs.remove(user_id);
            }
            None => {}
        }
        while inner.cutoffs.len() >= self.cutoff_capacity {
            let Some((at, oldest)) = inner.by_cutoff.pop_first() else {
                break;
            };
            inner.cutoffs.remove(&oldest);
            inner.floor = inner.floor.max(at);
            self.evicted.inc();
        }
        inner.cutoffs.insert(user_id.to_owned(), cutoff_at);
        inner.by_cutoff.insert((cutoff_at, user_id.to_owned()));
        self.size
            .set((inner.ended.len() + inner.cutoffs.len()) as i64);
    }

    /// Records that `session_id` ended at `ended_at` (Unix milliseconds); `now` is
    /// the current time, so an entry already past its keep is not added.
    pub fn insert(&self, session_id: &str, ended_at: i64, now: i64) {
        let Some(k) = key(session_id) else { return };
        if ended_at.saturating_add(self.keep_ms) < now {
            return;
        }
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if inner.ended.contains_key(&k) {
            return;
        }
        while inner.ended.len() >= self.capacity {
            let Some((end, oldest)) = inner.by_end.pop_first() else {
                break;
            };
            inner.ended.remove(&oldest);
            inner.floor = inner.floor.max(end);
            self.evicted.inc();
        }
        inner.ended.insert(k, ended_at);
        inner.by_end.insert((ended_at, k));
        self.size
            .set((inner.ended.len() + inner.cutoffs.len()) as i64);
    }

    /// Forgets the sessions whose access tokens have all expired by `now`.
    pub fn forget_expired(&self, now: i64) {
        let horizon = now.saturating_sub(self.keep_ms);
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        while let Some(&(end, k)) = inner.by_end.first() {
            if end >= horizon {
                break;
            }
            inner.by_end.pop_first();
            inner.ended.remove(&k);
        }
        while let Some((at, _)) = inner.by_cutoff.first() {
            if *at >= horizon {
                break;
            }
            if let Some((_, user)) = inner.by_cutoff.pop_first() {
                inner.cutoffs.remove(&user);
            }
        }
        if inner.floor != 0 && inner.floor < horizon {
            inner.floor = 0;
        }
        self.size
            .set((inner.ended.len() + inner.cutoffs.len()) as i64);
    }

    /// Entries held now: ended sessions and cutoffs.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner
            .read()
            .map(|i| i.ended.len() + i.cutoffs.len())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: i64 = 60_000;

    fn set(capacity: usize) -> Revocations {
        Revocations::new(
            Duration::from_secs(15 * 60),
            capacity,
            capacity,
            IntGauge::new("size", "size").unwrap(),
            IntCounter::new("evicted", "evicted").unwrap(),
        )
    }

    fn id(n: u128) -> String {
        uuid::Uuid::from_u128(n).to_string()
    }

    #[test]
    fn ended_sessions_are_revoked_until_their_tokens_expire() {
        let r = set(10);
        let now = 100 * MINUTE;
        r.insert(&id(1), now, now);
        assert!(r.is_revoked(&id(1), "u", 1));
        assert!(!r.is_revoked(&id(2), "u", 1));
        assert!(!r.is_revoked("not a uuid", "u", 1));
        // Still within the token lifetime plus the skew.
        r.forget_expired(now + 15 * MINUTE);
        assert!(r.is_revoked(&id(1), "u", 1));
        r.forget_expired(now + 17 * MINUTE);
        assert!(!r.is_revoked(&id(1), "u", 1));
        assert_eq!(r.len(), 0);
        // An end so old that no token of it is valid is not even added.
        r.insert(&id(3), now - 60 * MINUTE, now);
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn at_the_bound_the_oldest_end_becomes_the_floor() {
        let r = set(2);
        let now = 100 * MINUTE;
        r.insert(&id(1), now - 3000, now);
        r.insert(&id(2), now - 2000, now);
        r.insert(&id(3), now - 1000, now);
        assert_eq!(r.len(), 2);
        assert_eq!(r.evicted.get(), 1);
        // Session 1 was evicted: its tokens (issued before it ended) stay refused,
        // as does any token issued at or before its end.
        let before_end = u64::try_from((now - 4000) / 1000).unwrap();
        assert!(r.is_revoked(&id(1), "u", before_end));
        assert!(r.is_revoked(&id(9), "u", before_end));
        // Tokens issued after the floor are judged by their session only.
        let after = u64::try_from(now / 1000).unwrap();
        assert!(!r.is_revoked(&id(9), "u", after));
        assert!(r.is_revoked(&id(3), "u", after));
        // The floor is dropped once every token issued before it has expired.
        r.forget_expired(now + 20 * MINUTE);
        assert!(!r.is_revoked(&id(9), "u", before_end));
    }

    fn v7(ms: i64) -> String {
        let ts = uuid::Timestamp::from_unix(
            uuid::NoContext,
            u64::try_from(ms / 1000).unwrap(),
            u32::try_from(ms % 1000).unwrap() * 1_000_000,
        );
        uuid::Uuid::new_v7(ts).to_string()
    }

    #[test]
    fn a_cutoff_refuses_the_sessions_that_started_before_it() {
        let r = set(10);
        let now = 100 * MINUTE;
        let before = v7(now - 5_000);
        let after = v7(now + 1);
        let iat = u64::try_from(now / 1000).unwrap();
        r.cut_off("alice", now, now);
        assert!(r.is_revoked(&before, "alice", iat));
        assert!(r.is_revoked(&v7(now), "alice", iat), "at the cutoff");
        assert!(!r.is_revoked(&after, "alice", iat + 1));
        assert!(!r.is_revoked(&before, "bob", iat), "only the user's");
        // A session id that is no UUIDv7 is judged by the token's iat.
        assert!(r.is_revoked("legacy", "alice", iat - 1));
        assert!(!r.is_revoked("legacy", "alice", iat + 1));
        // An earlier cutoff never lowers a later one.
        r.cut_off("alice", now - MINUTE, now);
        assert!(r.is_revoked(&before, "alice", iat));
        assert_eq!(r.len(), 1);
        r.forget_expired(now + 17 * MINUTE);
        assert!(!r.is_revoked(&before, "alice", iat));
        assert_eq!(r.len(), 0);
    }

    #[test]
    fn cut_since_tells_what_a_read_may_have_missed() {
        let r = set(2);
        let now = 100 * MINUTE;
        r.cut_off("svc", now, now);
        assert!(r.cut_since(&["svc"], now - 1), "a cutoff after the read");
        assert!(r.cut_since(&["other", "svc"], now), "a cutoff at the read");
        assert!(!r.cut_since(&["svc"], now + 1), "a read after the cutoff");
        assert!(!r.cut_since(&["other"], now - 1), "only the ids asked for");
        // At the bound, the evicted cutoff is the floor: every earlier read is stale.
        r.cut_off("b", now + 1000, now);
        r.cut_off("c", now + 2000, now);
        assert!(r.cut_since(&["other"], now), "the floor");
        assert!(!r.cut_since(&["other"], now + 1));
    }

    #[test]
    fn at_the_bound_the_oldest_cutoff_becomes_the_floor() {
        let r = set(2);
        let now = 100 * MINUTE;
        r.cut_off("a", now - 3000, now);
        r.cut_off("b", now - 2000, now);
        r.cut_off("c", now - 1000, now);
        assert_eq!(r.len(), 2);
        assert_eq!(r.evicted.get(), 1);
        // "a" is held no more: its old tokens are refused by the floor.
        let old = u64::try_from((now - 4000) / 1000).unwrap();
        assert!(r.is_revoked(&v7(now - 4000), "a", old));
        assert!(!r.is_revoked(&v7(now), "a", u64::try_from(now / 1000).unwrap()));
    }
}
