//! Stateless access tokens: JWT (RFC 7519) signed with HMAC-SHA256.
//!
//! A [`KeyRing`] holds named keys (`kid`); the first signs, all verify, so keys can
//! be rotated without downtime: add the new key second, roll it out, move it first,
//! and drop the old one once its tokens have expired. Verification is constant-time
//! (`Mac::verify_slice`) and accepts `alg: HS256` only. Keys never appear in `Debug`.
//!
//! Every time computed from a token is checked: a validly signed token whose `exp`
//! or `iat` lies past [`MAX_TIMESTAMP`] (year 9999) is refused as malformed, never
//! added to an instant where it would overflow. Why a token was refused is told to
//! the metrics and the log, never to the client (see `grpc`).

use crate::{credentials::Username, metrics::Metrics};
use base64::{
    Engine as _,
    engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD},
};
use hmac::{Hmac, KeyInit, Mac};
use prometheus::IntCounter;
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use std::{
    fmt,
    str::FromStr,
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

type HmacSha256 = Hmac<Sha256>;

/// The `iss` claim of every token authd issues.
pub const ISSUER: &str = "authd";
/// Keys shorter than this are refused.
pub const MIN_KEY_BYTES: usize = 32;
/// The latest `iat` or `exp` a token may carry: 9999-12-31T23:59:59Z, the end of
/// RFC 3339 time (and of `google.protobuf.Timestamp`). Anything later is malformed.
pub const MAX_TIMESTAMP: u64 = 253_402_300_799;
/// The longest lifetime a token may be issued with (`AUTHD_TOKEN_TTL`). A stateless
/// token cannot be revoked before it expires: past a week, a stolen token outlives
/// any reasonable response to the theft.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// Why a token was refused: a metric label and a log field. The client is told only
/// that the token is invalid, so that nobody can probe for key names or algorithms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("malformed token")]
    Malformed,
    #[error("unsupported signing algorithm (only HS256 is accepted)")]
    UnsupportedAlgorithm,
    #[error("token signed by an unknown key")]
    UnknownKey,
    #[error("bad signature")]
    BadSignature,
    #[error("token expired")]
    Expired,
    #[error("token issued by someone else")]
    WrongIssuer,
}

impl TokenError {
    /// Every kind, in the order of [`TokenError::index`].
    const ALL: [TokenError; 6] = [
        TokenError::Malformed,
        TokenError::UnsupportedAlgorithm,
        TokenError::UnknownKey,
        TokenError::BadSignature,
        TokenError::Expired,
        TokenError::WrongIssuer,
    ];

    /// A metric label: `authd_tokens_validated_total{outcome=…}`.
    pub fn label(self) -> &'static str {
        match self {
            TokenError::Malformed => "malformed",
            TokenError::UnsupportedAlgorithm => "unsupported_algorithm",
            TokenError::UnknownKey => "unknown_key",
            TokenError::BadSignature => "bad_signature",
            TokenError::Expired => "expired",
            TokenError::WrongIssuer => "wrong_issuer",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

struct Key {
    kid: String,
    secret: Vec<u8>,
}

/// Named HMAC keys: the first signs, every one verifies.
#[derive(Clone)]
pub struct KeyRing {
    keys: Arc<[Key]>,
}

impl KeyRing {
    /// A single random key, for a server started without configured keys.
    pub fn random() -> Self {
        let mut secret = vec![0u8; 32];
        rand::fill(secret.as_mut_slice());
        let kid = format!("ephemeral-{:08x}", rand::random::<u32>());
        Self {
            keys: Arc::from(vec![Key { kid, secret }]),
        }
    }

    pub fn kids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.kid.as_str())
    }

    fn signer(&self) -> &Key {
        // A ring is never empty: `from_str` refuses an empty list.
        &self.keys[0]
    }

    fn find(&self, kid: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.kid == kid)
    }
}

impl FromStr for KeyRing {
    type Err = String;

