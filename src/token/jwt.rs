//! The JWT itself (RFC 7519): the header and the claims authd writes, a token signed
//! with a key of the ring, and the checks that turn a presented token into what it
//! says ([`VerifiedToken`]) or into why it was refused ([`TokenError`]).
//!
//! The `kid` of a token picks the key and the key fixes the algorithm: a token whose
//! `alg` is not its key's is refused, so an Ed25519 public key can never be used as an
//! HMAC secret (the classic algorithm confusion). Only a correctly signed payload is
//! parsed further. Every time read from a token is checked: a `exp`, `iat` or `nbf`
//! past [`MAX_TIMESTAMP`] (year 9999) is malformed, never added to an instant where it
//! would overflow. This file neither counts outcomes nor holds keys (`Tokens`, `keys`).

use super::keys::{Algorithm, Key, KeyRing};
use crate::error::TokenError;
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use serde::{Deserialize, Serialize};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The `iss` claim of the tokens authd issues when no public issuer URL is
/// configured (`AUTHD_ISSUER`); always accepted, so tokens issued before one was
/// set, or by replicas of a release without it, stay valid.
pub const ISSUER: &str = "authd";
/// The latest `iat` or `exp` a token may carry: 9999-12-31T23:59:59Z, the end of
/// RFC 3339 time (and of `google.protobuf.Timestamp`). Anything later is malformed.
pub const MAX_TIMESTAMP: u64 = 253_402_300_799;

/// The `aud` claim: one audience or several (RFC 7519 allows both forms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub(super) enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    pub(super) fn of(audiences: &[String]) -> Option<Audience> {
        match audiences {
            [] => None,
            [one] => Some(Audience::One(one.clone())),
            many => Some(Audience::Many(many.to_vec())),
        }
    }

    fn contains(&self, audience: &str) -> bool {
        match self {
            Audience::One(one) => one == audience,
            Audience::Many(many) => many.iter().any(|a| a == audience),
        }
    }
}

#[derive(Serialize, Deserialize)]
pub(super) struct Header {
    pub(super) alg: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) typ: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) kid: Option<String>,
}

#[derive(Serialize, Deserialize)]
pub(super) struct Claims {
    pub(super) sub: String,
    pub(super) name: String,
    pub(super) iat: u64,
    pub(super) exp: u64,
    pub(super) iss: String,
    /// Not before; absent from tokens issued before authd wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) nbf: Option<u64>,
    /// Present when `AUTHD_TOKEN_AUDIENCE` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) aud: Option<Audience>,
    /// The session (absent from tokens issued before sessions existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) sid: Option<String>,
    /// Unique per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) jti: Option<String>,
    /// How the user signed in (RFC 8176): `["pwd"]`, `["pwd","otp"]`; absent from
    /// tokens issued before authd wrote it, which count as `["pwd"]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) amr: Option<Vec<String>>,
    /// The service account a token was issued to (client credentials) or the one
    /// that asked for it (token exchange): its name (RFC 9068 `client_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) client_id: Option<String>,
    /// The scopes granted, space-separated (RFC 9068 `scope`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) scope: Option<String>,
    /// The credential a service token was issued for: removing it refuses the token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) cred: Option<String>,
    /// The party acting for `sub` (RFC 8693 `act`), nested for a chain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) act: Option<Box<Actor>>,
}

/// An actor of RFC 8693: who acts for the subject, and who acted before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// The acting service account's id.
    pub sub: String,
    /// Its name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// The actor before it, in a chain of exchanges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub act: Option<Box<Actor>>,
}

