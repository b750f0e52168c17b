//! Keys and the key ring: named keys (`kid`), each of one algorithm (HMAC-SHA256 or
//! Ed25519), parsed from `KID:BASE64KEY,…` (or `KID:ALG:KEY`); the first signs, all
//! verify. [`LiveKeyRing`] is the ring in use, replaceable while serving.
//!
//! Key material stays in this file: it never appears in `Debug`, in an error or in a
//! log (errors name a key by its kid or position); only the public halves of Ed25519
//! keys leave it, for the JWKS document (`jwks`). Signing and checking a signature
//! happen here; what a token says (header, claims, times) is `jwt`'s business.

use super::jwks::Jwks;
use crate::error::TokenError;
use base64::{
    Engine as _,
    engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD},
};
use ed25519_dalek::{
    Signer as _, SigningKey, VerifyingKey,
    pkcs8::{DecodePrivateKey as _, EncodePrivateKey as _},
};
use hmac::{Hmac, KeyInit, Mac};
use prometheus::IntGaugeVec;
use sha2::Sha256;
use std::{
    fmt,
    str::FromStr,
    sync::{Arc, RwLock},
};

type HmacSha256 = Hmac<Sha256>;

/// Keys shorter than this are refused.
pub const MIN_KEY_BYTES: usize = 32;

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

    pub(super) fn of_jose_name(name: &str) -> Option<Algorithm> {
        match name {
            "HS256" => Some(Algorithm::Hs256),
            "EdDSA" => Some(Algorithm::EdDsa),
            _ => None,
        }
    }
}

/// The secret of a key; never printed.
pub(super) enum Material {
    Hmac(Vec<u8>),
    /// The signing key (it zeroizes itself when dropped) and its public half.
    Ed25519 {
        signing: Box<SigningKey>,
        public: VerifyingKey,
    },
}

pub(super) struct Key {
    pub(super) kid: String,
    pub(super) material: Material,
}

impl Key {
    pub(super) fn algorithm(&self) -> Algorithm {
        match self.material {
            Material::Hmac(_) => Algorithm::Hs256,
            Material::Ed25519 { .. } => Algorithm::EdDsa,
        }
    }

    pub(super) fn sign(&self, input: &[u8]) -> Vec<u8> {
        match &self.material {
            Material::Hmac(secret) => mac(secret, input).finalize().into_bytes().to_vec(),
            Material::Ed25519 { signing, .. } => signing.sign(input).to_bytes().to_vec(),
        }
    }

    pub(super) fn verify(&self, input: &[u8], signature: &[u8]) -> Result<(), TokenError> {
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

/// Named keys: the first signs, every one verifies.
#[derive(Clone)]
pub struct KeyRing {
    keys: Arc<[Key]>,
    jwks: Jwks,
}

impl KeyRing {
    fn new(keys: Vec<Key>) -> Self {
        let jwks = Jwks::of(keys.iter().filter_map(|key| match &key.material {
            Material::Ed25519 { public, .. } => Some((key.kid.as_str(), public)),
            // Never published: an HMAC key that verifies also signs.
            Material::Hmac(_) => None,
        }));
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

    pub(super) fn signer(&self) -> &Key {
        // A ring is never empty: `from_str` refuses an empty list.
        &self.keys[0]
    }

    pub(super) fn find(&self, kid: &str) -> Option<&Key> {
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
                            "key {kid:?}: unknown algorithm in its second field (an entry is \
                             KID:hs256:BASE64, KID:ed25519:BASE64 or KID:BASE64)"
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
    pub(super) fn new(ring: KeyRing, signing_key: IntGaugeVec) -> Self {
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

pub(super) fn mac(secret: &[u8], data: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length, so this cannot fail.
    let mut mac =
        <HmacSha256 as KeyInit>::new_from_slice(secret).expect("HMAC accepts any key length");
    mac.update(data);
    mac
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::tests::{KEY_A, ed25519_entry};

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
        assert!(err.contains("KID:hs256:BASE64"), "{err}");
        assert!(!err.contains(&KEY_A[2..]), "{err}");
        assert!(generate_key_entry(Algorithm::EdDsa, "bad kid").is_err());
    }
}
