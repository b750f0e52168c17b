//! Stateless access tokens: JWT (RFC 7519) signed with HMAC-SHA256 (`HS256`) or
//! Ed25519 (`EdDSA`, RFC 8037). [`Tokens`] is what the rest of authd uses: it issues
//! and verifies tokens with the ring in use, and counts every outcome.
//!
//! A [`KeyRing`] holds named keys (`kid`), each of one algorithm; the first signs, all
//! verify, so keys can be rotated without downtime: add the new key second, roll it
//! out, move it first, and drop the old one once its tokens have expired. The `kid`
//! of a token picks the key and the key fixes the algorithm: a token whose `alg` is
//! not its key's is refused, so an Ed25519 public key can never be used as an HMAC
//! secret (the classic algorithm confusion). HMAC verification is constant-time
//! (`Mac::verify_slice`); Ed25519 uses `verify_strict`. Keys never appear in `Debug`,
//! in an error or in a log; only the public halves of Ed25519 keys leave this module,
//! as a JWKS document (RFC 7517, [`KeyRing::jwks`]).
//!
//! The ring in use is a [`LiveKeyRing`]: the key file can be re-read while serving
//! (`keyfile`), and every token is issued or verified with the ring of that moment.
//!
//! Every time computed from a token is checked: a validly signed token whose `exp`,
//! `iat` or `nbf` lies past [`MAX_TIMESTAMP`] (year 9999) is refused as malformed,
//! never added to an instant where it would overflow. `nbf` and `iat` may lie in the
//! future, and `exp` in the past, by at most the clock skew allowed. Why a token was
//! refused is told to the metrics and the log, never to the client (see `handlers::grpc`).
//!
//! # Layout
//!
//! - `keys`: keys, the key ring (parsing, `Debug` without secrets, signing and
//!   checking signatures), new key entries, and the live ring.
//! - `jwt`: the header and claims, a token signed, and a token checked.
//! - `jwks`: the JWKS document of a ring and `GET /.well-known/jwks.json`.
//! - `keyfile`: the key file, re-read while serving; a bad file keeps the ring.
//! - this file: [`Tokens`] (issue, verify, count) and the limits config and requests
//!   are checked against.

mod jwks;
mod jwt;
pub(crate) mod keyfile;
mod keys;

pub use crate::error::TokenError;
pub use jwks::Jwks;
pub(crate) use jwks::{MAX_AGE as JWKS_MAX_AGE, PATH as JWKS_PATH};
pub use jwt::{Actor, ISSUER, VerifiedToken};
pub use keys::{Algorithm, KeyRing, LiveKeyRing, generate_key_entry};

use crate::{
    clock::{Clock, SystemClock},
    credentials::Username,
    metrics::Metrics,
};
use jwt::{Audience, Claims, unix_time};
use prometheus::IntCounter;
use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

/// The longest lifetime a token may be issued with (`AUTHD_TOKEN_TTL`). A service
/// that verifies tokens itself cannot see their sessions end: past a week, a stolen
/// token outlives any reasonable response to the theft there.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The clock skew allowed by default between the issuer's clock and a verifier's.
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(30);
/// The most clock skew that may be allowed (`AUTHD_TOKEN_CLOCK_SKEW`).
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);
/// The longest audience a token may name or a request may ask for.
pub const MAX_AUDIENCE_BYTES: usize = 256;

/// The audience a request asks a token to be checked for (ValidateToken's
/// `audience`): `None` when empty (any audience), or what is wrong with it, in words
/// safe to show the caller.
pub(crate) fn requested_audience(requested: &str) -> Result<Option<&str>, String> {
    match requested {
        "" => Ok(None),
        a if a.len() > MAX_AUDIENCE_BYTES => {
            Err(format!("must be at most {MAX_AUDIENCE_BYTES} bytes"))
        }
        a => Ok(Some(a)),
    }
}

