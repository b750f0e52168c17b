//! [`UsernameDigest`]: what names an account in the throttle's keys and in audit
//! events instead of its username. It must never hand out the username itself.

use crate::credentials::Username;
use hmac::{KeyInit, Mac};

/// A keyed digest of a username: what keys and audit events carry instead of it
/// (people type their password into the username field).
#[derive(Clone)]
pub struct UsernameDigest {
    key: [u8; 32],
}

impl UsernameDigest {
    /// What the digest key is derived for (from the signing key, or from
    /// `--account-digest-key`).
    pub const LABEL: &str = "authd username digest v1";

    pub fn new(key: [u8; 32]) -> Self {
        Self { key }
    }

    /// The digest under a key of its own (`--account-digest-key`), the same on every
    /// replica given it, whatever their token keys.
    pub fn from_key(key: &crate::secret::DigestKey) -> Self {
        let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(key.expose())
            .expect("HMAC takes any key length");
        mac.update(Self::LABEL.as_bytes());
        Self::new(mac.finalize().into_bytes().into())
    }

    /// 128 bits of HMAC-SHA256, as hex.
    pub fn of(&self, username: &Username) -> String {
        self.of_text(username.as_str())
    }

    /// The same digest of any text (a user id: the second factor's counts).
    pub fn of_text(&self, text: &str) -> String {
        let mut mac = <hmac::Hmac<sha2::Sha256> as KeyInit>::new_from_slice(&self.key)
            .expect("HMAC takes any key length");
        mac.update(text.as_bytes());
        let out = mac.finalize().into_bytes();
        hex::encode(&out[..16])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str) -> Username {
        Username::parse(name).unwrap()
    }

    #[test]
    fn digests_are_keyed_and_hide_the_username() {
        let a = UsernameDigest::new([1; 32]).of(&user("hunter2isme"));
        let b = UsernameDigest::new([2; 32]).of(&user("hunter2isme"));
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        assert!(!a.contains("hunter"));
    }
}
