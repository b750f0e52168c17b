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
//!
//! Two markers tell whose the ext hash is: [`marker`] (salt [`MARKER_SALT`]) for a
//! hash another system made, verified against the password as the client sent it,
//! and [`own_marker`] (salt [`OWN_MARKER_SALT`]) for authd's own Argon2id hash,
//! verified against the password's NFKC form as every hash authd makes.

use super::{Params, StoredHash, phc_string};

/// The salt of the marker beside another system's hash: 16 bytes no salt authd
/// makes is (those are random).
pub const MARKER_SALT: &[u8; 16] = b"authd:hash-ext:1";
/// The salt of the marker beside authd's own Argon2id hash.
pub const OWN_MARKER_SALT: &[u8; 16] = b"authd:hash-ext:2";

/// Which of a user's two hashes a login verifies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effective<'a> {
    /// `password_hash`: authd's own PBKDF2 PHC string.
    Phc(&'a str),
    /// `password_hash_ext`, another system's hash, while `password_hash` is a
    /// [`marker`].
    Ext(&'a str),
    /// `password_hash_ext`, authd's own Argon2id hash, while `password_hash` is an
    /// [`own_marker`].
    Own(&'a str),
}

/// The hash that counts for a user whose columns hold `password_hash` and `ext`.
pub fn effective<'a>(password_hash: &'a str, ext: Option<&'a str>) -> Effective<'a> {
    let Some(ext) = ext else {
        return Effective::Phc(password_hash);
    };
    match StoredHash::parse(password_hash) {
        Ok(Some(stored)) if stored.salt == MARKER_SALT => Effective::Ext(ext),
        Ok(Some(stored)) if stored.salt == OWN_MARKER_SALT => Effective::Own(ext),
        _ => Effective::Phc(password_hash),
    }
}

/// A marker at `iterations` rounds: what `password_hash` holds beside another
/// system's hash.
pub fn marker(iterations: u32) -> anyhow::Result<String> {
    marker_of(MARKER_SALT, iterations)
}

/// A marker at `iterations` rounds beside authd's own Argon2id hash.
pub fn own_marker(iterations: u32) -> anyhow::Result<String> {
    marker_of(OWN_MARKER_SALT, iterations)
}

fn marker_of(salt: &[u8; 16], iterations: u32) -> anyhow::Result<String> {
    let params = Params::new(iterations)
        .map_err(|e| anyhow::anyhow!("invalid PBKDF2 iteration count {iterations}: {e}"))?;
    let mut output = [0u8; 32];
    rand::fill(&mut output);
    phc_string(params, salt, &output)
}

/// Whether `password_hash` is a marker of either kind.
#[cfg(test)]
pub fn is_marker(password_hash: &str) -> bool {
    matches!(
        StoredHash::parse(password_hash),
        Ok(Some(stored)) if stored.salt == MARKER_SALT || stored.salt == OWN_MARKER_SALT
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
        let own = own_marker(1000).unwrap();
        assert!(is_marker(&own));
        let argon2 = "$argon2id$v=19$m=64,t=1,p=1$x$y";
        assert_eq!(effective(&own, Some(argon2)), Effective::Own(argon2));
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
