//! The in-process counts: one map of the keys Redis would hold, each entry expiring
//! as its Redis key would, bounded by `max_entries` whatever usernames are tried.
//!
//! An attempt reserves its place under the one lock ([`LocalCounts::reserve`]): the
//! decision and the reservation are one step, so attempts at once are counted one
//! after the other. An entry holding places neither expires nor is evicted (the
//! places are bounded by the requests in flight), and an entry left with no place
//! and no live count is removed when its attempt settles: a count that stays is
//! made only by a failed login (after a full hash) or a successful one, so filling
//! the map costs an attacker one hash per entry. When it is full, expired entries
//! go first, then the entry worth least: a count with the fewest failures (one
//! guess at one username, what a spray leaves behind), so a count that is delaying
//! a client survives a flood of new usernames; a known client's mark is worth most.
//! A full map frees a sixteenth of its room at once: one pass over the entries,
//! under the lock, pays for that many inserts instead of one, so a flood that keeps
//! the map full costs O(1) per login, not a scan of every entry.

use super::{Count, Decision, KNOWN_CLIENT_FOR, Keys, Outcome, Settings, View, ms};
use std::{collections::HashMap, sync::Mutex};

#[derive(Debug, Clone, Copy)]
struct Entry {
    count: Count,
    expires_ms: u64,
    /// Attempts reserved under this key and not yet settled. Such an entry neither
    /// expires nor is evicted: what it holds is bounded by the requests in flight.
    pending: u32,
    /// A known-client mark, not a count.
    known: bool,
}

impl Entry {
    /// What evicting it loses: a known mark most, then by failures.
    fn worth(&self) -> u64 {
        if self.known {
            u64::MAX
        } else {
            u64::from(self.count.failures)
        }
    }

    fn live(&self, now: u64) -> bool {
        self.expires_ms > now
    }
}

pub(super) struct LocalCounts {
    entries: Mutex<HashMap<String, Entry>>,
    max_entries: usize,
}