    /// Parses `kid:base64key,kid:base64key,…` (standard or URL-safe base64).
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let mut keys: Vec<Key> = Vec::new();
        for (i, entry) in spec.split(',').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            let n = i + 1;
            let (kid, encoded) = entry
                .split_once(':')
                .ok_or_else(|| format!("key #{n} is not of the form KID:BASE64KEY"))?;
            let kid = kid.trim();
            if kid.is_empty()
                || kid.len() > 64
                || !kid
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            {
                return Err(format!(
                    "key #{n}: the kid must be 1 to 64 characters of A-Z a-z 0-9 . _ -"
                ));
            }
            let encoded = encoded.trim();
            let secret = [STANDARD, URL_SAFE, STANDARD_NO_PAD, URL_SAFE_NO_PAD]
                .iter()
                .find_map(|engine| engine.decode(encoded).ok())
                .ok_or_else(|| format!("key {kid:?} is not valid base64"))?;
            if secret.len() < MIN_KEY_BYTES {
                return Err(format!(
                    "key {kid:?} is {} bytes long; keys must be at least {MIN_KEY_BYTES} bytes",
                    secret.len()
                ));
            }
            if keys.iter().any(|k| k.kid == kid) {
                return Err(format!("kid {kid:?} appears twice"));
            }
            keys.push(Key {
                kid: kid.to_owned(),
                secret,
            });
        }
        if keys.is_empty() {
            return Err("no keys given (expected KID:BASE64KEY,…)".into());
        }
        Ok(Self {
            keys: Arc::from(keys),
        })
    }
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRing")
            .field("kids", &self.kids().collect::<Vec<_>>())
            .field("secrets", &"<redacted>")
            .finish()
    }
}

#[derive(Serialize, Deserialize)]
struct Header {
    alg: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    typ: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kid: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Claims {
    sub: String,
    name: String,
    iat: u64,
    exp: u64,
    iss: String,
}

/// A token just issued.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    pub token: String,
    pub expires_at: SystemTime,
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedToken {
    pub user_id: String,
    pub username: String,
    pub expires_at: SystemTime,
}

/// Issues and verifies tokens with a key ring and a lifetime.
pub struct Tokens {
    keys: KeyRing,
    ttl: Duration,
    issued: IntCounter,
    valid: IntCounter,
    /// Refusals, indexed by [`TokenError::index`].
    refused: [IntCounter; TokenError::ALL.len()],
}

impl Tokens {
    pub fn new(keys: KeyRing, ttl: Duration, metrics: &Metrics) -> Self {
        let validated = &metrics.tokens.validated;
        Self {
            keys,
            ttl,
            issued: metrics.tokens.issued.clone(),
            valid: validated.with_label_values(&["ok"]),
            refused: TokenError::ALL.map(|e| validated.with_label_values(&[e.label()])),
        }
    }

    pub fn issue(&self, user_id: &str, username: &Username) -> anyhow::Result<IssuedToken> {
        let mut span = crate::otel::child("token.sign");
        span.set("token.alg", "HS256");
        let now = unix_now();
        let exp = now.saturating_add(self.ttl.as_secs().max(1));
        // Unreachable with a TTL of at most `MAX_TTL` and a sane clock; refused
        // rather than issued as a token that this server would call malformed.
        let expires_at = unix_time(exp).ok_or_else(|| {
            anyhow::anyhow!("a token lifetime of {:?} ends past year 9999", self.ttl)
        })?;
        let key = self.keys.signer();
        let header = Header {
            alg: "HS256".into(),
            typ: Some("JWT".into()),
            kid: Some(key.kid.clone()),
        };
        let claims = Claims {
            sub: user_id.to_owned(),
            name: username.as_str().to_owned(),
            iat: now,
            exp,
            iss: ISSUER.into(),
        };
        let mut token = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header)?),
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims)?)
        );
        let signature = mac(&key.secret, token.as_bytes()).finalize().into_bytes();
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(signature));
        self.issued.inc();
        Ok(IssuedToken { token, expires_at })
    }

    /// Checks a token and counts the outcome.
    pub fn verify(&self, token: &str) -> Result<VerifiedToken, TokenError> {
        let mut span = crate::otel::child("token.verify");
        let result = self.check(token);
        match &result {
            Ok(_) => self.valid.inc(),
            Err(e) => {
                self.refused[e.index()].inc();
                span.set("token.refused", e.label());
            }
        }
        result
    }

    fn check(&self, token: &str) -> Result<VerifiedToken, TokenError> {
        let mut parts = token.split('.');
        let (Some(header_b64), Some(claims_b64), Some(signature_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let header: Header = decode_json(header_b64)?;
        if header.alg != "HS256" {
            return Err(TokenError::UnsupportedAlgorithm);
        }
        let key = header
            .kid
            .as_deref()
            .and_then(|kid| self.keys.find(kid))
            .ok_or(TokenError::UnknownKey)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature_b64)
            .map_err(|_| TokenError::Malformed)?;
        let signed_len = header_b64.len() + 1 + claims_b64.len();
        mac(&key.secret, &token.as_bytes()[..signed_len])
            .verify_slice(&signature)
            .map_err(|_| TokenError::BadSignature)?;
        // Only a correctly signed payload is parsed further.
        let claims: Claims = decode_json(claims_b64)?;
        if claims.iss != ISSUER {
            return Err(TokenError::WrongIssuer);
        }
        // Signed by us or with our key, yet no token of ours says year 10000: refuse
        // before the value meets any time arithmetic.
        if claims.iat > MAX_TIMESTAMP {
            return Err(TokenError::Malformed);
        }
        let expires_at = unix_time(claims.exp).ok_or(TokenError::Malformed)?;
        if claims.exp <= unix_now() {
            return Err(TokenError::Expired);
        }
        Ok(VerifiedToken {
            user_id: claims.sub,
            username: claims.name,
            expires_at,
        })
    }
}

