//! Admin keys: the credentials of the admin API, read from `AUTHD_ADMIN_KEYS_FILE`.
//!
//! The file stores no key, only each key's SHA-256 digest, with a name (so the
//! audit trail says which key acted) and a role. One key per line:
//!
//! ```text
//! # name   role   SHA-256 of the key, hex
//! oncall   admin  5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
//! auditor  read   …
//! ```
//!
//! A key is a random secret (32 bytes or more), not a password: a digest is enough,
//! and a stolen file gives no key. A presented key is checked against every digest
//! in constant time, whichever matches, so the time of a refusal tells nothing.

use sha2::{Digest as _, Sha256};
use std::{fmt, path::Path};
use subtle::ConstantTimeEq as _;

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Read accounts (GetUser, ListUsers).
    Read,
    /// Read and change accounts.
    Admin,
}

impl Role {
    pub fn label(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Admin => "admin",
        }
    }
}

/// The key that made a call: its name and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    pub name: String,
    pub role: Role,
}

struct Entry {
    name: String,
    role: Role,
    digest: [u8; 32],
}

/// The admin keys: names, roles and digests.
pub struct AdminKeys {
    entries: Vec<Entry>,
}

impl fmt::Debug for AdminKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|e| e.name.as_str()).collect();
        f.debug_struct("AdminKeys").field("names", &names).finish()
    }
}

/// The shortest key accepted when it is presented (shorter ones are guessable).
pub const MIN_KEY_BYTES: usize = 32;

impl AdminKeys {
    /// Reads the keys file at `path`.
    pub fn read(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the admin keys file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses the keys file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries: Vec<Entry> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, role, digest] = fields[..] else {
                return Err(format!(
                    "line {}: expected `NAME ROLE SHA256-HEX`, got {} fields",
                    n + 1,
                    fields.len()
                ));
            };
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
                || name.len() > 64
            {
                return Err(format!(
                    "line {}: a key's name is 1 to 64 letters, digits, '-', '_' or '.'",
                    n + 1
                ));
            }
            let role = match role {
                "admin" => Role::Admin,
                "read" => Role::Read,
                other => {
                    return Err(format!(
                        "line {}: unknown role {other:?} (expected admin or read)",
                        n + 1
                    ));
                }
            };
            let digest = decode_digest(digest).ok_or_else(|| {
                format!(
                    "line {}: the digest must be 64 hex digits (the SHA-256 of the key)",
                    n + 1
                )
            })?;
            if entries.iter().any(|e| e.name == name) {
                return Err(format!("line {}: the name {name:?} is used twice", n + 1));
            }
            entries.push(Entry {
                name: name.to_owned(),
                role,
                digest,
            });
        }
        if entries.is_empty() {
            return Err("no admin key in the file".into());
        }
        Ok(Self { entries })
    }

    /// The key `presented` belongs to, if any: compared with every digest in
    /// constant time.
    pub fn identify(&self, presented: &str) -> Option<Actor> {
        if presented.len() < MIN_KEY_BYTES {
            return None;
        }
        let digest: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        let mut found: Option<&Entry> = None;
        for entry in &self.entries {
            if bool::from(entry.digest.ct_eq(&digest)) {
                found = Some(entry);
            }
        }
        found.map(|e| Actor {
            name: e.name.clone(),
            role: e.role,
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn decode_digest(text: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(text, &mut out).ok()?;
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "0123456789abcdef0123456789abcdef-oncall";

    /// A key's digest as the keys file holds it: `SHA-256(key)` in hex.
    fn digest_hex(key: &str) -> String {
        hex::encode(Sha256::digest(key.as_bytes()))
    }

    #[test]
    fn a_key_is_known_by_its_digest_only() {
        let text = format!(
            "# comment\n\noncall admin {}\nauditor read {}\n",
            digest_hex(KEY),
            digest_hex("another key of thirty-two bytes or more")
        );
        let keys = AdminKeys::parse(&text).unwrap();
        assert_eq!(keys.len(), 2);
        assert_eq!(
            keys.identify(KEY),
            Some(Actor {
                name: "oncall".into(),
                role: Role::Admin
            })
        );
        assert_eq!(
            keys.identify("another key of thirty-two bytes or more")
                .map(|a| a.role),
            Some(Role::Read)
        );
        assert_eq!(
            keys.identify("wrong key of thirty-two bytes or more!"),
            None
        );
        // The digest itself is no key.
        assert_eq!(keys.identify(&digest_hex(KEY)), None);
        // Too short to be a key, whatever the file says.
        let short = AdminKeys::parse(&format!("x admin {}", digest_hex("short"))).unwrap();
        assert_eq!(short.identify("short"), None);
        assert!(!format!("{keys:?}").contains(&digest_hex(KEY)));
    }

    #[test]
    fn a_bad_file_is_refused_with_its_line() {
        let digest = digest_hex(KEY);
        for (text, says) in [
            ("", "no admin key"),
            ("oncall admin", "line 1: expected"),
            (&format!("oncall root {digest}")[..], "unknown role"),
            ("oncall admin abc", "64 hex digits"),
            (&format!("on/call admin {digest}")[..], "name"),
            (
                &format!("a admin {digest}\na read {digest}")[..],
                "line 2: the name \"a\" is used twice",
            ),
        ] {
            let err = AdminKeys::parse(text).unwrap_err();
            assert!(err.contains(says), "{text:?}: {err}");
        }
    }
}