impl Actor {
    /// How many actors the chain holds, this one included.
    pub fn depth(&self) -> usize {
        let mut depth = 1;
        let mut next = self.act.as_deref();
        while let Some(actor) = next {
            depth += 1;
            next = actor.act.as_deref();
        }
        depth
    }
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedToken {
    pub user_id: String,
    pub username: String,
    pub expires_at: SystemTime,
    /// The `sid` claim: the session the token belongs to.
    pub session_id: Option<String>,
    /// The `iat` claim (Unix seconds).
    pub issued_at: u64,
    /// The `amr` claim; `["pwd"]` for a token without one.
    pub amr: Vec<String>,
    /// The `aud` claim: the audiences the token is meant for (none without one).
    pub audience: Vec<String>,
    /// Whether the `iss` claim is the configured issuer URL (else it is [`ISSUER`]).
    pub issuer_url: bool,
    /// The `nbf` claim, when the token has one (Unix seconds).
    pub not_before: Option<u64>,
    /// The `jti` claim, when the token has one.
    pub token_id: Option<String>,
    /// The `client_id` claim: the service account's name, in a service token or an
    /// exchanged one.
    pub client_id: Option<String>,
    /// The `scope` claim, split.
    pub scopes: Vec<String>,
    /// The `cred` claim: the credential a service token was issued for.
    pub credential_id: Option<String>,
    /// The `act` claim: who acts for the subject.
    pub actor: Option<Actor>,
}

impl VerifiedToken {
    /// Whether the user signed in with a second factor (`amr` names `otp`).
    pub fn second_factor(&self) -> bool {
        self.amr.iter().any(|m| m == "otp")
    }
}

/// A token of `claims`, signed with `key` (whose kid and algorithm the header names).
pub(super) fn sign(key: &Key, claims: &Claims) -> serde_json::Result<String> {
    let header = Header {
        alg: key.algorithm().jose_name().into(),
        typ: Some("JWT".into()),
        kid: Some(key.kid.clone()),
    };
    let mut token = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header)?),
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims)?)
    );
    let signature = key.sign(token.as_bytes());
    token.push('.');
    token.push_str(&URL_SAFE_NO_PAD.encode(signature));
    Ok(token)
}

/// Checks a token against `ring` at `now` (Unix seconds), allowing `clock_skew` on
/// its times, and when `audience` is given that the token is meant for it (its
/// `aud` names it). Its `iss` is [`ISSUER`] or, when given, `issuer`.
pub(super) fn verify(
    ring: &KeyRing,
    token: &str,
    now: u64,
    clock_skew: Duration,
    audience: Option<&str>,
    issuer: Option<&str>,
) -> Result<VerifiedToken, TokenError> {
    let mut parts = token.split('.');
    let (Some(header_b64), Some(claims_b64), Some(signature_b64), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(TokenError::Malformed);
    };
    let header: Header = decode_json(header_b64)?;
    let alg = Algorithm::of_jose_name(&header.alg).ok_or(TokenError::UnsupportedAlgorithm)?;
    let key = header
        .kid
        .as_deref()
        .and_then(|kid| ring.find(kid))
        .ok_or(TokenError::UnknownKey)?;
    // The key fixes the algorithm, never the token: an `HS256` token under the kid
    // of an Ed25519 key (its public key as the HMAC secret) is refused here.
    if alg != key.algorithm() {
        return Err(TokenError::AlgorithmMismatch);
    }
    let signature = URL_SAFE_NO_PAD
        .decode(signature_b64)
        .map_err(|_| TokenError::Malformed)?;
    let signed_len = header_b64.len() + 1 + claims_b64.len();
    key.verify(&token.as_bytes()[..signed_len], &signature)?;
    // Only a correctly signed payload is parsed further.
    let claims: Claims = decode_json(claims_b64)?;
    if claims.iss != ISSUER && issuer != Some(claims.iss.as_str()) {
        return Err(TokenError::WrongIssuer);
    }
    // Signed by us or with our key, yet no token of ours says year 10000: refuse
    // before the value meets any time arithmetic.
    if claims.iat > MAX_TIMESTAMP || claims.nbf.is_some_and(|nbf| nbf > MAX_TIMESTAMP) {
        return Err(TokenError::Malformed);
    }
    let expires_at = unix_time(claims.exp).ok_or(TokenError::Malformed)?;
    let skew = clock_skew.as_secs();
    if claims.exp.saturating_add(skew) <= now {
        return Err(TokenError::Expired);
    }
    let latest_start = now.saturating_add(skew);
    if claims.iat > latest_start || claims.nbf.is_some_and(|nbf| nbf > latest_start) {
        return Err(TokenError::NotYetValid);
    }
    if let Some(wanted) = audience
        && !claims.aud.as_ref().is_some_and(|aud| aud.contains(wanted))
    {
        return Err(TokenError::WrongAudience);
    }
    Ok(VerifiedToken {
        user_id: claims.sub,
        username: claims.name,
        expires_at,
        session_id: claims.sid,
        issued_at: claims.iat,
        amr: claims.amr.unwrap_or_else(|| vec!["pwd".to_owned()]),
        audience: match claims.aud {
            None => Vec::new(),
            Some(Audience::One(one)) => vec![one],
            Some(Audience::Many(many)) => many,
        },
        issuer_url: claims.iss != ISSUER,
        not_before: claims.nbf,
        token_id: claims.jti,
        client_id: claims.client_id,
        scopes: (claims.scope.as_deref())
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default(),
        credential_id: claims.cred,
        actor: claims.act.map(|a| *a),
    })
}

