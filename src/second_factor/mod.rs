//! The second factor's parts that know neither the store nor the request: TOTP
//! codes, recovery codes, Login's challenges, and the data keys that seal TOTP
//! secrets at rest. The use cases that put them together are `accounts`'s.
//!
//! # Layout
//!
//! - `codes`: RFC 6238 codes (through the `totp-rs` crate), the `otpauth://` URI,
//!   recovery codes and their digests, challenges.
//! - `keys`: [`DataKeys`], `AUTHD_DATA_KEYS`: XChaCha20-Poly1305 under rotating
//!   keys, the user id as associated data.

mod codes;
mod keys;

pub use codes::{
    Challenge, Code, base32, matching_steps, new_recovery_codes, new_secret, otpauth_uri,
    recovery_digest,
};
pub use keys::DataKeys;
