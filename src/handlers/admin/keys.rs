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
//! The format and the constant-time check of a presented key are
//! `crate::named_keys`'s, shared with the introspection clients' file; this file
//! owns the admin roles.

use crate::named_keys::NamedKeys;
use std::path::Path;

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

/// The admin keys: names, roles and digests (the format is `crate::named_keys`).
#[derive(Debug)]
pub struct AdminKeys(NamedKeys<Role>);

impl AdminKeys {
    /// Reads the keys file at `path`.
    pub fn read(path: &Path) -> Result<Self, String> {
        NamedKeys::read(path, "admin", role).map(Self)
    }

    /// Parses the keys file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        NamedKeys::parse(text, "admin", role).map(Self)
    }

    /// The key `presented` belongs to, if any: compared with every digest in
    /// constant time.
    pub fn identify(&self, presented: &str) -> Option<Actor> {
        self.0
            .identify(presented.as_bytes())
            .map(|(name, role)| Actor {
                name: name.to_owned(),
                role,
            })
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The role column of the admin keys file.
fn role(text: &str) -> Result<Role, String> {
    match text {
        "admin" => Ok(Role::Admin),
        "read" => Ok(Role::Read),
        other => Err(format!("unknown role {other:?} (expected admin or read)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest as _, Sha256};

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