pub(super) fn decode_json<T: for<'de> Deserialize<'de>>(part: &str) -> Result<T, TokenError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| TokenError::Malformed)?;
    serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed)
}

/// `secs` after the Unix epoch, when that is at most [`MAX_TIMESTAMP`].
pub(super) fn unix_time(secs: u64) -> Option<SystemTime> {
    if secs > MAX_TIMESTAMP {
        return None;
    }
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

#[cfg(test)]
pub(super) fn unix_now() -> u64 {
    use crate::clock::{Clock as _, SystemClock};
    SystemClock.unix_secs()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        credentials::Username,
        metrics::Metrics,
        token::{
            Tokens,
            keys::{Material, mac},
            tests::{KEY_A, ed25519_entry, signed, tokens},
        },
    };
    use hmac::Mac as _;

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
    fn the_key_fixes_the_algorithm() {
        let ring: KeyRing = format!("{},{KEY_A}", ed25519_entry("ed")).parse().unwrap();
        let t = Tokens::new(ring.clone(), Duration::from_secs(60), &Metrics::new());
        let public = match &ring.find("ed").unwrap().material {
            Material::Ed25519 { public, .. } => public.to_bytes(),
            Material::Hmac(_) => unreachable!(),
        };
        let claims = format!(
            r#"{{"sub":"id","name":"mallory","iat":{now},"exp":{exp},"iss":"{ISSUER}"}}"#,
            now = unix_now(),
            exp = unix_now() + 60
        );
        let forge = |alg: &str, kid: &str, secret: &[u8]| {
            let header = URL_SAFE_NO_PAD.encode(format!(r#"{{"alg":"{alg}","kid":"{kid}"}}"#));
            let input = format!("{header}.{}", URL_SAFE_NO_PAD.encode(&claims));
            let sig = mac(secret, input.as_bytes()).finalize().into_bytes();
            format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig))
        };
        let x = URL_SAFE_NO_PAD.encode(public);
        // HS256 under the Ed25519 key's kid, the public key (raw, or its JWK text) as secret.
        for secret in [&public[..], x.as_bytes()] {
            assert_eq!(
                t.verify(&forge("HS256", "ed", secret)),
                Err(TokenError::AlgorithmMismatch)
            );
        }
        // EdDSA claimed under the HMAC key's kid.
        assert_eq!(
            t.verify(&forge("EdDSA", "a", b"whatever")),
            Err(TokenError::AlgorithmMismatch)
        );
        // An EdDSA token signed by another Ed25519 key under the same kid.
        let other = tokens(&ed25519_entry("ed"));
        let foreign = other
            .issue("id", &Username::parse("mallory").unwrap())
            .unwrap();
        assert_eq!(t.verify(&foreign.token), Err(TokenError::BadSignature));
    }

    #[test]
    fn garbage_is_malformed() {
        let t = tokens(KEY_A);
        for bad in ["", "a.b", "a.b.c.d", "!.!.!", "e30.e30.AA"] {
            assert!(t.verify(bad).is_err(), "{bad:?}");
        }
    }
}
