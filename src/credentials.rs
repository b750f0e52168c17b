//! `Username`, `Password` and `PresentedPassword`: parsed and normalized once, at
//! the edge.
//!
//! Each wraps a private field and is built only through `parse`, so code past the
//! gRPC layer never re-checks them. A [`Password`] is a new password, held to the
//! password rules; a [`PresentedPassword`] is one given to be verified (Login,
//! ChangePassword's current password), held only to the byte bound: the rules
//! apply to new passwords, never to verifying one set before them (an imported
//! user's may be shorter). A password is never logged or echoed: its `Debug` is
//! redacted and its errors describe the rule, not the value.

use std::fmt;
use unicode_normalization::UnicodeNormalization;

/// A validated username: 3 to 64 characters of `A-Z a-z 0-9 . _ -`, at least one of
/// them a letter or a digit, lowercased.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Username(String);

impl Username {
    pub const MIN_CHARS: usize = 3;
    pub const MAX_CHARS: usize = 64;

    /// Validates and normalizes (lowercases) a username. The error is safe to show.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("must not be empty".into());
        }
        if let Some(bad) = raw
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(format!(
                "may contain only letters A-Z, digits, '.', '_' and '-' (found {bad:?})"
            ));
        }
        // All characters are ASCII from here on, so bytes are characters.
        if !(Self::MIN_CHARS..=Self::MAX_CHARS).contains(&raw.len()) {
            return Err(format!(
                "must be {} to {} characters long (got {})",
                Self::MIN_CHARS,
                Self::MAX_CHARS,
                raw.len()
            ));
        }
        // `...` or `-_-` is no one's name, and reads as punctuation in logs and UIs.
        if !raw.bytes().any(|b| b.is_ascii_alphanumeric()) {
            return Err("must contain at least one letter A-Z or digit".into());
        }
        Ok(Self(raw.to_ascii_lowercase()))
    }

    /// Wraps a username read back from the store, where it was saved already parsed.
    pub(crate) fn from_store(stored: String) -> Self {
        Self(stored)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Username {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A validated password: NFKC-normalized, at least 8 code points both as typed and
/// once normalized, at most 1024 bytes.
#[derive(Clone)]
pub struct Password(String);

impl Password {
    pub const MIN_CHARS: usize = 8;
    pub const MAX_BYTES: usize = 1024;

    /// Validates and NFKC-normalizes a password. The error never contains the password.
    pub fn parse(raw: &str) -> Result<Self, String> {
        // Refuse oversized input before normalizing it: NFKC can expand a string.
        if raw.len() > Self::MAX_BYTES {
            return Err(format!("must be at most {} bytes", Self::MAX_BYTES));
        }
        let normalized: String = raw.nfkc().collect();
        if normalized.len() > Self::MAX_BYTES {
            return Err(format!(
                "must be at most {} bytes after NFKC normalization",
                Self::MAX_BYTES
            ));
        }
        // Counted on both sides of NFKC: one code point can expand to many (U+FDFA
        // becomes 18), and a password typed as one character is one character long.
        if raw.chars().count() < Self::MIN_CHARS || normalized.chars().count() < Self::MIN_CHARS {
            return Err(format!("must be at least {} characters", Self::MIN_CHARS));
        }
        Ok(Self(normalized))
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// A password given to be verified, as the client sent it: not empty, at most
/// [`Password::MAX_BYTES`] bytes, and nothing more. It is verified as sent against
/// a hash made by another system (which did not normalize), and in its NFKC form
/// against authd's own hashes (made of the NFKC form at registration).
#[derive(Clone)]
pub struct PresentedPassword {
    sent: String,
    normalized: String,
}

impl PresentedPassword {
    /// Checks the byte bound (before normalizing: NFKC can expand a string) and
    /// that it is not empty. The error never contains the password.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("must not be empty".into());
        }
        if raw.len() > Password::MAX_BYTES {
            return Err(format!("must be at most {} bytes", Password::MAX_BYTES));
        }
        Ok(Self {
            sent: raw.to_owned(),
            normalized: raw.nfkc().collect(),
        })
    }

    /// The bytes exactly as the client sent them.
    pub(crate) fn as_sent(&self) -> &[u8] {
        self.sent.as_bytes()
    }

    /// The NFKC form, as authd hashes a password: what its own hashes are verified
    /// against, and what a rehash hashes, whether or not it meets the rules (a
    /// password that verified is the user's, and stays theirs after the rehash).
    pub(crate) fn normalized(&self) -> Password {
        Password(self.normalized.clone())
    }

    /// Whether it meets the rules a new password must meet ([`Password::parse`]).
    pub fn meets_rules(&self) -> bool {
        Password::parse(&self.sent).is_ok()
    }
}

impl fmt::Debug for PresentedPassword {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PresentedPassword(<redacted>)")
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Password(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usernames_are_lowercased() {
        assert_eq!(
            Username::parse("Alice.B_2-x").unwrap().as_str(),
            "alice.b_2-x"
        );
    }

    #[test]
    fn usernames_outside_the_rules_are_refused() {
        for bad in [
            "",
            "ab",
            &"a".repeat(65),
            "al ice",
            "alice!",
            "ålice",
            "a\0b",
        ] {
            assert!(Username::parse(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(Username::parse("abc").is_ok());
        for punctuation in ["...", "---", "___", "._-", &".".repeat(64)] {
            let err = Username::parse(punctuation).unwrap_err();
            assert!(
                err.contains("letter A-Z or digit"),
                "{punctuation:?}: {err}"
            );
        }
        for fine in ["a..", "--7", "_x_"] {
            assert!(Username::parse(fine).is_ok(), "{fine:?}");
        }
        assert!(Username::parse(&"a".repeat(64)).is_ok());
    }

    #[test]
    fn passwords_are_nfkc_normalized() {
        // U+FB01 (the "fi" ligature) normalizes to "fi"; full-width digits to ASCII.
        let a = Password::parse("\u{FB01}sh-１２３４５").unwrap();
        let b = Password::parse("fish-12345").unwrap();
        assert_eq!(a.as_bytes(), b.as_bytes());
    }

    #[test]
    fn password_length_counts_code_points_and_bytes() {
        assert!(Password::parse("1234567").is_err());
        assert!(Password::parse("12345678").is_ok());
        // Eight 4-byte code points: 8 characters, 32 bytes.
        assert!(Password::parse(&"😀".repeat(8)).is_ok());
        assert!(Password::parse(&"😀".repeat(7)).is_err());
        assert!(Password::parse(&"x".repeat(1024)).is_ok());
        assert!(Password::parse(&"x".repeat(1025)).is_err());
    }

    #[test]
    fn password_length_is_required_before_and_after_normalization() {
        // U+FDFA: one code point, 18 after NFKC.
        let ligature = "\u{FDFA}";
        assert_eq!(ligature.nfkc().count(), 18);
        let err = Password::parse(ligature).unwrap_err();
        assert!(err.contains("at least 8 characters"), "{err}");
        assert!(!err.contains(ligature));
        assert!(Password::parse(&ligature.repeat(7)).is_err());
        assert!(Password::parse(&ligature.repeat(8)).is_ok());
        // The other way round: decomposed characters NFKC composes. "e" + U+0301 is
        // two code points typed, one (é) normalized.
        let decomposed = "e\u{301}".repeat(5);
        assert_eq!(decomposed.chars().count(), 10);
        assert!(Password::parse(&decomposed).is_err());
        assert!(Password::parse(&"e\u{301}".repeat(8)).is_ok());
    }

    #[test]
    fn a_presented_password_is_bounded_by_bytes_only() {
        for short in ["x", "abc123", "\u{FDFA}"] {
            let p = PresentedPassword::parse(short).unwrap();
            assert_eq!(p.as_sent(), short.as_bytes());
            assert!(!p.meets_rules(), "{short:?}");
        }
        assert!(PresentedPassword::parse("").is_err());
        assert!(PresentedPassword::parse(&"x".repeat(1024)).is_ok());
        let err = PresentedPassword::parse(&"x".repeat(1025)).unwrap_err();
        assert!(err.contains("1024 bytes"), "{err}");
        assert!(
            PresentedPassword::parse("a fine password")
                .unwrap()
                .meets_rules()
        );
    }

    #[test]
    fn a_presented_password_is_kept_as_sent_and_normalized_as_registered() {
        let p = PresentedPassword::parse("caf\u{E9} \u{FB01}ne").unwrap();
        assert_eq!(p.as_sent(), "caf\u{E9} \u{FB01}ne".as_bytes());
        let registered = Password::parse("cafe\u{301} fine").unwrap();
        assert_eq!(p.normalized().as_bytes(), registered.as_bytes());
        // One code point as sent, 18 once normalized: under the rules, yet
        // normalized all the same.
        let p = PresentedPassword::parse("\u{FDFA}").unwrap();
        assert_eq!(
            p.normalized().as_bytes().len(),
            "\u{FDFA}".nfkc().collect::<String>().len()
        );
        assert!(!format!("{p:?}").contains('\u{FDFA}'));
    }

    #[test]
    fn password_debug_and_errors_never_show_the_password() {
        let p = Password::parse("hunter2hunter2").unwrap();
        assert!(!format!("{p:?}").contains("hunter2"));
        let err = Password::parse("hunter2").unwrap_err();
        assert!(!err.contains("hunter2"));
    }
}
