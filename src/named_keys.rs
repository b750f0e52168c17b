//! Files of named keys stored as digests, one `NAME ROLE SHA256-HEX` a line: the
//! admin keys (`AUTHD_ADMIN_KEYS_FILE`) and the introspection clients
//! (`AUTHD_INTROSPECTION_KEYS_FILE`). Each file gives the roles it knows; this file
//! owns the format and the check of a presented key, never what a role may do.
//!
//! ```text
//! # name   role        SHA-256 of the key, hex
//! oncall   admin       5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8
//! gateway  introspect  …
//! ```
//!
//! A key is a random secret (32 bytes or more), not a password: a digest is enough,
//! and a stolen file gives no key. A presented key is checked against every digest
//! in constant time, whichever matches, so the time of a refusal tells nothing.

use sha2::{Digest as _, Sha256};
use std::{fmt, path::Path};
use subtle::ConstantTimeEq as _;

/// The shortest key accepted when it is presented (shorter ones are guessable).
pub const MIN_KEY_BYTES: usize = 32;

struct Entry<R> {
    name: String,
    role: R,
    digest: [u8; 32],
}

/// The keys of one file: names, roles and digests.
pub struct NamedKeys<R> {
    entries: Vec<Entry<R>>,
}

impl<R> fmt::Debug for NamedKeys<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.entries.iter().map(|e| e.name.as_str()).collect();
        f.debug_struct("NamedKeys").field("names", &names).finish()
    }
}

impl<R: Copy> NamedKeys<R> {
    /// Reads the file at `path`; `what` names its keys in errors ("admin").
    pub fn read(
        path: &Path,
        what: &str,
        role: impl Fn(&str) -> Result<R, String>,
    ) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the {what} keys file {}: {e}", path.display()))?;
        Self::parse(&text, what, role).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses a file's text; `role` reads the role column (or says why not).
    pub fn parse(
        text: &str,
        what: &str,
        role: impl Fn(&str) -> Result<R, String>,
    ) -> Result<Self, String> {
        let mut entries: Vec<Entry<R>> = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            let [name, role_text, digest] = fields[..] else {
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
            let role = role(role_text).map_err(|why| format!("line {}: {why}", n + 1))?;
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
            return Err(format!("no {what} key in the file"));
        }
        Ok(Self { entries })
    }

    /// The name and role of the key `presented` is, if any: compared with every
    /// digest in constant time.
    pub fn identify(&self, presented: &[u8]) -> Option<(&str, R)> {
        if presented.len() < MIN_KEY_BYTES {
            return None;
        }
        let digest: [u8; 32] = Sha256::digest(presented).into();
        let mut found: Option<&Entry<R>> = None;
        for entry in &self.entries {
            if bool::from(entry.digest.ct_eq(&digest)) {
                found = Some(entry);
            }
        }
        found.map(|e| (e.name.as_str(), e.role))
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
