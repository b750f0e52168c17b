//! Refresh tokens: opaque, base64url, stored only as a key derived from a SHA-256
//! digest.
//!
//! A token is its session's time of issue (its `created_at`, six bytes:
//! milliseconds since the Unix epoch) and 32 secret bytes: 51 characters. The
//! store keeps, for each token, the time of issue in hex followed by the hex
//! SHA-256 digest of the whole token: keys then sort by the time their session
//! began, so each Login adds its key at the end of the store's index instead of at
//! a random page of it (with SQLite, a page written to the WAL and read back for
//! every Login). Tokens issued before they carried their time (32 random bytes, 43
//! characters) keep working: their key is the digest alone, as it always was, and
//! their rotations stay in that form.
//!
//! A session's first refresh token has random secret bytes. Each one after is
//! derived from the one it replaces with the session's rotation key (HMAC-SHA256, a
//! random key per session, kept in the store): so a Refresh that is retried, or
//! sent twice at once, with the token just rotated is answered with the very token
//! its first answer carried, instead of a second, diverging one (see
//! docs/sessions.md). A token cannot be derived without both the token before it
//! and the session's key.
//!
//! A refresh token is a secret: its `Debug` is redacted, and only [`RefreshToken::expose`]
//! gives the text, for the response. A high-entropy secret needs no slow hash: the
//! digest alone cannot be turned back into the token. The time of issue is no
//! secret (the login's access token carries it as `iat`).

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest as _, Sha256};
use std::fmt;

/// Bytes of randomness in a refresh token (and in a rotation key).
pub const TOKEN_BYTES: usize = 32;
/// Bytes of a token's time of issue: milliseconds since the Unix epoch, big-endian.
const ISSUED_BYTES: usize = 6;
/// Characters of a refresh token: its time of issue and 32 random bytes in
/// unpadded base64url.
pub const TOKEN_CHARS: usize = 51;
/// Characters of a refresh token issued before tokens carried their time of issue:
/// 32 random bytes alone. The store still finds them.
pub const LEGACY_TOKEN_CHARS: usize = 43;

/// A refresh token: the session's time of issue (absent in a legacy token) and
/// its 32 secret bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct RefreshToken {
    issued: Option<[u8; ISSUED_BYTES]>,
    secret: [u8; TOKEN_BYTES],
}

impl RefreshToken {
    /// A session's first token: its time of issue (the session's `created_at`, in
    /// milliseconds since the Unix epoch; 0 for a time before it) and 32 random bytes.
    pub fn issued_at(millis: i64) -> Self {
        let mut secret = [0u8; TOKEN_BYTES];
        rand::fill(&mut secret);
        let mut issued = [0u8; ISSUED_BYTES];
        issued.copy_from_slice(&millis.max(0).to_be_bytes()[8 - ISSUED_BYTES..]);
        Self {
            issued: Some(issued),
            secret,
        }
    }

    /// Parses a token as a client sent it; `None` when it cannot be one of ours.
    /// Its length says its form; its text must be canonical base64url.
    pub fn parse(text: &str) -> Option<Self> {
        let issued_bytes = match text.len() {
            TOKEN_CHARS => ISSUED_BYTES,
            LEGACY_TOKEN_CHARS => 0,
            _ => return None,
        };
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        let (issued, secret) = bytes.split_at_checked(issued_bytes)?;
        Some(Self {
            // Empty in a legacy token, so no time of issue.
            issued: issued.try_into().ok(),
            secret: secret.try_into().ok()?,
        })
    }

    /// The token after this one, in the session whose rotation key is `key`: the
    /// same time of issue (so the store keeps a session's keys together), new
    /// secret bytes.
    pub fn next(&self, key: &RotationKey) -> Self {
        let mut mac =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&key.0).expect("HMAC accepts any key length");
        mac.update(b"authd refresh token rotation\0");
        if let Some(issued) = &self.issued {
            mac.update(issued);
        }
        mac.update(&self.secret);
        Self {
            issued: self.issued,
            secret: mac.finalize().into_bytes().into(),
        }
    }

    /// The key the store finds the token by. A legacy token's is the hex SHA-256
    /// digest of its bytes (64 characters); a current token's is its time of issue,
    /// then the digest of all its bytes, in hex (76 characters). Keys then sort by
    /// the time their session began, so a new session's key lands at the end of
    /// the store's index instead of at a random page of it.
    pub fn store_key(&self) -> String {
        match &self.issued {
            None => hex::encode(Sha256::digest(self.secret)),
            Some(issued) => {
                // The time of issue, then a SHA-256 digest (32 bytes).
                let mut key = [0u8; ISSUED_BYTES + 32];
                key[..ISSUED_BYTES].copy_from_slice(issued);
                key[ISSUED_BYTES..].copy_from_slice(&Sha256::digest(self.bytes(issued)));
                hex::encode(key)
            }
        }
    }

    /// The text of the token, for the response that hands it out.
    pub fn expose(&self) -> String {
        match &self.issued {
            None => URL_SAFE_NO_PAD.encode(self.secret),
            Some(issued) => URL_SAFE_NO_PAD.encode(self.bytes(issued)),
        }
    }

    /// A current token's bytes, as its text encodes them: its time of issue, then
    /// its secret.
    fn bytes(&self, issued: &[u8; ISSUED_BYTES]) -> [u8; ISSUED_BYTES + TOKEN_BYTES] {
        let mut bytes = [0u8; ISSUED_BYTES + TOKEN_BYTES];
        bytes[..ISSUED_BYTES].copy_from_slice(issued);
        bytes[ISSUED_BYTES..].copy_from_slice(&self.secret);
        bytes
    }
}

