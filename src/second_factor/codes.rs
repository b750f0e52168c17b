//! The codes of the second factor: TOTP (RFC 6238 through the `totp-rs` crate:
//! HMAC-SHA1, 6 digits, 30-second steps, one step of skew either way), recovery
//! codes, and Login's challenges. What a code is checked against and whether it
//! was used before is the store's; here is only the arithmetic.

use sha2::{Digest as _, Sha256};
use totp_rs::{Algorithm, Secret, Totp};

/// The bytes of a new TOTP secret: 160 bits, RFC 4226's recommendation.
pub const SECRET_BYTES: usize = 20;
/// Seconds of one step.
pub const STEP_SECONDS: u64 = 30;
/// Digits of a code.
pub const DIGITS: usize = 6;
/// How many recovery codes an enrollment (or a regeneration) hands out.
pub const RECOVERY_CODES: usize = 10;
/// Characters of a recovery code (without its dashes): 80 bits of base32.
const RECOVERY_CHARS: usize = 16;
const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

/// A new random TOTP secret.
pub fn new_secret() -> Vec<u8> {
    rand::random::<[u8; SECRET_BYTES]>().to_vec()
}

/// The secret as an app takes it typed in: base32 (RFC 4648), no padding.
pub fn base32(secret: &[u8]) -> String {
    Secret::from(secret).to_base32()
}

/// The `otpauth://` URI an authenticator app scans (Google's Key Uri Format).
pub fn otpauth_uri(issuer: &str, account: &str, secret: &[u8]) -> String {
    use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
    let esc = |s: &str| utf8_percent_encode(s, NON_ALPHANUMERIC).to_string();
    format!(
        "otpauth://totp/{}:{}?secret={}&issuer={}&algorithm=SHA1&digits={DIGITS}&period={STEP_SECONDS}",
        esc(issuer),
        esc(account),
        base32(secret),
        esc(issuer),
    )
}

/// The step of the time `unix_seconds`.
pub fn step_at(unix_seconds: u64) -> u64 {
    unix_seconds / STEP_SECONDS
}

/// The steps whose code `code` is, among the current one and one either side of
/// it, latest first (a code is accepted for the latest step it matches that was
/// not used yet).
pub fn matching_steps(secret: &[u8], code: &str, unix_seconds: u64) -> Vec<u64> {
    let totp = Totp::from_rfc6238(secret);
    let now = step_at(unix_seconds);
    let mut candidates = vec![now + 1, now];
    if now > 0 {
        candidates.push(now - 1);
    }
    candidates
        .into_iter()
        .filter(|&step| {
            let expected = totp.code_at(step * STEP_SECONDS);
            subtle::ConstantTimeEq::ct_eq(expected.as_bytes(), code.as_bytes()).into()
        })
        .collect()
}

/// The few calls of the TOTP crate authd makes.
trait Rfc6238 {
    fn from_rfc6238(secret: &[u8]) -> Self;
    fn code_at(&self, unix_seconds: u64) -> String;
}

impl Rfc6238 for Totp {
    fn from_rfc6238(secret: &[u8]) -> Self {
        totp_rs::Builder::new()
            .with_algorithm(Algorithm::SHA1)
            .with_digits(DIGITS as u8)
            .with_skew(1)
            .with_step_duration(STEP_SECONDS)
            .with_secret(secret.to_vec())
            .build_noncompliant()
    }

    fn code_at(&self, unix_seconds: u64) -> String {
        self.generate(unix_seconds).to_string()
    }
}

/// What a caller typed as a code.
#[derive(Clone, PartialEq, Eq)]
pub enum Code {
    /// Six digits.
    Totp(String),
    /// A recovery code, normalized (lowercase, no dashes or spaces).
    Recovery(String),
}

impl std::fmt::Debug for Code {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Code::Totp(_) => "Code::Totp(***)",
            Code::Recovery(_) => "Code::Recovery(***)",
        })
    }
}

impl Code {
    /// Six digits, or a recovery code (dashes, spaces and letter case ignored);
    /// the error says what a code looks like, never echoes it.
    pub fn parse(text: &str) -> Result<Code, String> {
        let text = text.trim();
        if text.len() == DIGITS && text.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(Code::Totp(text.to_owned()));
        }
        let folded: String = (text.chars())
            .filter(|c| *c != '-' && *c != ' ')
            .map(|c| c.to_ascii_lowercase())
            .collect();
        if folded.len() == RECOVERY_CHARS && folded.bytes().all(|b| BASE32.contains(&b)) {
            return Ok(Code::Recovery(folded));
        }
        Err(format!(
            "must be a {DIGITS}-digit code or a recovery code (xxxx-xxxx-xxxx-xxxx)"
        ))
    }

    /// Six digits only (where a recovery code does not do).
    pub fn parse_totp(text: &str) -> Result<String, String> {
        match Code::parse(text) {
            Ok(Code::Totp(code)) => Ok(code),
            _ => Err(format!("must be a {DIGITS}-digit code")),
        }
    }
}

