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
//! Reads (every ValidateToken) take a read lock and one hash lookup; writes are
//! rare (a session's end).

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
    /// Tokens issued at or before this (Unix milliseconds) are refused.
    floor: i64,
}

/// The revoked sessions of one replica.
pub struct Revocations {
    inner: RwLock<Inner>,
    capacity: usize,
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

impl Revocations {
    /// A set for access tokens that live `token_ttl`, holding at most `capacity`.
    pub fn new(token_ttl: Duration, capacity: usize, size: IntGauge, evicted: IntCounter) -> Self {
        let keep = token_ttl + CLOCK_SKEW;
        Self {
            inner: RwLock::new(Inner::default()),
            capacity: capacity.max(1),
            keep_ms: i64::try_from(keep.as_millis()).unwrap_or(i64::MAX),
            size,
            evicted,
        }
    }

    /// Whether a token of `session_id`, issued at `issued_at` (Unix seconds), is
    /// refused: its session ended, or it was issued at or before the floor.
    pub fn is_revoked(&self, session_id: &str, issued_at: u64) -> bool {
        let inner = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let issued_ms = i64::try_from(issued_at.saturating_mul(1000)).unwrap_or(i64::MAX);
        if inner.floor != 0 && issued_ms <= inner.floor {
            return true;
        }
        key(session_id).is_some_and(|k| inner.ended.contains_key(&k))
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
        self.size.set(inner.ended.len() as i64);
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
        if inner.floor != 0 && inner.floor < horizon {
            inner.floor = 0;
        }
        self.size.set(inner.ended.len() as i64);
    }

    /// Entries held now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.inner.read().map(|i| i.ended.len()).unwrap_or(0)
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
        assert!(r.is_revoked(&id(1), 1));
        assert!(!r.is_revoked(&id(2), 1));
        assert!(!r.is_revoked("not a uuid", 1));
        // Still within the token lifetime plus the skew.
        r.forget_expired(now + 15 * MINUTE);
        assert!(r.is_revoked(&id(1), 1));
        r.forget_expired(now + 17 * MINUTE);
        assert!(!r.is_revoked(&id(1), 1));
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
        assert!(r.is_revoked(&id(1), before_end));
        assert!(r.is_revoked(&id(9), before_end));
        // Tokens issued after the floor are judged by their session only.
        let after = u64::try_from(now / 1000).unwrap();
        assert!(!r.is_revoked(&id(9), after));
        assert!(r.is_revoked(&id(3), after));
        // The floor is dropped once every token issued before it has expired.
        r.forget_expired(now + 20 * MINUTE);
        assert!(!r.is_revoked(&id(9), before_end));
    }
}
