//! The in-process limiter: the same sliding-window log as the Redis script, kept in
//! this replica's memory. It decides when no Redis is configured, and while Redis
//! fails in fail-open mode.
//!
//! It owns the logs (the instants of the requests it allowed, per key) and their
//! cleanup. It must not block: one `std` mutex is held for a few map and deque
//! operations per decision, never across an `.await`. It knows nothing of other
//! replicas: a `global` rule here is global to this replica only.
//!
//! Why a log of our own rather than `governor`: governor is GCRA, a token bucket
//! that refills continuously (`50/2s` lets a request through every 40 ms once the
//! burst is spent), while the Redis tier is a sliding-window log (at most 50 in
//! *any* 2 s). Using the same algorithm means a rule means the same thing whichever
//! tier enforces it, and the fallback can be tested with the same expectations.
//! The price is memory: a key's log holds up to `limit` instants.
//!
//! Keys come from what clients send (addresses, header values), so their number is
//! capped (`AUTHD_RATE_LIMIT_MAX_KEYS`). Beyond the cap, a request whose key is not
//! tracked yet is counted in its rule's *overflow* log, shared by every such key:
//! clients already tracked keep their own counts, and a flood of new keys competes
//! only with itself, within the rule's limit. Memory is therefore at most the cap
//! (plus one overflow log per rule) times a log's size: the key and 16 bytes per
//! request still in its window, at most `limit` of them.

use super::{Check, Outcome, RuleState};
use prometheus::{IntCounter, IntGauge};
use std::{
    borrow::Cow,
    collections::{HashMap, VecDeque},
    sync::Mutex,
    time::{Duration, Instant},
};

/// Below this many keys, idle logs are not worth sweeping.
const MIN_SWEEP: usize = 1024;

/// At the cap, idle logs are swept to make room at most this often, so that a
/// flood of new keys cannot make every decision walk the whole map.
const FULL_SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// One key's log.
struct Log {
    window: Duration,
    /// Instants of the allowed requests still in the window, oldest first; at most
    /// `limit` long since nothing is added for a refused request.
    times: VecDeque<Instant>,
}

impl Log {
    fn trim(&mut self, now: Instant) {
        while self
            .times
            .front()
            .is_some_and(|t| now.saturating_duration_since(*t) >= self.window)
        {
            self.times.pop_front();
        }
    }
}

struct Logs {
    by_key: HashMap<String, Log>,
    /// Sweep idle logs when there are more keys than this (amortized: the next
    /// threshold is twice what survives a sweep).
    sweep_above: usize,
    /// When the map last had to be swept because it was at the cap.
    last_full_sweep: Option<Instant>,
}

/// The limiter's own metric handles.
pub(crate) struct LocalMetrics {
    /// Keys tracked now (`authd_ratelimit_local_keys`).
    pub keys: IntGauge,
    /// Requests counted in an overflow log because the cap was reached.
    pub overflowed: IntCounter,
}

pub(crate) struct LocalLimiter {
    // A std mutex, not tokio's: it is never held across an await, and the critical
    // section is a few hash lookups, cheaper than any async lock.
    logs: Mutex<Logs>,
    max_keys: usize,
    metrics: LocalMetrics,
}

/// The key of a rule's overflow log: it cannot collide with a real key, which
/// always starts with the configured prefix, never a NUL.
fn overflow_key(rule: usize) -> String {
    format!("\0overflow:{rule}")
}

impl LocalLimiter {
    pub(crate) fn new(max_keys: usize, metrics: LocalMetrics) -> Self {
        LocalLimiter {
            logs: Mutex::new(Logs {
                by_key: HashMap::new(),
                sweep_above: MIN_SWEEP.min(max_keys),
                last_full_sweep: None,
            }),
            max_keys: max_keys.max(1),
            metrics,
        }
    }

