//! [`Keys`]: the keys one attempt is counted under, built in this one place for
//! both backends. A key names a username only by its digest, never the username.
//! Logins are counted under `login:`, wrong second-factor codes under `otp:` (by
//! the digest of the user id): the same rule, counts of their own.

use super::WAKER_SHARDS;
use std::net::IpAddr;

/// The keys of one attempt (the same strings in both backends, under the prefix in
/// Redis). Every key of a username shares the hash tag `{digest}`, so one script
/// call touches one Redis Cluster slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    pub pair: String,
    pub account: String,
    pub known: String,
    /// The reservations in flight of `pair` and `account` (Redis only).
    pub pair_pending: String,
    pub account_pending: String,
    /// Which waiters a settlement wakes.
    pub(super) shard: usize,
}

impl Keys {
    /// Every key, in the order the Redis scripts take them.
    pub(crate) fn all(&self) -> [&str; 5] {
        [
            &self.pair,
            &self.account,
            &self.known,
            &self.pair_pending,
            &self.account_pending,
        ]
    }

    pub(super) fn new(kind: &str, digest: &str, client: Option<IpAddr>) -> Self {
        let client = client.map_or_else(|| "unknown".to_owned(), |ip| ip.to_string());
        let shard = digest.bytes().fold(0usize, |h, b| {
            h.wrapping_mul(31).wrapping_add(usize::from(b))
        }) % WAKER_SHARDS;
        Keys {
            pair: format!("{kind}:{{{digest}}}:c:{client}"),
            account: format!("{kind}:{{{digest}}}:a"),
            known: format!("{kind}:{{{digest}}}:k:{client}"),
            pair_pending: format!("{kind}:{{{digest}}}:cp:{client}"),
            account_pending: format!("{kind}:{{{digest}}}:ap"),
            shard,
        }
    }
}