/// `GET /.well-known/jwks.json` for the ring in use, merged into the HTTP port's router.
pub(crate) fn jwks_router(ring: LiveKeyRing) -> axum::Router {
    jwks::router(move || ring.current().jwks().clone())
}

/// What the `name` claim of a service token starts with (the account's name
/// follows).
pub const SERVICE_NAME_PREFIX: &str = "service:";

/// What a service token is issued with.
pub struct ServiceGrant<'a> {
    pub account_id: &'a str,
    pub client_id: &'a str,
    pub audiences: &'a [String],
    pub scopes: &'a [String],
    pub credential_id: Option<&'a str>,
    /// When the credential was checked (Unix seconds): the token's `iat`.
    pub verified_at: u64,
    pub ttl: Duration,
}

/// A token just issued.
#[derive(Debug, Clone)]
pub struct IssuedToken {
    pub token: String,
    pub expires_at: SystemTime,
}

/// Issues and verifies tokens with a key ring and a lifetime.
pub struct Tokens {
    keys: LiveKeyRing,
    ttl: Duration,
    /// The `aud` of every token issued (`AUTHD_TOKEN_AUDIENCE`).
    audience: Option<Audience>,
    /// How far `nbf` and `iat` may lie ahead of this clock, and `exp` behind it.
    clock_skew: Duration,
    /// The time of `iat`, `nbf` and `exp`, and of their checks.
    clock: Arc<dyn Clock>,
    /// The `iss` of every token issued (`AUTHD_ISSUER`), also accepted beside
    /// [`ISSUER`]; `None`: [`ISSUER`].
    issuer: Option<Arc<str>>,
    issued: IntCounter,
    valid: IntCounter,
    /// Refusals, indexed by [`TokenError::index`].
    refused: [IntCounter; TokenError::ALL.len()],
}

impl Tokens {
    pub fn new(keys: KeyRing, ttl: Duration, metrics: &Metrics) -> Self {
        let validated = &metrics.tokens.validated;
        Self {
            keys: LiveKeyRing::new(keys, metrics.tokens.signing_key.clone()),
            ttl,
            audience: None,
            clock_skew: DEFAULT_CLOCK_SKEW,
            clock: Arc::new(SystemClock),
            issuer: None,
            issued: metrics.tokens.issued.clone(),
            valid: validated.with_label_values(&["ok"]),
            refused: TokenError::ALL.map(|e| validated.with_label_values(&[e.label()])),
        }
    }

    /// Puts `aud` in every token: one audience as a string, several as an array.
    pub fn with_audience(mut self, audiences: &[String]) -> Self {
        self.audience = Audience::of(audiences);
        self
    }

    /// Issues tokens whose `iss` is `issuer` (the public issuer URL), and accepts
    /// them beside those whose `iss` is [`ISSUER`].
    pub fn with_issuer(mut self, issuer: Option<&str>) -> Self {
        self.issuer = issuer.map(Arc::from);
        self
    }

    /// The `iss` of the tokens issued.
    pub fn issuer(&self) -> &str {
        self.issuer.as_deref().unwrap_or(ISSUER)
    }

    /// The clock skew allowed when checking `nbf`, `iat` and `exp`.
    pub fn with_clock_skew(mut self, skew: Duration) -> Self {
        self.clock_skew = skew;
        self
    }

    /// The clock tokens are issued and checked by (the machine's unless told).
    pub(crate) fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The clock tokens are issued and checked by.
    pub(crate) fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// The ring in use, shared: for the JWKS document and the key file reload.
    pub fn key_ring(&self) -> &LiveKeyRing {
        &self.keys
    }

    #[cfg(test)]
    pub fn issue(&self, user_id: &str, username: &Username) -> anyhow::Result<IssuedToken> {
        self.issue_with(user_id, username, None, None, "pwd")
    }