impl LocalCounts {
    pub(super) fn new(max_entries: usize) -> Self {
        LocalCounts {
            entries: Mutex::new(HashMap::new()),
            max_entries: max_entries.max(1),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock leaves plain counters; keep using them.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    pub(super) fn view(&self, keys: &Keys, now: u64) -> View {
        view(&self.lock(), keys, now)
    }

    /// Decides an attempt and, when it may go on, reserves its place: under the
    /// one lock, so attempts at once are counted one after the other.
    pub(super) fn reserve(&self, keys: &Keys, now: u64, s: &Settings) -> Decision {
        let mut entries = self.lock();
        let decision = s.decide(&view(&entries, keys, now), now);
        if let Decision::Reserved { account } = decision {
            let max = self.max_entries;
            hold(&mut entries, &keys.pair, now, max);
            if account {
                hold(&mut entries, &keys.account, now, max);
            }
        }
        decision
    }

    /// Settles an attempt: gives back its place (`reserved_here`: the place is in
    /// this map, not in Redis) and records its outcome.
    pub(super) fn settle(
        &self,
        keys: &Keys,
        reserved_here: bool,
        account: bool,
        outcome: Outcome,
        now: u64,
        s: &Settings,
    ) {
        let mut entries = self.lock();
        if reserved_here {
            unhold(&mut entries, &keys.pair, now);
            if account {
                unhold(&mut entries, &keys.account, now);
            }
        }
        let max = self.max_entries;
        match outcome {
            Outcome::Failed => {
                bump(&mut entries, &keys.pair, now, ms(s.pair_ttl()), max);
                if account {
                    bump(&mut entries, &keys.account, now, ms(s.account_ttl()), max);
                }
            }
            Outcome::Succeeded => {
                let idle = entries.get_mut(&keys.pair).is_some_and(|pair| {
                    pair.count = Count::default();
                    pair.expires_ms = now;
                    pair.pending == 0
                });
                if idle {
                    entries.remove(&keys.pair);
                }
                let mark = Entry {
                    count: Count::default(),
                    expires_ms: now.saturating_add(ms(KNOWN_CLIENT_FOR)),
                    pending: 0,
                    known: true,
                };
                insert(&mut entries, keys.known.clone(), mark, now, max);
            }
            Outcome::Released => {}
        }
    }
}

fn view(entries: &HashMap<String, Entry>, keys: &Keys, now: u64) -> View {
    let count = |key: &str| {
        (entries.get(key))
            .filter(|e| e.live(now))
            .map(|e| e.count)
            .unwrap_or_default()
    };
    let pending = |key: &str| entries.get(key).map_or(0, |e| e.pending);
    View {
        pair: count(&keys.pair),
        pair_pending: pending(&keys.pair),
        account: count(&keys.account),
        account_pending: pending(&keys.account),
        known: entries.get(&keys.known).is_some_and(|e| e.live(now)),
    }
}

/// Takes a place under `key`, creating its entry (with no live count) if needed.
fn hold(entries: &mut HashMap<String, Entry>, key: &str, now: u64, max: usize) {
    if let Some(entry) = entries.get_mut(key) {
        entry.pending = entry.pending.saturating_add(1);
        return;
    }
    let entry = Entry {
        count: Count::default(),
        expires_ms: now,
        pending: 1,
        known: false,
    };
    insert(entries, key.to_owned(), entry, now, max);
}

/// Gives a place back; an entry left with neither a place nor a live count goes.
fn unhold(entries: &mut HashMap<String, Entry>, key: &str, now: u64) {
    if let Some(entry) = entries.get_mut(key) {
        entry.pending = entry.pending.saturating_sub(1);
        if entry.pending == 0 && !entry.live(now) {
            entries.remove(key);
        }
    }
}

/// Counts one failure under `key` (a count past its expiry starts again), keeping
/// the places held there.
fn bump(entries: &mut HashMap<String, Entry>, key: &str, now: u64, ttl: u64, max: usize) {
    let (failures, pending) = entries.get(key).map_or((0, 0), |e| {
        (if e.live(now) { e.count.failures } else { 0 }, e.pending)
    });
    let entry = Entry {
        count: Count {
            failures: failures.saturating_add(1),
            last_ms: now,
        },
        expires_ms: now.saturating_add(ttl),
        pending,
        known: false,
    };
    insert(entries, key.to_owned(), entry, now, max);
}

fn insert(entries: &mut HashMap<String, Entry>, key: String, entry: Entry, now: u64, max: usize) {
    if !entries.contains_key(&key) && entries.len() >= max {
        make_room(entries, now, max);
    }
    entries.insert(key, entry);
}

/// How many entries a full map frees at once.
fn eviction_batch(max: usize) -> usize {
    (max / 16).max(1)
}

/// Drops the expired entries and, if that is not enough, the entries worth least,
/// until [`eviction_batch`] inserts fit. Entries holding places stay.
fn make_room(entries: &mut HashMap<String, Entry>, now: u64, max: usize) {
    entries.retain(|_, e| e.live(now) || e.pending > 0);
    let excess = (entries.len() + eviction_batch(max)).saturating_sub(max);
    if excess == 0 {
        return;
    }
    let mut ranked: Vec<_> = (entries.iter())
        .filter(|(_, e)| e.pending == 0)
        .map(|(key, e)| (e.worth(), e.expires_ms, key))
        .collect();
    let victims: Vec<String> = if excess < ranked.len() {
        ranked.select_nth_unstable(excess);
        ranked[..excess]
            .iter()
            .map(|(_, _, k)| (*k).clone())
            .collect()
    } else {
        ranked.iter().map(|(_, _, k)| (*k).clone()).collect()
    };
    for victim in victims {
        entries.remove(&victim);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> Settings {
        Settings {
            max_entries: 10,
            ..super::super::test_settings()
        }
    }

    /// One failed attempt, reserved and settled (whatever the counts decide).
    fn fail(counts: &LocalCounts, keys: &Keys, now: u64, s: &Settings) {
        let account = match counts.reserve(keys, now, s) {
            Decision::Reserved { account } => account,
            _ => false,
        };
        counts.settle(keys, true, account, Outcome::Failed, now, s);
    }

    #[test]
    fn the_map_stays_bounded_and_a_flood_of_usernames_keeps_the_counts_that_delay() {
        let s = settings();
        let counts = LocalCounts::new(10);
        let target = Keys::new("login", "target", "10.0.0.9".parse().ok());
        for _ in 0..4 {
            fail(&counts, &target, 1000, &s);
        }
        for i in 0..10_000 {
            let spray = Keys::new("login", &format!("user{i}"), "10.0.0.9".parse().ok());
            fail(&counts, &spray, 1000, &s);
            assert!(counts.len() <= 10);
        }
        assert_eq!(counts.view(&target, 1000).pair.failures, 4);
    }

    #[test]
    fn a_full_map_frees_a_batch_at_once_and_keeps_what_is_worth_most() {
        let s = settings();
        let counts = LocalCounts::new(160);
        let batch = eviction_batch(160);
        assert_eq!(batch, 10);
        let target = Keys::new("login", "target", "10.0.0.9".parse().ok());
        for _ in 0..4 {
            fail(&counts, &target, 1000, &s);
        }
        let spray = |i: usize| Keys::new("login", &format!("user{i}"), "10.0.0.9".parse().ok());
        let mut i = 0;
        while counts.len() < 160 {
            fail(&counts, &spray(i), 1000, &s);
            i += 1;
        }
        // A spray's failure adds two keys (the pair's count and the account's). The
        // next one frees a batch; the batch's other inserts need no pass.
        fail(&counts, &spray(i), 1000, &s);
        assert_eq!(counts.len(), 160 - batch + 2);
        for j in 1..batch / 2 {
            fail(&counts, &spray(i + j), 1000, &s);
        }
        assert_eq!(counts.len(), 160);
        assert_eq!(counts.view(&target, 1000).pair.failures, 4);
        // The newest counts were not evicted.
        assert_eq!(
            counts.view(&spray(i + batch / 2 - 1), 1000).pair.failures,
            1
        );
    }

    #[test]
    fn entries_expire_like_redis_keys() {
        let s = settings();
        let counts = LocalCounts::new(10);
        let keys = Keys::new("login", "u", None);
        fail(&counts, &keys, 1000, &s);
        assert_eq!(counts.view(&keys, 1000).pair.failures, 1);
        let later = 1000 + ms(s.pair_ttl());
        assert_eq!(counts.view(&keys, later).pair.failures, 0);
        fail(&counts, &keys, later, &s);
        assert_eq!(counts.view(&keys, later).pair.failures, 1);
    }

    #[test]
    fn places_held_are_never_evicted_and_leave_nothing_behind_when_released() {
        let s = settings();
        let counts = LocalCounts::new(10);
        let held = Keys::new("login", "held", "10.0.0.1".parse().ok());
        assert_eq!(
            counts.reserve(&held, 1000, &s),
            Decision::Reserved { account: true }
        );
        for i in 0..1000 {
            fail(
                &counts,
                &Keys::new("login", &format!("user{i}"), None),
                1000,
                &s,
            );
        }
        let v = counts.view(&held, 1000);
        assert_eq!((v.pair_pending, v.account_pending), (1, 1));
        counts.settle(&held, true, true, Outcome::Released, 1000, &s);
        let v = counts.view(&held, 1000);
        assert_eq!(v, View::default());
        let left = counts.lock();
        assert!(!left.contains_key(&held.pair) && !left.contains_key(&held.account));
    }
}