    /// Which log each check counts in: its own, or beyond the cap its rule's overflow.
    fn logs_for<'c>(
        &self,
        logs: &mut Logs,
        checks: &'c [Check],
        now: Instant,
    ) -> Vec<Cow<'c, str>> {
        let mut new_keys = 0;
        let mut keys = Vec::with_capacity(checks.len());
        for check in checks {
            if logs.by_key.contains_key(&check.key) {
                keys.push(Cow::Borrowed(check.key.as_str()));
                continue;
            }
            if logs.by_key.len() + new_keys >= self.max_keys
                && logs
                    .last_full_sweep
                    .is_none_or(|t| now.saturating_duration_since(t) >= FULL_SWEEP_INTERVAL)
            {
                logs.last_full_sweep = Some(now);
                sweep_now(logs, now);
            }
            if logs.by_key.len() + new_keys < self.max_keys {
                new_keys += 1;
                keys.push(Cow::Borrowed(check.key.as_str()));
            } else {
                self.metrics.overflowed.inc();
                keys.push(Cow::Owned(overflow_key(check.rule)));
            }
        }
        keys
    }

    /// Decides all `checks` atomically: allowed only if every one has room, and
    /// then (only then) the request is recorded in every log.
    pub(crate) fn decide(&self, checks: &[Check], now: Instant) -> Outcome {
        // A poisoned lock means a panic mid-update of plain counters: the data is
        // still usable, and refusing all traffic would be worse.
        let mut logs = self.logs.lock().unwrap_or_else(|p| p.into_inner());
        let keys = self.logs_for(&mut logs, checks, now);
        let mut allowed = true;
        for (check, key) in checks.iter().zip(&keys) {
            let count = match logs.by_key.get_mut(key.as_ref()) {
                Some(log) => {
                    log.trim(now);
                    log.times.len()
                }
                None => 0,
            };
            allowed &= count + check.hits as usize <= check.limit as usize;
        }
        let mut states = Vec::with_capacity(checks.len());
        for (check, key) in checks.iter().zip(&keys) {
            let log = if allowed {
                // Look up before inserting: `entry` would need an owned key, an
                // allocation per request for the common case of a key that exists.
                if !logs.by_key.contains_key(key.as_ref()) {
                    let log = Log {
                        window: check.window,
                        times: VecDeque::new(),
                    };
                    logs.by_key.insert(key.clone().into_owned(), log);
                }
                let log = logs
                    .by_key
                    .get_mut(key.as_ref())
                    .expect("inserted just above");
                // At most `limit` entries: a request whose hits do not fit is refused.
                for _ in 0..check.hits {
                    log.times.push_back(now);
                }
                Some(&*log)
            } else {
                logs.by_key.get(key.as_ref())
            };
            states.push(state(log, check, now));
        }
        sweep(&mut logs, now);
        self.metrics.keys.set(logs.by_key.len() as i64);
        Outcome { allowed, states }
    }

    #[cfg(test)]
    fn has_key(&self, key: &str) -> bool {
        self.logs.lock().unwrap().by_key.contains_key(key)
    }
}

/// Remaining and reset of one log after a decision, as the Redis script computes them.
fn state(log: Option<&Log>, check: &Check, now: Instant) -> RuleState {
    let limit = check.limit as usize;
    let count = log.map_or(0, |l| l.times.len());
    // Zero while there is room; once full, a slot frees when the entry that keeps
    // the log full leaves the window: the (count - limit)th oldest.
    let reset = match log {
        Some(l) if count >= limit => l.times.get(count - limit).map_or(Duration::ZERO, |t| {
            (*t + check.window).saturating_duration_since(now)
        }),
        _ => Duration::ZERO,
    };
    RuleState {
        remaining: limit.saturating_sub(count) as u32,
        reset,
    }
}

/// Drops the logs whose every entry left the window, once the map has doubled
/// since the last sweep: amortized O(1) per decision, and memory bounded by twice
/// the keys active within a window.
fn sweep(logs: &mut Logs, now: Instant) {
    if logs.by_key.len() <= logs.sweep_above {
        return;
    }
    sweep_now(logs, now);
}