fn mac(secret: &[u8], data: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length, so this cannot fail.
    let mut mac =
        <HmacSha256 as KeyInit>::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(data);
    mac
}

fn decode_json<T: for<'de> Deserialize<'de>>(part: &str) -> Result<T, TokenError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| TokenError::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed)
}

/// `secs` after the Unix epoch, when that is at most [`MAX_TIMESTAMP`].
fn unix_time(secs: u64) -> Option<SystemTime> {
    if secs > MAX_TIMESTAMP {
        return None;
    }
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "a:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

    fn tokens(spec: &str) -> Tokens {
        Tokens::new(
            spec.parse().unwrap(),
            Duration::from_secs(60),
            &Metrics::new(),
        )
    }

    #[test]
    fn issued_tokens_verify() {
        let t = tokens(KEY_A);
        let issued = t.issue("id-1", &Username::parse("Alice").unwrap()).unwrap();
        let v = t.verify(&issued.token).unwrap();
        assert_eq!(v.user_id, "id-1");
        assert_eq!(v.username, "alice");
        assert_eq!(v.expires_at, issued.expires_at);
    }

    #[test]
    fn issued_and_validated_tokens_are_counted_by_outcome() {
        let metrics = Metrics::new();
        let t = Tokens::new(KEY_A.parse().unwrap(), Duration::from_secs(60), &metrics);
        let issued = t.issue("id-1", &Username::parse("Alice").unwrap()).unwrap();
        t.verify(&issued.token).unwrap();
        t.verify("not a token").unwrap_err();
        // Another first character of the signature: a signature that does not match.
        let dot = issued.token.rfind('.').unwrap();
        let first = &issued.token[dot + 1..dot + 2];
        let other = if first == "A" { "B" } else { "A" };
        let tampered = format!(
            "{}{other}{}",
            &issued.token[..=dot],
            &issued.token[dot + 2..]
        );
        assert_eq!(t.verify(&tampered), Err(TokenError::BadSignature));
        let text = metrics.render();
        for line in [
            "authd_tokens_issued_total 1",
            r#"authd_tokens_validated_total{outcome="ok"} 1"#,
            r#"authd_tokens_validated_total{outcome="malformed"} 1"#,
            r#"authd_tokens_validated_total{outcome="bad_signature"} 1"#,
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        for (i, e) in TokenError::ALL.iter().enumerate() {
            assert_eq!(e.index(), i);
        }
    }

    #[test]
    fn key_ring_parsing() {
        assert!("".parse::<KeyRing>().is_err());
        assert!(
            "nokid"
                .parse::<KeyRing>()
                .unwrap_err()
                .contains("KID:BASE64KEY")
        );
        assert!(
            "a:c2hvcnQ="
                .parse::<KeyRing>()
                .unwrap_err()
                .contains("at least 32 bytes")
        );
        assert!("a:!!!".parse::<KeyRing>().unwrap_err().contains("base64"));
        let dup = format!("{KEY_A},{KEY_A}");
        assert!(dup.parse::<KeyRing>().unwrap_err().contains("twice"));
        let ring: KeyRing = format!("{KEY_A}, b:{}", &KEY_A[2..]).parse().unwrap();
        assert_eq!(ring.kids().collect::<Vec<_>>(), ["a", "b"]);
        assert!(!format!("{ring:?}").contains(&KEY_A[2..]));
    }

    #[test]
    fn random_input_never_panics_and_never_verifies() {
        let t = tokens(KEY_A);
        let genuine = t
            .issue("id", &Username::parse("alice").unwrap())
            .unwrap()
            .token;
        let alphabet = b"AZaz09-_.=+/ \0\xff{}\":,";
        for round in 0..20_000 {
            let len = rand::random_range(0..200);
            let mut bytes: Vec<u8> = (0..len)
                .map(|_| alphabet[rand::random_range(0..alphabet.len())])
                .collect();
            if round % 2 == 0 {
                // Mutations of a genuine token: one byte changed.
                bytes = genuine.clone().into_bytes();
                let i = rand::random_range(0..bytes.len());
                let replacement = alphabet[rand::random_range(0..alphabet.len())];
                if bytes[i] == replacement {
                    continue;
                }
                bytes[i] = replacement;
            }
            let input = String::from_utf8_lossy(&bytes);
            assert!(t.verify(&input).is_err(), "{input:?} verified");
        }
    }

    /// A token with these claims (JSON text), correctly signed with `KEY_A`.
    fn signed(claims: &str) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT","kid":"a"}"#);
        let payload = URL_SAFE_NO_PAD.encode(claims);
        let key: KeyRing = KEY_A.parse().unwrap();
        let signing_input = format!("{header}.{payload}");
        let signature = mac(&key.signer().secret, signing_input.as_bytes())
            .finalize()
            .into_bytes();
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature))
    }

    #[test]
    fn times_past_year_9999_are_malformed_not_a_panic() {
        let t = tokens(KEY_A);
        let claims = |iat: &str, exp: &str| {
            format!(r#"{{"sub":"id","name":"alice","iat":{iat},"exp":{exp},"iss":"{ISSUER}"}}"#)
        };
        let now = unix_now().to_string();
        let soon = (unix_now() + 60).to_string();
        assert!(t.verify(&signed(&claims(&now, &soon))).is_ok());
        let last = MAX_TIMESTAMP.to_string();
        assert!(t.verify(&signed(&claims(&now, &last))).is_ok());
        let (two_63, max, past) = (
            (1u64 << 63).to_string(),
            u64::MAX.to_string(),
            (MAX_TIMESTAMP + 1).to_string(),
        );
        for (iat, exp) in [
            (now.as_str(), two_63.as_str()),
            (&now, &max),
            (&now, &past),
            (&two_63, &soon),
            (&max, &soon),
            // Not a u64 at all: negative, fractional, beyond u64.
            (&now, "-1"),
            (&now, "1e300"),
            (&now, "18446744073709551616"),
        ] {
            let token = signed(&claims(iat, exp));
            assert_eq!(t.verify(&token), Err(TokenError::Malformed), "{iat} {exp}");
        }
    }

    #[test]
    fn issuing_never_overflows() {
        let t = Tokens::new(KEY_A.parse().unwrap(), Duration::MAX, &Metrics::new());
        let err = t
            .issue("id", &Username::parse("alice").unwrap())
            .unwrap_err();
        assert!(err.to_string().contains("past year 9999"), "{err}");
        let t = Tokens::new(KEY_A.parse().unwrap(), MAX_TTL, &Metrics::new());
        let issued = t.issue("id", &Username::parse("alice").unwrap()).unwrap();
        assert!(t.verify(&issued.token).is_ok());
    }

    #[test]
    fn garbage_is_malformed() {
        let t = tokens(KEY_A);
        for bad in ["", "a.b", "a.b.c.d", "!.!.!", "e30.e30.AA"] {
            assert!(t.verify(bad).is_err(), "{bad:?}");
        }
    }
}
