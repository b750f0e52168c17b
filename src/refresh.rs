//! Refresh tokens: opaque, 256-bit, base64url (43 characters), stored only as a
//! SHA-256 digest.
//!
//! A session's first refresh token is random. Each one after is derived from the
//! one it replaces with the session's rotation key (HMAC-SHA256, a random key per
//! session, kept in the store): so a Refresh that is retried, or sent twice at
//! once, with the token just rotated is answered with the very token its first
//! answer carried, instead of a second, diverging one (see docs/sessions.md). A
//! token cannot be derived without both the token before it and the session's key.
//!
//! A refresh token is a secret: its `Debug` is redacted, and only [`RefreshToken::expose`]
//! gives the text, for the response. A high-entropy secret needs no slow hash: the
//! digest alone cannot be turned back into the token.

use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use hmac::{Hmac, KeyInit, Mac};
use sha2::{Digest as _, Sha256};
use std::fmt;

/// Bytes of randomness in a refresh token (and in a rotation key).
pub const TOKEN_BYTES: usize = 32;
/// Characters of a refresh token: 32 bytes in unpadded base64url.
pub const TOKEN_CHARS: usize = 43;

/// A refresh token (its 32 bytes).
#[derive(Clone, PartialEq, Eq)]
pub struct RefreshToken([u8; TOKEN_BYTES]);

impl RefreshToken {
    /// A new random token (a session's first).
    pub fn random() -> Self {
        let mut bytes = [0u8; TOKEN_BYTES];
        rand::fill(&mut bytes);
        Self(bytes)
    }

    /// Parses a token as a client sent it; `None` when it cannot be one of ours.
    pub fn parse(text: &str) -> Option<Self> {
        if text.len() != TOKEN_CHARS {
            return None;
        }
        let bytes = URL_SAFE_NO_PAD.decode(text).ok()?;
        Some(Self(bytes.try_into().ok()?))
    }

    /// The token after this one, in the session whose rotation key is `key`.
    pub fn next(&self, key: &RotationKey) -> Self {
        let mut mac =
            <Hmac<Sha256> as KeyInit>::new_from_slice(&key.0).expect("HMAC accepts any key length");
        mac.update(b"authd refresh token rotation\0");
        mac.update(&self.0);
        Self(mac.finalize().into_bytes().into())
    }

    /// The hex SHA-256 digest the store keeps.
    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(self.0))
    }

    /// The text of the token, for the response that hands it out.
    pub fn expose(&self) -> String {
        URL_SAFE_NO_PAD.encode(self.0)
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

    #[test]
    fn tokens_round_trip_and_are_43_characters() {
        let t = RefreshToken::random();
        let text = t.expose();
        assert_eq!(text.len(), TOKEN_CHARS);
        assert_eq!(RefreshToken::parse(&text), Some(t.clone()));
        assert_eq!(t.digest().len(), 64);
        assert_ne!(RefreshToken::random(), t);
    }

    #[test]
    fn malformed_tokens_are_refused() {
        for bad in ["", "abc", &"A".repeat(42), &"A".repeat(44), &"!".repeat(43)] {
            assert!(RefreshToken::parse(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn the_next_token_depends_on_the_key_and_the_token() {
        let (k1, k2) = (RotationKey::random(), RotationKey::random());
        let t = RefreshToken::random();
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
        let t = RefreshToken::random();
        assert!(!format!("{t:?}").contains(&t.expose()));
        let k = RotationKey::random();
        assert!(!format!("{k:?}").contains(&k.to_hex()));
    }
}
