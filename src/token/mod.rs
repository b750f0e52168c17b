//! Stateless access tokens: JWT (RFC 7519) signed with HMAC-SHA256 (`HS256`) or
//! Ed25519 (`EdDSA`, RFC 8037).
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
//! refused is told to the metrics and the log, never to the client (see `grpc`).

pub(crate) mod jwks;
pub(crate) mod keyfile;

pub use crate::error::TokenError;
use crate::{credentials::Username, metrics::Metrics};
use base64::{
    Engine as _,
    engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD},
};
use ed25519_dalek::{
    Signer as _, SigningKey, VerifyingKey,
    pkcs8::{DecodePrivateKey as _, EncodePrivateKey as _},
};
use hmac::{Hmac, KeyInit, Mac};
use prometheus::{IntCounter, IntGaugeVec};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};
use std::{
    fmt,
    str::FromStr,
    sync::{Arc, RwLock},
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

/// A signing algorithm of authd's tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// HMAC-SHA256 with a shared secret: whoever can verify can also sign.
    Hs256,
    /// Ed25519 (RFC 8037): verifiers need only the public key, published as a JWKS.
    EdDsa,
}

impl Algorithm {
    /// The JOSE `alg` name.
    pub fn jose_name(self) -> &'static str {
        match self {
            Algorithm::Hs256 => "HS256",
            Algorithm::EdDsa => "EdDSA",
        }
    }

    /// The name in a key entry (`KID:hs256:…`, `KID:ed25519:…`).
    pub fn entry_name(self) -> &'static str {
        match self {
            Algorithm::Hs256 => "hs256",
            Algorithm::EdDsa => "ed25519",
        }
    }

    fn of_jose_name(name: &str) -> Option<Algorithm> {
        match name {
            "HS256" => Some(Algorithm::Hs256),
            "EdDSA" => Some(Algorithm::EdDsa),
            _ => None,
        }
    }
}

/// The secret of a key; never printed.
enum Material {
    Hmac(Vec<u8>),
    /// The signing key (it zeroizes itself when dropped) and its public half.
    Ed25519 {
        signing: Box<SigningKey>,
        public: VerifyingKey,
    },
}

struct Key {
    kid: String,
    material: Material,
}

impl Key {
    fn algorithm(&self) -> Algorithm {
        match self.material {
            Material::Hmac(_) => Algorithm::Hs256,
            Material::Ed25519 { .. } => Algorithm::EdDsa,
        }
    }

    fn sign(&self, input: &[u8]) -> Vec<u8> {
        match &self.material {
            Material::Hmac(secret) => mac(secret, input).finalize().into_bytes().to_vec(),
            Material::Ed25519 { signing, .. } => signing.sign(input).to_bytes().to_vec(),
        }
    }

    fn verify(&self, input: &[u8], signature: &[u8]) -> Result<(), TokenError> {
        match &self.material {
            Material::Hmac(secret) => mac(secret, input)
                .verify_slice(signature)
                .map_err(|_| TokenError::BadSignature),
            Material::Ed25519 { public, .. } => {
                let signature = ed25519_dalek::Signature::from_slice(signature)
                    .map_err(|_| TokenError::BadSignature)?;
                public
                    .verify_strict(input, &signature)
                    .map_err(|_| TokenError::BadSignature)
            }
        }
    }
}

/// The public document of a ring: its Ed25519 keys as a JWK Set (RFC 7517), and an
/// entity tag that changes whenever the document does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Jwks {
    /// The JSON text: `{"keys":[{"kty":"OKP","crv":"Ed25519",…}]}`.
    pub json: Arc<str>,
    /// A strong HTTP entity tag of `json`, quoted: `"…"`.
    pub etag: Arc<str>,
    /// The keys, one per Ed25519 key of the ring, in ring order.
    pub keys: Arc<[PublicJwk]>,
}

/// One public key of the JWKS document (RFC 8037: `kty` OKP, `crv` Ed25519).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PublicJwk {
    pub kty: &'static str,
    pub crv: &'static str,
    pub kid: String,
    pub alg: &'static str,
    #[serde(rename = "use")]
    pub use_: &'static str,
    /// The public key, base64url without padding.
    pub x: String,
}

