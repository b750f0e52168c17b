//! The service accounts one replica has read lately, so that a grant does not read
//! the database each time (docs/service-accounts.md#sizing).
//!
//! An entry is the account as it was read at one moment, with its credentials. A
//! grant uses it only while it is younger than [`MAX_AGE_MS`] and no cutoff of the
//! account or of the credential it proves (a disable, a delete, a credential
//! removed, on this replica at once, on the others within
//! `AUTHD_REVOCATION_DELAY`) is at or after that moment: the caller asks the
//! revocation set. A proof that matches no credential of the entry is checked
//! against the database again, so a credential added on another replica works at
//! once. A token issued from an entry carries the moment of its read as `iat`, so
//! a change committed after it refuses the token as it would without the cache.
//!
//! Only accounts in use are kept (never an unknown name nor a disabled account), at
//! most [`CAPACITY`]: a flood of made-up client ids grows nothing.

use crate::store::ServiceAccount;
use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

/// The oldest entry a grant uses, in milliseconds.
pub const MAX_AGE_MS: u64 = 10_000;
/// The most accounts held.
pub const CAPACITY: usize = 4096;

/// How a grant finds its account: by name (a client secret), or by the identity a
/// credential binds (a certificate's with no issuer, an external token's subject
/// with its issuer).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Lookup {
    Name(String),
    Identity {
        issuer: Option<String>,
        subject: String,
    },
}

struct Entry {
    account: Arc<ServiceAccount>,
    /// When it was read (Unix milliseconds, the accounts' clock).
    read_at: u64,
}

/// Accounts by how grants find them.
#[derive(Default)]
pub struct ServiceCache {
    entries: Mutex<HashMap<Lookup, Entry>>,
}

impl ServiceCache {
    /// The account `lookup` found when read at the time returned with it, if that was
    /// less than [`MAX_AGE_MS`] before `now`.
    pub fn get(&self, lookup: &Lookup, now: u64) -> Option<(Arc<ServiceAccount>, u64)> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry = entries.get(lookup)?;
        (now.saturating_sub(entry.read_at) < MAX_AGE_MS)
            .then(|| (entry.account.clone(), entry.read_at))
    }

    /// Keeps `account`, read at `read_at`, for `lookup`, unless a later read is
    /// held. At the bound, entries past their age are dropped first; when none is,
    /// the new one is not kept.
    pub fn put(&self, lookup: Lookup, account: Arc<ServiceAccount>, read_at: u64, now: u64) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = entries.get(&lookup)
            && held.read_at > read_at
        {
            return;
        }
        if entries.len() >= CAPACITY && !entries.contains_key(&lookup) {
            entries.retain(|_, e| now.saturating_sub(e.read_at) < MAX_AGE_MS);
            if entries.len() >= CAPACITY {
                return;
            }
        }
        entries.insert(lookup, Entry { account, read_at });
    }

    /// Forgets what `lookup` found (its account is disabled or gone).
    pub fn forget(&self, lookup: &Lookup) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(lookup);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.lock().map(|e| e.len()).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn account(id: &str) -> Arc<ServiceAccount> {
        Arc::new(ServiceAccount {
            id: id.into(),
            name: "orders".into(),
            audiences: Vec::new(),
            scopes: Vec::new(),
            disabled: None,
            created_at: 0,
            updated_at: 0,
            credentials: Vec::new(),
        })
    }

    fn name(n: usize) -> Lookup {
        Lookup::Name(format!("svc{n}"))
    }

    #[test]
    fn an_entry_lives_its_age_and_a_later_read_wins() {
        let cache = ServiceCache::default();
        let now = 1_000_000;
        cache.put(name(0), account("a"), now, now);
        let (found, read_at) = cache.get(&name(0), now + MAX_AGE_MS - 1).unwrap();
        assert_eq!((found.id.as_str(), read_at), ("a", now));
        assert!(cache.get(&name(0), now + MAX_AGE_MS).is_none(), "too old");
        assert!(cache.get(&name(1), now).is_none());
        // An earlier read never replaces a later one.
        cache.put(name(0), account("b"), now + 5, now + 5);
        cache.put(name(0), account("c"), now + 1, now + 5);
        assert_eq!(cache.get(&name(0), now + 5).unwrap().0.id, "b");
        cache.forget(&name(0));
        assert!(cache.get(&name(0), now + 5).is_none());
    }

    #[test]
    fn at_the_bound_only_old_entries_make_room() {
        let cache = ServiceCache::default();
        let now = 1_000_000;
        for n in 0..CAPACITY {
            cache.put(name(n), account("a"), now - MAX_AGE_MS + 1, now);
        }
        cache.put(name(CAPACITY), account("a"), now, now);
        assert!(
            cache.get(&name(CAPACITY), now).is_none(),
            "full of live entries"
        );
        assert_eq!(cache.len(), CAPACITY);
        // Once they are past their age, a new entry takes the place of all of them.
        let later = now + 1;
        cache.put(name(CAPACITY), account("a"), later, later);
        assert!(cache.get(&name(CAPACITY), later).is_some());
        assert_eq!(cache.len(), 1);
    }
}
