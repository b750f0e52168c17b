//! The rule of the counts: what one attempt's [`View`] of them decides, the same
//! in both backends (applied here for the in-process counts, and as the reserve
//! script in Redis, which is tested against it), and the delays and lifetimes it
//! implies. It only computes: it must not store, lock or call anything.

use super::{Scope, Settings, ms};
use std::time::Duration;

/// The state of one count, as both backends store it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Count {
    pub failures: u32,
    /// When the last failure was counted, in ms since the epoch.
    pub last_ms: u64,
}

/// What a backend holds for one attempt, read under its lock (or inside its script).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct View {
    pub pair: Count,
    /// Attempts of this client for this username reserved and not yet settled.
    pub pair_pending: u32,
    pub account: Count,
    /// Attempts for this username (that count for the account) not yet settled.
    pub account_pending: u32,
    /// The client logged in for this username within
    /// [`KNOWN_CLIENT_FOR`](super::KNOWN_CLIENT_FOR).
    pub known: bool,
}

/// What the throttle decides for an attempt, from a [`View`]: the same rule in
/// both backends ([`Settings::decide`] here, the reserve script in Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// The attempt holds a place in the counts (and in the account's when
    /// `account`) until it settles.
    Reserved { account: bool },
    /// Refused by the settled failures, for this long.
    Refused(Scope, Duration),
    /// Attempts in flight already fill what the count allows: their outcomes
    /// decide. The attempt waits for them to settle and asks again.
    Wait(Scope),
}

impl Settings {
    /// The rule of the counts. Settled failures refuse as they always did; an
    /// attempt in flight counts as a failure until it settles, so that N attempts
    /// at once count as N: where the settled failures and those in flight reach a
    /// threshold, the attempt waits for the ones in flight instead of hashing.
    pub(crate) fn decide(&self, v: &View, now: u64) -> Decision {
        let wait = |count: &Count, threshold: u32, max: Duration| {
            let delay = self.delay_after(count.failures, threshold, max)?;
            let until = count.last_ms.saturating_add(ms(delay));
            (until > now).then(|| Duration::from_millis(until - now))
        };
        let full = |count: &Count, pending: u32, threshold: u32| {
            pending > 0 && count.failures.saturating_add(pending) >= threshold
        };
        if let Some(w) = wait(&v.pair, self.failures, self.delay_max) {
            return Decision::Refused(Scope::Client, w);
        }
        if full(&v.pair, v.pair_pending, self.failures) {
            return Decision::Wait(Scope::Client);
        }
        // A client's first `failures` consecutive failures count for the account
        // (so one address alone never trips it); once many addresses have tripped
        // it, every failure does, so its delay keeps doubling.
        let account = v.pair.failures.saturating_add(v.pair_pending) < self.failures
            || v.account.failures.saturating_add(v.account_pending) >= self.account_failures;
        if !v.known {
            if let Some(w) = wait(&v.account, self.account_failures, self.account_delay_max) {
                return Decision::Refused(Scope::Account, w);
            }
            if account && full(&v.account, v.account_pending, self.account_failures) {
                return Decision::Wait(Scope::Account);
            }
        }
        Decision::Reserved { account }
    }
}

impl Settings {
    /// The delay owed after `count` failures against `threshold`: none below it, then
    /// `delay`, doubling per failure, at most `max`.
    fn delay_after(&self, count: u32, threshold: u32, max: Duration) -> Option<Duration> {
        let beyond = count.checked_sub(threshold)?;
        let factor = 1u32.checked_shl(beyond.min(31)).unwrap_or(u32::MAX);
        Some(self.delay.saturating_mul(factor).min(max))
    }

    /// How long a count is kept after its last failure: past any delay it can
    /// impose, plus `delay_max` of memory; never shorter than the account count's
    /// (`account_delay_max` is at most `delay_max`), so a lone client cannot feed
    /// the account count again after its own count expired.
    pub(super) fn pair_ttl(&self) -> Duration {
        self.delay_max.saturating_mul(2)
    }

    pub(super) fn account_ttl(&self) -> Duration {
        self.account_delay_max.saturating_add(self.delay_max)
    }
}

/// The settings the throttle's unit tests start from: small thresholds, no Redis.
#[cfg(test)]
pub(crate) fn test_settings() -> Settings {
    Settings {
        failures: 3,
        delay: Duration::from_secs(1),
        delay_max: Duration::from_secs(60),
        account_failures: 7,
        account_delay_max: Duration::from_secs(10),
        max_entries: 1000,
        redis: None,
        prefix: "t:".into(),
        redis_timeout: Duration::from_millis(100),
        failure: crate::redis::FailureMode::Open,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        test_settings()
    }

    #[test]
    fn delays_saturate() {
        let s = settings();
        assert_eq!(s.delay_after(2, 3, s.delay_max), None);
        assert_eq!(
            s.delay_after(3, 3, s.delay_max),
            Some(Duration::from_secs(1))
        );
        assert_eq!(s.delay_after(u32::MAX, 3, s.delay_max), Some(s.delay_max));
    }

    #[test]
    fn attempts_in_flight_count_until_they_settle() {
        let s = settings();
        let now = 1_000_000;
        let failed = |failures| Count {
            failures,
            last_ms: now - 10,
        };
        let decide = |v: View| s.decide(&v, now);
        // Below the client's threshold with those in flight: a place, also in the
        // account's count.
        let v = View {
            pair_pending: 2,
            ..View::default()
        };
        assert_eq!(decide(v), Decision::Reserved { account: true });
        // Those in flight fill it: wait for their outcome.
        let v = View {
            pair: failed(1),
            pair_pending: 2,
            ..View::default()
        };
        assert_eq!(decide(v), Decision::Wait(Scope::Client));
        // Settled failures refuse as before, whatever is in flight.
        let v = View {
            pair: failed(3),
            pair_pending: 5,
            ..View::default()
        };
        assert!(matches!(decide(v), Decision::Refused(Scope::Client, _)));
        // Past its delay, one attempt at a time, not counted for the account.
        let v = View {
            pair: Count {
                failures: 3,
                last_ms: now - 5_000,
            },
            ..View::default()
        };
        assert_eq!(decide(v), Decision::Reserved { account: false });
        assert_eq!(
            decide(View {
                pair_pending: 1,
                ..v
            }),
            Decision::Wait(Scope::Client)
        );
        // Once many addresses have tripped the account, a client past its own
        // threshold counts for it too, and only one attempt is in flight at a time.
        let tripped = View {
            pair: Count {
                failures: 3,
                last_ms: now - 5_000,
            },
            account: Count {
                failures: 7,
                last_ms: now - 5_000,
            },
            ..View::default()
        };
        assert_eq!(decide(tripped), Decision::Reserved { account: true });
        assert_eq!(
            decide(View {
                account_pending: 1,
                ..tripped
            }),
            Decision::Wait(Scope::Account)
        );
        // The account's count alike, but never for a known client.
        let v = View {
            account: failed(4),
            account_pending: 3,
            ..View::default()
        };
        assert_eq!(decide(v), Decision::Wait(Scope::Account));
        assert_eq!(
            decide(View { known: true, ..v }),
            Decision::Reserved { account: true }
        );
    }
}