impl Jwks {
    fn of(keys: &[Key]) -> Self {
        let keys: Vec<PublicJwk> = keys
            .iter()
            .filter_map(|key| match &key.material {
                Material::Ed25519 { public, .. } => Some(PublicJwk {
                    kty: "OKP",
                    crv: "Ed25519",
                    kid: key.kid.clone(),
                    alg: Algorithm::EdDsa.jose_name(),
                    use_: "sig",
                    x: URL_SAFE_NO_PAD.encode(public.as_bytes()),
                }),
                // Never published: an HMAC key that verifies also signs.
                Material::Hmac(_) => None,
            })
            .collect();
        #[derive(Serialize)]
        struct Document<'a> {
            keys: &'a [PublicJwk],
        }
        let json =
            serde_json::to_string(&Document { keys: &keys }).expect("a JWK Set always serializes");
        let digest = Sha256::digest(json.as_bytes());
        let etag = format!("\"{}\"", URL_SAFE_NO_PAD.encode(&digest[..18]));
        Self {
            json: Arc::from(json),
            etag: Arc::from(etag),
            keys: Arc::from(keys),
        }
    }
}

/// Named keys: the first signs, every one verifies.
#[derive(Clone)]
pub struct KeyRing {
    keys: Arc<[Key]>,
    jwks: Jwks,
}

impl KeyRing {
    fn new(keys: Vec<Key>) -> Self {
        let jwks = Jwks::of(&keys);
        Self {
            keys: Arc::from(keys),
            jwks,
        }
    }

    /// A single random key, for a server started without configured keys.
    pub fn random() -> Self {
        let mut secret = vec![0u8; 32];
        rand::fill(secret.as_mut_slice());
        let kid = format!("ephemeral-{:08x}", rand::random::<u32>());
        Self::new(vec![Key {
            kid,
            material: Material::Hmac(secret),
        }])
    }

    /// Parses a key file: one entry per line (or several, comma-separated), blank
    /// lines and `#` comments ignored.
    pub fn from_file_text(text: &str) -> Result<Self, String> {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join(",")
            .parse()
    }

    pub fn kids(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().map(|k| k.kid.as_str())
    }

    /// The kid of the key that signs.
    pub fn signing_kid(&self) -> &str {
        &self.signer().kid
    }

    /// The algorithm of the key that signs.
    pub fn signing_algorithm(&self) -> Algorithm {
        self.signer().algorithm()
    }

    /// The public Ed25519 keys as a JWK Set; empty (`{"keys":[]}`) for an HMAC-only ring.
    pub fn jwks(&self) -> &Jwks {
        &self.jwks
    }

    /// A 32-byte key for another purpose (`label`), derived from the signing key:
    /// the same on every replica that shares the ring, and unrelated to the key itself.
    pub fn derive_key(&self, label: &str) -> [u8; 32] {
        let secret = match &self.signer().material {
            Material::Hmac(secret) => secret.clone(),
            Material::Ed25519 { signing, .. } => signing.to_bytes().to_vec(),
        };
        mac(&secret, label.as_bytes())
            .finalize()
            .into_bytes()
            .into()
    }

    fn signer(&self) -> &Key {
        // A ring is never empty: `from_str` refuses an empty list.
        &self.keys[0]
    }

    fn find(&self, kid: &str) -> Option<&Key> {
        self.keys.iter().find(|k| k.kid == kid)
    }
}

/// Decodes standard or URL-safe base64, padded or not.
fn decode_base64(encoded: &str) -> Option<Vec<u8>> {
    [STANDARD, URL_SAFE, STANDARD_NO_PAD, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(encoded).ok())
}

impl FromStr for KeyRing {
    type Err = String;

