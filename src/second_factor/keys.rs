//! [`DataKeys`]: the keys that seal TOTP secrets at rest (`AUTHD_DATA_KEYS`,
//! `kid:base64key,…`: the first seals, every one opens, so keys rotate as the token
//! keys do).
//!
//! A secret is sealed with XChaCha20-Poly1305 (a random 192-bit nonce for each) and
//! stored as `KID:BASE64(nonce || ciphertext)`; the associated data binds the user
//! id, so a sealed secret copied to another user's row does not open. Keys are never
//! printed (`Debug` shows the kids only) and errors never quote them.

use base64::{Engine as _, engine::general_purpose::STANDARD};
use chacha20poly1305::{
    KeyInit, XChaCha20Poly1305, XNonce,
    aead::{Aead, Payload},
};
use std::{fmt, str::FromStr};

/// The length of a data key: XChaCha20-Poly1305 takes 256 bits.
pub const DATA_KEY_BYTES: usize = 32;
const NONCE_BYTES: usize = 24;
/// What the associated data of every sealed secret starts with.
const AAD_LABEL: &[u8] = b"authd totp secret v1\0";

/// One data key.
#[derive(Clone)]
struct DataKey {
    kid: String,
    cipher: XChaCha20Poly1305,
}

/// The data keys: the first seals, every one opens.
#[derive(Clone)]
pub struct DataKeys {
    keys: Vec<DataKey>,
}

/// Why a sealed secret did not open: for the log, never the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("the sealed secret is malformed")]
    Malformed,
    #[error("the sealed secret names a data key this server does not have")]
    UnknownKey,
    #[error("the sealed secret does not open under its data key (tampered, or another user's)")]
    Rejected,
}

fn valid_kid(kid: &str) -> bool {
    (1..=64).contains(&kid.len())
        && kid
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

fn aad(user_id: &str) -> Vec<u8> {
    [AAD_LABEL, user_id.as_bytes()].concat()
}

impl DataKeys {
    /// The kids, the sealing one first.
    pub fn kids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.kid.as_str()).collect()
    }

    /// Seals `secret` for `user_id` under the first key.
    pub fn seal(&self, user_id: &str, secret: &[u8]) -> anyhow::Result<String> {
        let key = &self.keys[0];
        let nonce_bytes: [u8; NONCE_BYTES] = rand::random();
        let nonce = XNonce::from(nonce_bytes);
        let aad = aad(user_id);
        let sealed = key
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: secret,
                    aad: &aad,
                },
            )
            .map_err(|_| anyhow::anyhow!("sealing a TOTP secret failed"))?;
        let mut out = Vec::with_capacity(NONCE_BYTES + sealed.len());
        out.extend_from_slice(&nonce_bytes);
        out.extend_from_slice(&sealed);
        Ok(format!("{}:{}", key.kid, STANDARD.encode(out)))
    }

    /// Opens a secret sealed for `user_id` by [`DataKeys::seal`] under any key.
    pub fn open(&self, user_id: &str, sealed: &str) -> Result<Vec<u8>, OpenError> {
        let (kid, body) = sealed.split_once(':').ok_or(OpenError::Malformed)?;
        let key = (self.keys.iter())
            .find(|k| k.kid == kid)
            .ok_or(OpenError::UnknownKey)?;
        let bytes = STANDARD.decode(body).map_err(|_| OpenError::Malformed)?;
        if bytes.len() <= NONCE_BYTES {
            return Err(OpenError::Malformed);
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_BYTES);
        let nonce: [u8; NONCE_BYTES] = nonce.try_into().map_err(|_| OpenError::Malformed)?;
        let aad = aad(user_id);
        key.cipher
            .decrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| OpenError::Rejected)
    }
}

impl FromStr for DataKeys {
    type Err = String;

    /// `kid:base64key,…`; the errors name the entry by position, never its text.
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut keys: Vec<DataKey> = Vec::new();
        for (i, entry) in text.split(',').map(str::trim).enumerate() {
            let n = i + 1;
            if entry.is_empty() {
                return Err(format!("data key {n} is empty"));
            }
            let Some((kid, key)) = entry.split_once(':') else {
                return Err(format!("data key {n} is not KID:BASE64KEY"));
            };
            if !valid_kid(kid) {
                return Err(format!(
                    "data key {n}: a kid is 1 to 64 characters of A-Z a-z 0-9 . _ -"
                ));
            }
            if keys.iter().any(|k| k.kid == kid) {
                return Err(format!("data key {n}: its kid is given twice"));
            }
            let bytes = STANDARD
                .decode(key.trim())
                .map_err(|_| format!("data key {n}: the key is not valid base64"))?;
            if bytes.len() != DATA_KEY_BYTES {
                return Err(format!(
                    "data key {n}: the key must be {DATA_KEY_BYTES} bytes (got {}); \
                     e.g. `head -c 32 /dev/urandom | base64`",
                    bytes.len()
                ));
            }
            let cipher = XChaCha20Poly1305::new_from_slice(&bytes)
                .map_err(|_| format!("data key {n}: the key must be {DATA_KEY_BYTES} bytes"))?;
            keys.push(DataKey {
                kid: kid.to_owned(),
                cipher,
            });
        }
        Ok(DataKeys { keys })
    }
}

impl fmt::Debug for DataKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DataKeys({:?}, ***)", self.kids())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "a:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
    const B: &str = "b:ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";

    #[test]
    fn a_sealed_secret_opens_for_its_user_only() {
        let keys: DataKeys = A.parse().unwrap();
        let sealed = keys.seal("user-1", b"12345678901234567890").unwrap();
        assert!(sealed.starts_with("a:"));
        assert!(!sealed.contains("1234567890"));
        assert_eq!(
            keys.open("user-1", &sealed).unwrap(),
            b"12345678901234567890"
        );
        assert_eq!(keys.open("user-2", &sealed), Err(OpenError::Rejected));
        // A fresh nonce each time.
        assert_ne!(
            sealed,
            keys.seal("user-1", b"12345678901234567890").unwrap()
        );
        assert_eq!(keys.open("user-1", "a:!!"), Err(OpenError::Malformed));
        assert_eq!(keys.open("user-1", "nokid"), Err(OpenError::Malformed));
    }

    #[test]
    fn rotated_keys_still_open_what_the_old_first_key_sealed() {
        let old: DataKeys = A.parse().unwrap();
        let sealed = old.seal("u", b"secret-bytes-here!!!").unwrap();
        let rotated: DataKeys = format!("{B},{A}").parse().unwrap();
        assert_eq!(rotated.open("u", &sealed).unwrap(), b"secret-bytes-here!!!");
        assert!(rotated.seal("u", b"x").unwrap().starts_with("b:"));
        let without: DataKeys = B.parse().unwrap();
        assert_eq!(without.open("u", &sealed), Err(OpenError::UnknownKey));
    }

    #[test]
    fn bad_keys_are_refused_without_quoting_them() {
        for bad in [
            "",
            "a",
            "a:c2hvcnQ=",
            "bad kid:MDEy",
            "a:***",
            &format!("{A},{A}"),
        ] {
            let err = bad.parse::<DataKeys>().unwrap_err();
            assert!(!err.contains("MDEy") && !err.contains("c2hvcnQ"), "{err}");
        }
        let keys: DataKeys = format!("{A},{B}").parse().unwrap();
        let shown = format!("{keys:?}");
        assert!(
            shown.contains("\"a\"") && !shown.contains("MDEy"),
            "{shown}"
        );
    }
}