    /// A token of session `sid` (with a fresh `jti`) that expires at the token
    /// lifetime or at `not_after` (the session's end), whichever comes first; `amr`
    /// is how the user signed in (space-separated RFC 8176 values, as the session
    /// stores them).
    pub fn issue_in_session(
        &self,
        user_id: &str,
        username: &Username,
        sid: &str,
        not_after: SystemTime,
        amr: &str,
    ) -> anyhow::Result<IssuedToken> {
        let end = not_after
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.issue_with(user_id, username, Some(sid), Some(end), amr)
    }

    fn issue_with(
        &self,
        user_id: &str,
        username: &Username,
        sid: Option<&str>,
        not_after: Option<u64>,
        amr: &str,
    ) -> anyhow::Result<IssuedToken> {
        let mut span = crate::otel::child("token.sign");
        let now = self.clock.unix_secs();
        let mut exp = now.saturating_add(self.ttl.as_secs().max(1));
        if let Some(end) = not_after {
            exp = exp.min(end.max(now + 1));
        }
        // Unreachable with a TTL of at most `MAX_TTL` and a sane clock; refused
        // rather than issued as a token that this server would call malformed.
        let expires_at = unix_time(exp).ok_or_else(|| {
            anyhow::anyhow!("a token lifetime of {:?} ends past year 9999", self.ttl)
        })?;
        let ring = self.keys.current();
        let key = ring.signer();
        span.set("token.alg", key.algorithm().jose_name());
        let claims = Claims {
            sub: user_id.to_owned(),
            name: username.as_str().to_owned(),
            iat: now,
            exp,
            iss: self.issuer().into(),
            nbf: Some(now),
            aud: self.audience.clone(),
            sid: sid.map(str::to_owned),
            jti: sid.map(|_| uuid::Uuid::now_v7().simple().to_string()),
            amr: Some(amr.split_whitespace().map(str::to_owned).collect()),
            client_id: None,
            scope: None,
            cred: None,
            act: None,
        };
        let token = jwt::sign(key, &claims)?;
        self.issued.inc();
        Ok(IssuedToken { token, expires_at })
    }

    /// A token of a service account (client credentials, docs/service-accounts.md):
    /// `sub` its id, `client_id` its name, the audiences and scopes granted, the
    /// credential it proved itself with, no session. Its `iat` is `grant.verified_at`,
    /// when the credential was checked against the store, so a change made after
    /// that check (a disable, a credential removed) refuses it.
    pub fn issue_service(&self, grant: &ServiceGrant<'_>) -> anyhow::Result<IssuedToken> {
        // Issued when the account was read (a change after that refuses it), living
        // its whole lifetime from now.
        let now = grant.verified_at;
        let exp = (self.clock.unix_secs().max(now)).saturating_add(grant.ttl.as_secs().max(1));
        let expires_at = unix_time(exp)
            .ok_or_else(|| anyhow::anyhow!("a service token's lifetime ends past year 9999"))?;
        let claims = Claims {
            sub: grant.account_id.to_owned(),
            // Never a username (':' is no username character): a release that knows
            // no service tokens names no user with it.
            name: format!("{SERVICE_NAME_PREFIX}{}", grant.client_id),
            iat: now,
            exp,
            iss: self.issuer().into(),
            nbf: Some(now),
            aud: Audience::of(grant.audiences),
            sid: None,
            jti: Some(uuid::Uuid::now_v7().simple().to_string()),
            amr: None,
            client_id: Some(grant.client_id.to_owned()),
            scope: (!grant.scopes.is_empty()).then(|| grant.scopes.join(" ")),
            cred: grant.credential_id.map(str::to_owned),
            act: None,
        };
        let token = jwt::sign(self.keys.current().signer(), &claims)?;
        self.issued.inc();
        Ok(IssuedToken { token, expires_at })
    }