/// New recovery codes: what the user is shown (`xxxx-xxxx-xxxx-xxxx`), and the
/// digests the store keeps for `user_id`.
pub fn new_recovery_codes(user_id: &str) -> (Vec<String>, Vec<String>) {
    (0..RECOVERY_CODES)
        .map(|_| {
            let raw: String = (0..RECOVERY_CHARS)
                .map(|_| BASE32[usize::from(rand::random::<u8>() & 31)] as char)
                .collect();
            let digest = recovery_digest(user_id, &raw);
            let shown = (raw.as_bytes().chunks(4))
                .map(|c| std::str::from_utf8(c).unwrap_or_default())
                .collect::<Vec<_>>()
                .join("-");
            (shown, digest)
        })
        .unzip()
}

/// The stored digest of a (normalized) recovery code of `user_id`.
pub fn recovery_digest(user_id: &str, normalized: &str) -> String {
    hex::encode(
        Sha256::new()
            .chain_update(b"authd recovery code v1\0")
            .chain_update(user_id.as_bytes())
            .chain_update(b"\0")
            .chain_update(normalized.as_bytes())
            .finalize(),
    )
}

/// A Login challenge: 256 random bits, base64url; stored only as its digest.
pub struct Challenge(String);

impl Challenge {
    pub fn random() -> Self {
        use base64::Engine as _;
        let bytes: [u8; 32] = rand::random();
        Challenge(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes))
    }

    /// A challenge as a client sends it back; `None` when it cannot be one.
    pub fn parse(text: &str) -> Option<Self> {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(text)
            .ok()?;
        (bytes.len() == 32).then(|| Challenge(text.to_owned()))
    }

    /// The challenge itself: only for the answer that hands it out.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn digest(&self) -> String {
        hex::encode(Sha256::digest(self.0.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 6238's SHA-1 test vectors (8 digits there; the last 6 are ours).
    #[test]
    fn codes_follow_the_rfc_6238_vectors() {
        let secret = b"12345678901234567890";
        for (time, code) in [
            (59, "94287082"),
            (1111111109, "07081804"),
            (1111111111, "14050471"),
            (1234567890, "89005924"),
            (2000000000, "69279037"),
        ] {
            let six = &code[2..];
            assert_eq!(Totp::from_rfc6238(secret).code_at(time), six, "{time}");
            assert!(matching_steps(secret, six, time).contains(&step_at(time)));
        }
    }

    #[test]
    fn one_step_of_skew_either_way_and_no_more() {
        let secret = b"12345678901234567890";
        let now = 1_000_000_000;
        let totp = Totp::from_rfc6238(secret);
        let code = |t: u64| totp.code_at(t);
        assert_eq!(matching_steps(secret, &code(now), now), [step_at(now)]);
        assert_eq!(
            matching_steps(secret, &code(now - 30), now),
            [step_at(now) - 1]
        );
        assert_eq!(
            matching_steps(secret, &code(now + 30), now),
            [step_at(now) + 1]
        );
        assert!(matching_steps(secret, &code(now - 60), now).is_empty());
        assert!(matching_steps(secret, &code(now + 60), now).is_empty());
    }

    #[test]
    fn codes_parse_and_never_show_themselves() {
        assert_eq!(Code::parse(" 123456 "), Ok(Code::Totp("123456".into())));
        let (shown, digests) = new_recovery_codes("u");
        assert_eq!((shown.len(), digests.len()), (10, 10));
        let Ok(Code::Recovery(folded)) = Code::parse(&shown[0].to_uppercase()) else {
            panic!("a recovery code parses");
        };
        assert_eq!(recovery_digest("u", &folded), digests[0]);
        assert_ne!(recovery_digest("v", &folded), digests[0]);
        for bad in ["", "12345", "1234567", "abcd", "abcd-efgh-ijkl-mno!"] {
            assert!(Code::parse(bad).is_err(), "{bad}");
        }
        assert!(Code::parse_totp(&shown[0]).is_err());
        assert_eq!(
            format!("{:?}", Code::Totp("123456".into())),
            "Code::Totp(***)"
        );
    }

    #[test]
    fn the_uri_is_what_apps_scan() {
        let uri = otpauth_uri("authd", "alice", b"12345678901234567890");
        assert_eq!(
            uri,
            "otpauth://totp/authd:alice?secret=GEZDGNBVGY3TQOJQGEZDGNBVGY3TQOJQ&issuer=authd\
             &algorithm=SHA1&digits=6&period=30"
        );
        assert!(Challenge::parse(Challenge::random().expose()).is_some());
        assert!(Challenge::parse("short").is_none());
    }
}
