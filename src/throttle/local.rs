//! The in-process counts: one map of the keys Redis would hold, each entry expiring
//! as its Redis key would, bounded by `max_entries` whatever usernames are tried.
//!
//! An entry is created only by a failed login (after a full hash) or a successful
//! one, so filling the map costs an attacker one hash per entry. When it is full,
//! expired entries go first, then the entry worth least: a count with the fewest
//! failures (one guess at one username, what a spray leaves behind), so a count that
//! is delaying a client survives a flood of new usernames; a known client's mark is
//! worth most. A full map frees a sixteenth of its room at once: one pass over the
//! entries, under the lock, pays for that many inserts instead of one, so a flood
//! that keeps the map full costs O(1) per login, not a scan of every entry.

use super::{Count, KNOWN_CLIENT_FOR, Keys, Settings, Snapshot, counts_for_account, ms};
use std::{collections::HashMap, sync::Mutex};

#[derive(Debug, Clone, Copy)]
struct Entry {
    count: Count,
    expires_ms: u64,
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

    pub(super) fn read(&self, keys: &Keys, now: u64) -> Snapshot {
        let entries = self.lock();
        let live = |key: &str| entries.get(key).filter(|e| e.expires_ms > now).copied();
        Snapshot {
            pair: live(&keys.pair).map(|e| e.count).unwrap_or_default(),
            account: live(&keys.account).map(|e| e.count).unwrap_or_default(),
            known: live(&keys.known).is_some(),
        }
    }

    pub(super) fn record_failure(&self, keys: &Keys, now: u64, threshold: u32, s: &Settings) {
        let mut entries = self.lock();
        let pair = bump(
            &mut entries,
            &keys.pair,
            now,
            ms(s.pair_ttl()),
            self.max_entries,
        );
        if counts_for_account(pair, threshold) {
            bump(
                &mut entries,
                &keys.account,
                now,
                ms(s.account_ttl()),
                self.max_entries,
            );
        }
    }

    pub(super) fn record_success(&self, keys: &Keys, now: u64) {
        let mut entries = self.lock();
        entries.remove(&keys.pair);
        let mark = Entry {
            count: Count::default(),
            expires_ms: now.saturating_add(ms(KNOWN_CLIENT_FOR)),
            known: true,
        };
        insert(
            &mut entries,
            keys.known.clone(),
            mark,
            now,
            self.max_entries,
        );
    }
}

/// Counts one failure under `key` (a count past its expiry starts again) and
/// returns the new count.
fn bump(entries: &mut HashMap<String, Entry>, key: &str, now: u64, ttl: u64, max: usize) -> u32 {
    let failures = entries
        .get(key)
        .filter(|e| e.expires_ms > now)
        .map_or(0, |e| e.count.failures)
        .saturating_add(1);
    let entry = Entry {
        count: Count {
            failures,
            last_ms: now,
        },
        expires_ms: now.saturating_add(ttl),
        known: false,
    };
    insert(entries, key.to_owned(), entry, now, max);
    failures
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
/// until [`eviction_batch`] inserts fit.
fn make_room(entries: &mut HashMap<String, Entry>, now: u64, max: usize) {
    entries.retain(|_, e| e.expires_ms > now);
    let excess = (entries.len() + eviction_batch(max)).saturating_sub(max);
    if excess == 0 {
        return;
    }
    let mut ranked: Vec<_> = (entries.iter())
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
    use std::time::Duration;

    fn settings() -> Settings {
        Settings {
            failures: 3,
            delay: Duration::from_secs(1),
            delay_max: Duration::from_secs(60),
            account_failures: 7,
            account_delay_max: Duration::from_secs(10),
            max_entries: 10,
            redis: None,
            prefix: String::new(),
            redis_timeout: Duration::from_millis(100),
            failure: crate::ratelimit::FailureMode::Open,
        }
    }

    #[test]
    fn the_map_stays_bounded_and_a_flood_of_usernames_keeps_the_counts_that_delay() {
        let s = settings();
        let counts = LocalCounts::new(10);
        let target = Keys::new("target", "10.0.0.9".parse().ok());
        for _ in 0..4 {
            counts.record_failure(&target, 1000, 3, &s);
        }
        for i in 0..10_000 {
            let spray = Keys::new(&format!("user{i}"), "10.0.0.9".parse().ok());
            counts.record_failure(&spray, 1000, 3, &s);
            assert!(counts.len() <= 10);
        }
        assert_eq!(counts.read(&target, 1000).pair.failures, 4);
    }

    #[test]
    fn a_full_map_frees_a_batch_at_once_and_keeps_what_is_worth_most() {
        let s = settings();
        let counts = LocalCounts::new(160);
        let batch = eviction_batch(160);
        assert_eq!(batch, 10);
        let target = Keys::new("target", "10.0.0.9".parse().ok());
        for _ in 0..4 {
            counts.record_failure(&target, 1000, 3, &s);
        }
        let spray = |i: usize| Keys::new(&format!("user{i}"), "10.0.0.9".parse().ok());
        let mut i = 0;
        while counts.len() < 160 {
            counts.record_failure(&spray(i), 1000, 3, &s);
            i += 1;
        }
        // A spray's failure adds two keys (the pair's count and the account's). The
        // next one frees a batch; the batch's other inserts need no pass.
        counts.record_failure(&spray(i), 1000, 3, &s);
        assert_eq!(counts.len(), 160 - batch + 2);
        for j in 1..batch / 2 {
            counts.record_failure(&spray(i + j), 1000, 3, &s);
        }
        assert_eq!(counts.len(), 160);
        assert_eq!(counts.read(&target, 1000).pair.failures, 4);
        // The newest counts were not evicted.
        assert_eq!(
            counts.read(&spray(i + batch / 2 - 1), 1000).pair.failures,
            1
        );
    }

    #[test]
    fn entries_expire_like_redis_keys() {
        let s = settings();
        let counts = LocalCounts::new(10);
        let keys = Keys::new("u", None);
        counts.record_failure(&keys, 1000, 3, &s);
        assert_eq!(counts.read(&keys, 1000).pair.failures, 1);
        let later = 1000 + ms(s.pair_ttl());
        assert_eq!(counts.read(&keys, later).pair.failures, 0);
        counts.record_failure(&keys, later, 3, &s);
        assert_eq!(counts.read(&keys, later).pair.failures, 1);
    }
}