    /// A token exchanged for `source` (RFC 8693): the same subject, session and
    /// `amr`, for one audience, with `actor` acting (the source's actors after it);
    /// it never outlives the source.
    pub fn issue_exchanged(
        &self,
        source: &VerifiedToken,
        actor: Actor,
        audience: &str,
        scopes: &[String],
        ttl: Duration,
    ) -> anyhow::Result<IssuedToken> {
        let now = self.clock.unix_secs();
        let source_exp = source
            .expires_at
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let exp = now.saturating_add(ttl.as_secs().max(1)).min(source_exp);
        let expires_at = unix_time(exp)
            .ok_or_else(|| anyhow::anyhow!("an exchanged token's lifetime ends past year 9999"))?;
        let claims = Claims {
            sub: source.user_id.clone(),
            name: source.username.clone(),
            iat: now,
            exp,
            iss: self.issuer().into(),
            nbf: Some(now),
            aud: Some(Audience::One(audience.to_owned())),
            sid: source.session_id.clone(),
            jti: Some(uuid::Uuid::now_v7().simple().to_string()),
            amr: Some(source.amr.clone()),
            client_id: actor.client_id.clone(),
            scope: (!scopes.is_empty()).then(|| scopes.join(" ")),
            cred: None,
            act: Some(Box::new(actor)),
        };
        let token = jwt::sign(self.keys.current().signer(), &claims)?;
        self.issued.inc();
        Ok(IssuedToken { token, expires_at })
    }

    /// Checks a token and counts the outcome.
    #[cfg(test)]
    pub fn verify(&self, token: &str) -> Result<VerifiedToken, TokenError> {
        self.verify_for(token, None)
    }

    /// Checks a token, and when `audience` is given that the token is meant for it
    /// (its `aud` names it); counts the outcome.
    #[cfg(test)]
    pub fn verify_for(
        &self,
        token: &str,
        audience: Option<&str>,
    ) -> Result<VerifiedToken, TokenError> {
        self.verify_unless(token, audience, |_| false)
    }

    /// Like [`Tokens::verify_for`], and refuses as [`TokenError::Revoked`] a token
    /// that is otherwise valid when `revoked` says so of it; counts the outcome.
    pub fn verify_unless(
        &self,
        token: &str,
        audience: Option<&str>,
        revoked: impl FnOnce(&VerifiedToken) -> bool,
    ) -> Result<VerifiedToken, TokenError> {
        let mut span = crate::otel::child("token.verify");
        let result = self.check(token, audience).and_then(|v| {
            if revoked(&v) {
                Err(TokenError::Revoked)
            } else {
                Ok(v)
            }
        });
        match &result {
            Ok(_) => self.valid.inc(),
            Err(e) => {
                self.refused[e.index()].inc();
                span.set("token.refused", e.label());
            }
        }
        result
    }