impl fmt::Debug for RefreshToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RefreshToken(<redacted>)")
    }
}

/// A session's rotation key: random, stored with the session (hex).
#[derive(Clone, PartialEq, Eq)]
pub struct RotationKey([u8; TOKEN_BYTES]);

impl RotationKey {
    pub fn random() -> Self {
        let mut bytes = [0u8; TOKEN_BYTES];
        rand::fill(&mut bytes);
        Self(bytes)
    }

    /// The key as stored.
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// A key read back from the store; `None` when the column is not a key.
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut bytes = [0u8; TOKEN_BYTES];
        hex::decode_to_slice(text, &mut bytes).ok()?;
        Some(Self(bytes))
    }
}

impl fmt::Debug for RotationKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("RotationKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A time of issue: 2027-01-15T08:00:00Z.
    const NOW: i64 = 1_800_000_000_000;

    /// A token of the form issued before tokens carried their time of issue.
    fn legacy() -> RefreshToken {
        let mut secret = [0u8; TOKEN_BYTES];
        rand::fill(&mut secret);
        RefreshToken::parse(&URL_SAFE_NO_PAD.encode(secret)).unwrap()
    }

    #[test]
    fn tokens_round_trip_and_are_51_characters() {
        let t = RefreshToken::issued_at(NOW);
        let text = t.expose();
        assert_eq!(text.len(), TOKEN_CHARS);
        assert_eq!(RefreshToken::parse(&text), Some(t.clone()));
        assert_eq!(t.store_key().len(), 76);
        assert_ne!(RefreshToken::issued_at(NOW), t);
    }

    #[test]
    fn keys_sort_by_the_time_of_issue_and_keep_it_through_rotations() {
        let key = RotationKey::random();
        let (early, late) = (
            RefreshToken::issued_at(NOW),
            RefreshToken::issued_at(NOW + 1),
        );
        // The later token's key sorts after, whatever the secret bytes.
        for _ in 0..32 {
            let early = RefreshToken::issued_at(NOW);
            assert!(early.store_key() < late.store_key());
        }
        // 1,800,000,000,000 ms is 0x01a3185c5000.
        assert!(early.store_key().starts_with("01a3185c5000"));
        // A time before the epoch is 0.
        assert!(
            RefreshToken::issued_at(-5)
                .store_key()
                .starts_with("000000000000")
        );
        let rotated = early.next(&key);
        assert_eq!(rotated.expose().len(), TOKEN_CHARS);
        assert_eq!(rotated.store_key()[..12], early.store_key()[..12]);
        assert_ne!(rotated.store_key(), early.store_key());
        // The digest covers the time of issue: the same secret at another time is
        // another key.
        let moved = RefreshToken {
            issued: late.issued,
            secret: early.secret,
        };
        assert_ne!(moved.store_key()[12..], early.store_key()[12..]);
    }

    #[test]
    fn legacy_tokens_keep_their_digest_and_their_rotations() {
        let key = RotationKey::random();
        let old = legacy();
        assert_eq!(old.expose().len(), LEGACY_TOKEN_CHARS);
        assert_eq!(old.store_key(), hex::encode(Sha256::digest(old.secret)));
        // Rotated as before this format existed: HMAC of the label and the 32 bytes.
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&key.0).unwrap();
        mac.update(b"authd refresh token rotation\0");
        mac.update(&old.secret);
        let expected: [u8; TOKEN_BYTES] = mac.finalize().into_bytes().into();
        let next = old.next(&key);
        assert_eq!(next.expose(), URL_SAFE_NO_PAD.encode(expected));
        assert_eq!(next.store_key().len(), 64);
    }

    #[test]
    fn malformed_tokens_are_refused() {
        let bad_lengths = [0, 3, 42, 44, 50, 52, 64];
        for len in bad_lengths {
            assert!(RefreshToken::parse(&"A".repeat(len)).is_none(), "{len}");
        }
        for bad in [
            "!".repeat(43),
            "!".repeat(51),
            format!("{}=", "A".repeat(50)),
        ] {
            assert!(RefreshToken::parse(&bad).is_none(), "{bad:?}");
        }
        // Characters past the last full byte must be zero bits (canonical base64).
        assert!(RefreshToken::parse(&format!("{}B", "A".repeat(50))).is_none());
    }

    #[test]
    fn the_next_token_depends_on_the_key_and_the_token() {
        let (k1, k2) = (RotationKey::random(), RotationKey::random());
        let t = RefreshToken::issued_at(NOW);
        assert_eq!(t.next(&k1), t.next(&k1));
        assert_ne!(t.next(&k1), t.next(&k2));
        assert_ne!(t.next(&k1), t);
        assert_ne!(t.next(&k1).next(&k1), t.next(&k1));
        let hex = k1.to_hex();
        assert_eq!(RotationKey::from_hex(&hex), Some(k1));
        assert!(RotationKey::from_hex("zz").is_none());
        // Two hex digits per byte, nothing else: not a sign, not a short or long text.
        assert!(RotationKey::from_hex(&format!("+{}", &hex[1..])).is_none());
        assert!(RotationKey::from_hex(&hex[2..]).is_none());
        assert!(RotationKey::from_hex(&format!("{hex}00")).is_none());
    }

    #[test]
    fn debug_never_shows_the_secret() {
        for t in [RefreshToken::issued_at(NOW), legacy()] {
            assert!(!format!("{t:?}").contains(&t.expose()));
        }
        let k = RotationKey::random();
        assert!(!format!("{k:?}").contains(&k.to_hex()));
    }
}