    /// Parses `KID:BASE64KEY,…`: an HMAC key (standard or URL-safe base64), or with
    /// the algorithm named, `KID:hs256:BASE64KEY` and `KID:ed25519:BASE64-PKCS8-DER`
    /// (an Ed25519 private key in PKCS#8 DER, as `authd keygen` prints it and
    /// `openssl genpkey -algorithm ed25519 -outform DER | base64 -w0` makes it).
    /// Errors name a key by its kid or position, never quote what it holds.
    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let mut keys: Vec<Key> = Vec::new();
        for (i, entry) in spec.split(',').map(str::trim).enumerate() {
            if entry.is_empty() {
                continue;
            }
            let n = i + 1;
            let (kid, rest) = entry.split_once(':').ok_or_else(|| {
                format!(
                    "key #{n} is not of the form KID:BASE64KEY or KID:ALG:KEY (ALG hs256 or \
                     ed25519)"
                )
            })?;
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
            // Base64 has no `:`, so a second one names the algorithm.
            let (algorithm, encoded) = match rest.split_once(':') {
                None => (Algorithm::Hs256, rest),
                Some((alg, encoded)) => match alg.trim().to_ascii_lowercase().as_str() {
                    "hs256" => (Algorithm::Hs256, encoded),
                    "ed25519" => (Algorithm::EdDsa, encoded),
                    _ => {
                        return Err(format!(
                            "key {kid:?}: unknown algorithm (expected hs256 or ed25519)"
                        ));
                    }
                },
            };
            let bytes = decode_base64(encoded.trim())
                .ok_or_else(|| format!("key {kid:?} is not valid base64"))?;
            let material = match algorithm {
                Algorithm::Hs256 => {
                    if bytes.len() < MIN_KEY_BYTES {
                        return Err(format!(
                            "key {kid:?} is {} bytes long; keys must be at least {MIN_KEY_BYTES} bytes",
                            bytes.len()
                        ));
                    }
                    Material::Hmac(bytes)
                }
                Algorithm::EdDsa => {
                    // The decoder's error is not quoted: nothing of the key may show.
                    let signing = SigningKey::from_pkcs8_der(&bytes).map_err(|_| {
                        format!(
                            "key {kid:?} is not an Ed25519 private key in PKCS#8 DER (make one \
                             with `authd keygen --alg ed25519`)"
                        )
                    })?;
                    let public = signing.verifying_key();
                    Material::Ed25519 {
                        signing: Box::new(signing),
                        public,
                    }
                }
            };
            if keys.iter().any(|k| k.kid == kid) {
                return Err(format!("kid {kid:?} appears twice"));
            }
            keys.push(Key {
                kid: kid.to_owned(),
                material,
            });
        }
        if keys.is_empty() {
            return Err("no keys given (expected KID:BASE64KEY,…)".into());
        }
        Ok(Self::new(keys))
    }
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kids: Vec<String> = self
            .keys
            .iter()
            .map(|k| format!("{}:{}", k.kid, k.algorithm().entry_name()))
            .collect();
        f.debug_struct("KeyRing")
            .field("kids", &kids)
            .field("secrets", &"<redacted>")
            .finish()
    }
}

/// A new key entry in the syntax [`KeyRing`] parses (`KID:ALG:BASE64`), from the
/// operating system's random source: what `authd keygen` prints.
pub fn generate_key_entry(algorithm: Algorithm, kid: &str) -> anyhow::Result<String> {
    let mut seed = [0u8; 32];
    rand::fill(&mut seed);
    let encoded = match algorithm {
        Algorithm::Hs256 => STANDARD.encode(seed),
        Algorithm::EdDsa => {
            let signing = SigningKey::from_bytes(&seed);
            let der = signing
                .to_pkcs8_der()
                .map_err(|_| anyhow::anyhow!("encoding the new key as PKCS#8 failed"))?;
            STANDARD.encode(der.as_bytes())
        }
    };
    let entry = format!("{kid}:{}:{encoded}", algorithm.entry_name());
    // The entry must be one that authd accepts: check it the way the server will.
    entry
        .parse::<KeyRing>()
        .map_err(|why| anyhow::anyhow!("the new key does not parse: {why}"))?;
    Ok(entry)
}

/// The ring in use, replaceable while serving (the key file is re-read on change):
/// every token is issued or checked with the ring of that moment. Clones share it.
#[derive(Clone)]
pub struct LiveKeyRing {
    ring: Arc<RwLock<KeyRing>>,
    /// `authd_token_signing_key{kid,alg}`: 1 for the key that signs now.
    signing_key: IntGaugeVec,
}

impl LiveKeyRing {
    fn new(ring: KeyRing, signing_key: IntGaugeVec) -> Self {
        let live = Self {
            ring: Arc::new(RwLock::new(ring.clone())),
            signing_key,
        };
        live.show_signer(&ring);
        live
    }

