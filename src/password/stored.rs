//! A user's password as the store keeps it: `password_hash`, which every release
//! reads, and `password_hash_ext`, a hash in a format the releases before this one
//! cannot verify (imported from another system, or Argon2id).
//!
//! While a user has an ext hash, `password_hash` holds a [`marker`]: a well-formed
//! PBKDF2-SHA256 hash at the policy's cost, of the fixed salt [`MARKER_SALT`] and a
//! random output, which no password matches. A release that knows nothing of the
//! ext column verifies the marker at the usual cost and answers a wrong password;
//! this one verifies the ext hash instead. Any release that sets a password the
//! usual way replaces the marker, and from then on the ext column is ignored (the
//! releases that know it clear it in the same statement).

use super::{Params, StoredHash, phc_string};

/// The salt of every marker: 16 bytes no salt authd makes is (those are random).
pub const MARKER_SALT: &[u8; 16] = b"authd:hash-ext:1";

/// Which of a user's two hashes a login verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effective<'a> {
    /// `password_hash`: authd's own PBKDF2 PHC string.
    Phc(&'a str),
    /// `password_hash_ext`, while `password_hash` is a marker.
    Ext(&'a str),
}

/// The hash that counts for a user whose columns hold `password_hash` and `ext`.
pub fn effective<'a>(password_hash: &'a str, ext: Option<&'a str>) -> Effective<'a> {
    match ext {
        Some(ext) if is_marker(password_hash) => Effective::Ext(ext),
        _ => Effective::Phc(password_hash),
    }
}

/// A marker at `iterations` rounds: what `password_hash` holds beside an ext hash.
pub fn marker(iterations: u32) -> anyhow::Result<String> {
    let params = Params::new(iterations)
        .map_err(|e| anyhow::anyhow!("invalid PBKDF2 iteration count {iterations}: {e}"))?;
    let mut output = [0u8; 32];
    rand::fill(&mut output);
    phc_string(params, MARKER_SALT, &output)
}

/// Whether `password_hash` is a marker (a PBKDF2-SHA256 hash of [`MARKER_SALT`]).
pub fn is_marker(password_hash: &str) -> bool {
    matches!(
        StoredHash::parse(password_hash),
        Ok(Some(stored)) if stored.salt == MARKER_SALT
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_is_a_pbkdf2_hash_that_points_at_the_ext_column() {
        let m = marker(600_000).unwrap();
        assert!(m.starts_with("$pbkdf2-sha256$i=600000,l=32$"), "{m}");
        assert!(is_marker(&m));
        assert_ne!(m, marker(600_000).unwrap(), "the output is random");
        assert_eq!(effective(&m, Some("$2b$04$x")), Effective::Ext("$2b$04$x"));
        assert_eq!(effective(&m, None), Effective::Phc(&m));
    }

    #[test]
    fn a_password_set_by_any_release_makes_the_ext_column_count_for_nothing() {
        let own = super::super::hash_now(
            &crate::credentials::Password::parse("correct horse").unwrap(),
            Params::new(1000).unwrap(),
        )
        .unwrap();
        assert!(!is_marker(&own));
        assert_eq!(effective(&own, Some("$2b$04$x")), Effective::Phc(&own));
        assert!(!is_marker("$2b$04$not a phc string"));
        assert!(!is_marker(""));
    }
}