/// Drops every log whose entries all left the window.
fn sweep_now(logs: &mut Logs, now: Instant) {
    logs.by_key.retain(|_, log| {
        log.times
            .back()
            .is_some_and(|t| now.saturating_duration_since(*t) < log.window)
    });
    logs.sweep_above = (2 * logs.by_key.len()).max(MIN_SWEEP);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Any instant: the windows read no clock, only the times they are given.
    pub(super) fn origin() -> Instant {
        crate::clock::Clock::now(&crate::clock::ManualClock::new())
    }

    fn check(key: &str, limit: u32, window_ms: u64) -> Check {
        Check {
            rule: 0,
            key: key.into(),
            limit,
            window: Duration::from_millis(window_ms),
            hits: 1,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn limiter(max_keys: usize) -> LocalLimiter {
        LocalLimiter::new(
            max_keys,
            LocalMetrics {
                keys: IntGauge::new("k", "k").unwrap(),
                overflowed: IntCounter::new("o", "o").unwrap(),
            },
        )
    }

    #[test]
    fn allows_the_limit_in_any_window_then_slides() {
        let l = limiter(1_000_000);
        let t0 = origin();
        let c = [check("k", 3, 1000)];
        for (i, at) in [0, 100, 200].into_iter().enumerate() {
            let o = l.decide(&c, t0 + ms(at));
            assert!(o.allowed);
            assert_eq!(o.states[0].remaining, 2 - i as u32);
            // Room left: no wait. Full: the oldest entry (t0) frees the next slot.
            let reset = if i < 2 { ms(0) } else { ms(800) };
            assert_eq!(o.states[0].reset, reset);
        }
        let refused = l.decide(&c, t0 + ms(900));
        assert!(!refused.allowed);
        assert_eq!(
            refused.states[0],
            RuleState {
                remaining: 0,
                reset: ms(100)
            }
        );
        // Not a fixed window: at 1050 only the first entry has left.
        assert!(l.decide(&c, t0 + ms(1050)).allowed);
        assert!(!l.decide(&c, t0 + ms(1060)).allowed);
        assert!(l.decide(&c, t0 + ms(1100)).allowed);
    }

    #[test]
    fn all_rules_must_allow_and_a_refusal_records_nothing() {
        let l = limiter(1_000_000);
        let t0 = origin();
        let tight = check("tight", 1, 1000);
        let loose = check("loose", 10, 1000);
        assert!(l.decide(&[tight.clone(), loose.clone()], t0).allowed);
        let o = l.decide(&[tight.clone(), loose.clone()], t0 + ms(1));
        assert!(!o.allowed);
        assert_eq!(o.states[0].remaining, 0);
        // The loose rule's log still has one entry only: the refusal added nothing.
        assert_eq!(o.states[1].remaining, 9);
        assert_eq!(l.decide(&[loose], t0 + ms(2)).states[0].remaining, 8);
    }

    #[test]
    fn hits_count_as_that_many_requests_or_not_at_all() {
        let l = limiter(1_000_000);
        let t0 = origin();
        let mut five = check("k", 5, 1000);
        five.hits = 3;
        let o = l.decide(std::slice::from_ref(&five), t0);
        assert!(o.allowed);
        assert_eq!(o.states[0].remaining, 2);
        // 3 more do not fit in the 2 left: refused, and nothing added.
        let o = l.decide(std::slice::from_ref(&five), t0 + ms(1));
        assert!(!o.allowed);
        assert_eq!(o.states[0].remaining, 2);
        five.hits = 2;
        let o = l.decide(std::slice::from_ref(&five), t0 + ms(2));
        assert!(o.allowed);
        assert_eq!(
            o.states[0],
            RuleState {
                remaining: 0,
                reset: ms(998)
            }
        );
        // More hits than the limit never pass.
        five.hits = 6;
        assert!(!l.decide(&[five], t0 + ms(5000)).allowed);
    }

    #[test]
    fn keys_are_independent() {
        let l = limiter(1_000_000);
        let t0 = origin();
        assert!(l.decide(&[check("a", 1, 1000)], t0).allowed);
        assert!(!l.decide(&[check("a", 1, 1000)], t0).allowed);
        assert!(l.decide(&[check("b", 1, 1000)], t0).allowed);
    }

    #[test]
    fn idle_logs_are_swept() {
        let l = limiter(1_000_000);
        let t0 = origin();
        for i in 0..MIN_SWEEP {
            l.decide(&[check(&format!("early{i}"), 1, 10)], t0);
        }
        assert!(l.has_key("early0"));
        // Past their window, the early logs go in the sweep that a growing map triggers.
        for i in 0..2 * MIN_SWEEP {
            l.decide(&[check(&format!("late{i}"), 1, 10)], t0 + ms(20));
        }
        assert!(!l.has_key("early0"));
        assert!(l.has_key("late0"));
    }
}

#[cfg(test)]
mod cap_tests {
    use super::*;

    fn check(rule: usize, key: &str, limit: u32) -> Check {
        Check {
            rule,
            key: key.into(),
            limit,
            window: Duration::from_millis(1000),
            hits: 1,
        }
    }

    #[test]
    fn beyond_the_cap_new_keys_share_their_rules_overflow_log() {
        let metrics = LocalMetrics {
            keys: IntGauge::new("k", "k").unwrap(),
            overflowed: IntCounter::new("o", "o").unwrap(),
        };
        let l = LocalLimiter::new(3, metrics);
        let t0 = super::tests::origin();
        for key in ["a", "b", "c"] {
            assert!(l.decide(&[check(0, key, 2)], t0).allowed, "{key}");
        }
        assert_eq!(l.metrics.keys.get(), 3);
        // Full: "d" and "e" are counted together, in rule 0's overflow log (limit 2).
        assert!(l.decide(&[check(0, "d", 2)], t0).allowed);
        assert!(l.decide(&[check(0, "e", 2)], t0).allowed);
        assert!(!l.decide(&[check(0, "f", 2)], t0).allowed);
        assert!(!l.has_key("d") && !l.has_key("e"));
        assert_eq!(l.metrics.overflowed.get(), 3);
        // Another rule's new keys have an overflow log of their own.
        assert!(l.decide(&[check(1, "g", 2)], t0).allowed);
        // Keys tracked before keep their own counts.
        assert!(l.decide(&[check(0, "a", 2)], t0).allowed);
        assert!(!l.decide(&[check(0, "a", 2)], t0).allowed);
        // However many keys a client invents, the map stays at the cap plus one
        // overflow log per rule.
        for i in 0..10_000 {
            l.decide(&[check(0, &format!("x{i}"), 2)], t0 + ms(1));
        }
        assert!(l.logs.lock().unwrap().by_key.len() <= 3 + 2);
        // Once the tracked logs' window has passed, new keys get logs of their own again.
        let later = t0 + ms(2000);
        assert!(l.decide(&[check(0, "h", 2)], later).allowed);
        assert!(l.has_key("h"));
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
}