    /// The ring now (a cheap clone: two reference counts).
    pub fn current(&self) -> KeyRing {
        self.ring.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Puts `ring` in use: tokens issued from now on are signed with its first key.
    pub fn replace(&self, ring: KeyRing) {
        *self.ring.write().unwrap_or_else(|p| p.into_inner()) = ring.clone();
        self.show_signer(&ring);
    }

    fn show_signer(&self, ring: &KeyRing) {
        self.signing_key.reset();
        self.signing_key
            .with_label_values(&[ring.signing_kid(), ring.signing_algorithm().jose_name()])
            .set(1);
    }
}

/// The `aud` claim: one audience or several (RFC 7519 allows both forms).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
enum Audience {
    One(String),
    Many(Vec<String>),
}

impl Audience {
    fn of(audiences: &[String]) -> Option<Audience> {
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
    /// Not before; absent from tokens issued before authd wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbf: Option<u64>,
    /// Present when `AUTHD_TOKEN_AUDIENCE` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    aud: Option<Audience>,
    /// The session (absent from tokens issued before sessions existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    sid: Option<String>,
    /// Unique per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    jti: Option<String>,
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
    /// The `sid` claim: the session the token belongs to.
    pub session_id: Option<String>,
    /// The `iat` claim (Unix seconds).
    pub issued_at: u64,
}

/// Issues and verifies tokens with a key ring and a lifetime.
pub struct Tokens {
    keys: LiveKeyRing,
    ttl: Duration,
    /// The `aud` of every token issued (`AUTHD_TOKEN_AUDIENCE`).
    audience: Option<Audience>,
    /// How far `nbf` and `iat` may lie ahead of this clock, and `exp` behind it.
    clock_skew: Duration,
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

    /// The clock skew allowed when checking `nbf`, `iat` and `exp`.
    pub fn with_clock_skew(mut self, skew: Duration) -> Self {
        self.clock_skew = skew;
        self
    }

    /// The ring in use, shared: for the JWKS document and the key file reload.
    pub fn key_ring(&self) -> &LiveKeyRing {
        &self.keys
    }

    pub fn issue(&self, user_id: &str, username: &Username) -> anyhow::Result<IssuedToken> {
        self.issue_with(user_id, username, None, None)
    }

    /// A token of session `sid` (with a fresh `jti`) that expires at the token
    /// lifetime or at `not_after` (the session's end), whichever comes first.
    pub fn issue_in_session(
        &self,
        user_id: &str,
        username: &Username,
        sid: &str,
        not_after: SystemTime,
    ) -> anyhow::Result<IssuedToken> {
        let end = not_after
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        self.issue_with(user_id, username, Some(sid), Some(end))
    }