    /// Checks a token without counting it (Logout reads the session it names).
    pub(crate) fn check(
        &self,
        token: &str,
        audience: Option<&str>,
    ) -> Result<VerifiedToken, TokenError> {
        let now = self.clock.unix_secs();
        jwt::verify(
            &self.keys.current(),
            token,
            now,
            self.clock_skew,
            audience,
            self.issuer.as_deref(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
    use jwt::{Claims, Header, decode_json, unix_now};

    /// An HMAC key entry (kid `a`), for the tests of every file of `token`.
    pub(super) const KEY_A: &str = "a:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

    pub(super) fn tokens(spec: &str) -> Tokens {
        Tokens::new(
            spec.parse().unwrap(),
            Duration::from_secs(60),
            &Metrics::new(),
        )
    }

    #[test]
    fn session_tokens_carry_sid_and_a_unique_jti_and_end_with_their_session() {
        let t = tokens(KEY_A);
        let alice = Username::parse("alice").unwrap();
        let far = t.clock.system_time() + Duration::from_secs(3600);
        let a = t
            .issue_in_session("id", &alice, "sid-1", far, "pwd otp")
            .unwrap();
        let b = t
            .issue_in_session("id", &alice, "sid-1", far, "pwd otp")
            .unwrap();
        let v = t.verify(&a.token).unwrap();
        assert_eq!(v.session_id.as_deref(), Some("sid-1"));
        assert_eq!(v.amr, ["pwd", "otp"]);
        assert!(v.second_factor());
        let claims =
            |token: &str| -> Claims { decode_json(token.split('.').nth(1).unwrap()).unwrap() };
        let (ca, cb) = (claims(&a.token), claims(&b.token));
        assert!(ca.jti.is_some());
        assert_ne!(ca.jti, cb.jti);
        // A session that ends in 10 s caps its tokens' lifetime (60 s here).
        let soon = t.clock.system_time() + Duration::from_secs(10);
        let capped = t
            .issue_in_session("id", &alice, "sid-1", soon, "pwd")
            .unwrap();
        assert!(capped.expires_at <= soon);
        assert!(!t.verify(&capped.token).unwrap().second_factor());
        // Refused when the caller says its session ended, and counted as revoked.
        assert_eq!(
            t.verify_unless(&a.token, None, |v| v.session_id.as_deref() == Some("sid-1")),
            Err(TokenError::Revoked)
        );
        // Tokens without a session have neither claim.
        let plain = claims(&t.issue("id", &alice).unwrap().token);
        assert!(plain.sid.is_none() && plain.jti.is_none());
    }

    #[test]
    fn a_requested_audience_is_checked_at_the_edge() {
        assert_eq!(requested_audience(""), Ok(None));
        assert_eq!(requested_audience("orders"), Ok(Some("orders")));
        let longest = "a".repeat(MAX_AUDIENCE_BYTES);
        assert_eq!(requested_audience(&longest), Ok(Some(longest.as_str())));
        assert_eq!(
            requested_audience(&format!("{longest}a")),
            Err(format!("must be at most {MAX_AUDIENCE_BYTES} bytes"))
        );
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

    /// A token with these claims (JSON text), correctly signed with `KEY_A`.
    pub(super) fn signed(claims: &str) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT","kid":"a"}"#);
        let payload = URL_SAFE_NO_PAD.encode(claims);
        let key: KeyRing = KEY_A.parse().unwrap();
        let signing_input = format!("{header}.{payload}");
        let signature = key.signer().sign(signing_input.as_bytes());
        format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature))
    }

    #[test]
    fn a_configured_issuer_signs_and_the_old_one_still_verifies() {
        let old = tokens(KEY_A);
        let alice = Username::parse("alice").unwrap();
        let before = old.issue("id", &alice).unwrap();
        let t = tokens(KEY_A).with_issuer(Some("https://auth.example.com"));
        let issued = t.issue("id", &alice).unwrap();
        let claims: Claims = decode_json(issued.token.split('.').nth(1).unwrap()).unwrap();
        assert_eq!(claims.iss, "https://auth.example.com");
        assert!(t.verify(&issued.token).unwrap().issuer_url);
        assert!(!t.verify(&before.token).unwrap().issuer_url);
        // A verifier without the setting refuses the new issuer: set it only once
        // every replica has it.
        assert_eq!(old.verify(&issued.token), Err(TokenError::WrongIssuer));
        let other = tokens(KEY_A).with_issuer(Some("https://other.example.com"));
        assert_eq!(other.verify(&issued.token), Err(TokenError::WrongIssuer));
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

    pub(super) fn ed25519_entry(kid: &str) -> String {
        generate_key_entry(Algorithm::EdDsa, kid).unwrap()
    }

    #[test]
    fn ed25519_tokens_are_eddsa_and_verify() {
        let spec = format!("{},{KEY_A}", ed25519_entry("ed"));
        let t = tokens(&spec);
        let issued = t.issue("id-1", &Username::parse("Alice").unwrap()).unwrap();
        let header: Header = decode_json(issued.token.split('.').next().unwrap()).unwrap();
        assert_eq!(header.alg, "EdDSA");
        assert_eq!(header.kid.as_deref(), Some("ed"));
        assert_eq!(t.verify(&issued.token).unwrap().username, "alice");
        let claims: Claims = decode_json(issued.token.split('.').nth(1).unwrap()).unwrap();
        assert_eq!(claims.nbf, Some(claims.iat));
        assert_eq!(claims.aud, None);
    }

    #[test]
    fn tokens_are_issued_and_expire_by_the_clock() {
        let clock = Arc::new(crate::clock::ManualClock::new());
        let t = tokens(KEY_A)
            .with_clock(clock.clone())
            .with_clock_skew(Duration::from_secs(5));
        let issued = t.issue("id", &Username::parse("alice").unwrap()).unwrap();
        let claims: Claims = decode_json(issued.token.split('.').nth(1).unwrap()).unwrap();
        assert_eq!(claims.iat, clock.unix_millis() / 1000);
        assert_eq!(claims.exp, claims.iat + 60);
        assert_eq!(
            issued.expires_at,
            UNIX_EPOCH + Duration::from_secs(claims.exp)
        );
        // Valid until `exp` plus the skew, by the clock's time alone.
        clock.advance(Duration::from_secs(64));
        assert!(t.verify(&issued.token).is_ok());
        clock.advance(Duration::from_secs(1));
        assert_eq!(t.verify(&issued.token), Err(TokenError::Expired));
    }

    #[test]
    fn audiences_and_the_clock_skew() {
        let metrics = Metrics::new();
        let t = Tokens::new(KEY_A.parse().unwrap(), Duration::from_secs(60), &metrics)
            .with_audience(&["orders".to_owned()])
            .with_clock_skew(Duration::from_secs(30));
        let issued = t.issue("id", &Username::parse("alice").unwrap()).unwrap();
        assert!(t.verify_for(&issued.token, Some("orders")).is_ok());
        assert!(t.verify_for(&issued.token, None).is_ok());
        assert_eq!(
            t.verify_for(&issued.token, Some("billing")),
            Err(TokenError::WrongAudience)
        );
        let now = unix_now();
        let token = |extra: &str, iat: u64, exp: u64| {
            signed(&format!(
                r#"{{"sub":"id","name":"alice","iat":{iat},"exp":{exp},"iss":"{ISSUER}"{extra}}}"#
            ))
        };
        let many = token(r#","aud":["a","orders"]"#, now, now + 60);
        assert!(t.verify_for(&many, Some("orders")).is_ok());
        assert_eq!(
            t.verify_for(&token("", now, now + 60), Some("orders")),
            Err(TokenError::WrongAudience)
        );
        let nbf = |at: u64| token(&format!(r#","nbf":{at}"#), now, now + 600);
        assert!(t.verify(&nbf(now + 10)).is_ok());
        assert_eq!(t.verify(&nbf(now + 600)), Err(TokenError::NotYetValid));
        assert!(t.verify(&token("", now + 10, now + 600)).is_ok());
        assert_eq!(
            t.verify(&token("", now + 600, now + 900)),
            Err(TokenError::NotYetValid)
        );
        assert!(t.verify(&token("", now - 600, now - 10)).is_ok());
        assert_eq!(
            t.verify(&token("", now - 600, now - 60)),
            Err(TokenError::Expired)
        );
        assert_eq!(
            t.verify(&nbf(jwt::MAX_TIMESTAMP + 1)),
            Err(TokenError::Malformed)
        );
        let strict = tokens(KEY_A).with_clock_skew(Duration::ZERO);
        assert_eq!(strict.verify(&nbf(now + 10)), Err(TokenError::NotYetValid));
        let text = metrics.render();
        for line in [
            r#"authd_tokens_validated_total{outcome="wrong_audience"} 2"#,
            r#"authd_tokens_validated_total{outcome="not_yet_valid"} 2"#,
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
    }
}