    fn issue_with(
        &self,
        user_id: &str,
        username: &Username,
        sid: Option<&str>,
        not_after: Option<u64>,
    ) -> anyhow::Result<IssuedToken> {
        let mut span = crate::otel::child("token.sign");
        let now = unix_now();
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
        let header = Header {
            alg: key.algorithm().jose_name().into(),
            typ: Some("JWT".into()),
            kid: Some(key.kid.clone()),
        };
        let claims = Claims {
            sub: user_id.to_owned(),
            name: username.as_str().to_owned(),
            iat: now,
            exp,
            iss: ISSUER.into(),
            nbf: Some(now),
            aud: self.audience.clone(),
            sid: sid.map(str::to_owned),
            jti: sid.map(|_| uuid::Uuid::now_v7().simple().to_string()),
        };
        let mut token = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&header)?),
            URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims)?)
        );
        let signature = key.sign(token.as_bytes());
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(signature));
        self.issued.inc();
        Ok(IssuedToken { token, expires_at })
    }

    /// Checks a token and counts the outcome.
    pub fn verify(&self, token: &str) -> Result<VerifiedToken, TokenError> {
        self.verify_for(token, None)
    }

    /// Checks a token, and when `audience` is given that the token is meant for it
    /// (its `aud` names it); counts the outcome.
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
        let mut parts = token.split('.');
        let (Some(header_b64), Some(claims_b64), Some(signature_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed);
        };
        let header: Header = decode_json(header_b64)?;
        let alg = Algorithm::of_jose_name(&header.alg).ok_or(TokenError::UnsupportedAlgorithm)?;
        let ring = self.keys.current();
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
        if claims.iss != ISSUER {
            return Err(TokenError::WrongIssuer);
        }
        // Signed by us or with our key, yet no token of ours says year 10000: refuse
        // before the value meets any time arithmetic.
        if claims.iat > MAX_TIMESTAMP || claims.nbf.is_some_and(|nbf| nbf > MAX_TIMESTAMP) {
            return Err(TokenError::Malformed);
        }
        let expires_at = unix_time(claims.exp).ok_or(TokenError::Malformed)?;
        let now = unix_now();
        let skew = self.clock_skew.as_secs();
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
    fn session_tokens_carry_sid_and_a_unique_jti_and_end_with_their_session() {
        let t = tokens(KEY_A);
        let alice = Username::parse("alice").unwrap();
        let far = SystemTime::now() + Duration::from_secs(3600);
        let a = t.issue_in_session("id", &alice, "sid-1", far).unwrap();
        let b = t.issue_in_session("id", &alice, "sid-1", far).unwrap();
        let v = t.verify(&a.token).unwrap();
        assert_eq!(v.session_id.as_deref(), Some("sid-1"));
        let claims =
            |token: &str| -> Claims { decode_json(token.split('.').nth(1).unwrap()).unwrap() };
        let (ca, cb) = (claims(&a.token), claims(&b.token));
        assert!(ca.jti.is_some());
        assert_ne!(ca.jti, cb.jti);
        // A session that ends in 10 s caps its tokens' lifetime (60 s here).
        let soon = SystemTime::now() + Duration::from_secs(10);
        let capped = t.issue_in_session("id", &alice, "sid-1", soon).unwrap();
        assert!(capped.expires_at <= soon);
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
        let signature = key.signer().sign(signing_input.as_bytes());
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

    fn ed25519_entry(kid: &str) -> String {
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
    fn the_jwks_holds_only_ed25519_public_keys() {
        let spec = format!("{KEY_A},{},{}", ed25519_entry("e1"), ed25519_entry("e2"));
        let ring: KeyRing = spec.parse().unwrap();
        let jwks: serde_json::Value = serde_json::from_str(&ring.jwks().json).unwrap();
        let keys = jwks["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 2);
        for (key, kid) in keys.iter().zip(["e1", "e2"]) {
            let mut fields: Vec<&str> = key
                .as_object()
                .unwrap()
                .keys()
                .map(|k| k.as_str())
                .collect();
            fields.sort();
            assert_eq!(fields, ["alg", "crv", "kid", "kty", "use", "x"]);
            assert_eq!(key["kid"], kid);
            assert_eq!(key["kty"], "OKP");
            assert_eq!(key["crv"], "Ed25519");
            assert_eq!(key["alg"], "EdDSA");
            assert_eq!(key["use"], "sig");
            assert_eq!(
                URL_SAFE_NO_PAD
                    .decode(key["x"].as_str().unwrap())
                    .unwrap()
                    .len(),
                32
            );
        }
        let hmac_only: KeyRing = KEY_A.parse().unwrap();
        assert_eq!(&*hmac_only.jwks().json, r#"{"keys":[]}"#);
        assert_ne!(hmac_only.jwks().etag, ring.jwks().etag);
        // Nothing secret in Debug either.
        let debug = format!("{ring:?}");
        assert!(debug.contains("e1:ed25519"), "{debug}");
        for entry in spec.split(',') {
            let secret = entry.rsplit(':').next().unwrap();
            assert!(!debug.contains(secret), "{debug}");
        }
    }

    #[test]
    fn ed25519_key_entries_are_checked_without_quoting_them() {
        let entry = ed25519_entry("k");
        assert!(entry.starts_with("k:ed25519:"), "{entry}");
        let ring: KeyRing = entry.parse().unwrap();
        assert_eq!(ring.signing_algorithm(), Algorithm::EdDsa);
        let hs = generate_key_entry(Algorithm::Hs256, "h").unwrap();
        assert!(hs.starts_with("h:hs256:"), "{hs}");
        assert_eq!(
            hs.parse::<KeyRing>().unwrap().signing_algorithm(),
            Algorithm::Hs256
        );
        // The explicit hs256 form means what the bare form does.
        let explicit = format!("a:hs256:{}", &KEY_A[2..]);
        assert_eq!(
            explicit.parse::<KeyRing>().unwrap().signing_algorithm(),
            Algorithm::Hs256
        );
        // 32 bytes that are not PKCS#8: refused, and the value not quoted.
        let bad = format!("k:ed25519:{}", &KEY_A[2..]);
        let err = bad.parse::<KeyRing>().unwrap_err();
        assert!(err.contains("PKCS#8"), "{err}");
        assert!(!err.contains(&KEY_A[2..]), "{err}");
        let err = format!("k:rsa:{}", &KEY_A[2..])
            .parse::<KeyRing>()
            .unwrap_err();
        assert!(err.contains("unknown algorithm"), "{err}");
        assert!(!err.contains(&KEY_A[2..]), "{err}");
        assert!(generate_key_entry(Algorithm::EdDsa, "bad kid").is_err());
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
            t.verify(&nbf(MAX_TIMESTAMP + 1)),
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

    #[test]
    fn garbage_is_malformed() {
        let t = tokens(KEY_A);
        for bad in ["", "a.b", "a.b.c.d", "!.!.!", "e30.e30.AA"] {
            assert!(t.verify(bad).is_err(), "{bad:?}");
        }
    }
}
