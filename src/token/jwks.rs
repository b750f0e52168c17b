//! `GET /.well-known/jwks.json` on the plain-HTTP port (the one `/metrics` is served
//! on): the public keys that verify authd's EdDSA tokens, as a JWK Set (RFC 7517).
//!
//! The document ([`Jwks`]) holds Ed25519 public keys only: never an HMAC key, never
//! private material; `{"keys":[]}` for an HMAC-only ring. It is built when a ring is
//! loaded (`keys` hands it the public keys), so a request costs a clone of a
//! reference count. This file sees no key ring: the router is given a function that
//! returns the document of the ring in use.
//!
//! `Cache-Control: max-age` is [`MAX_AGE`]: a verifier caching the document refreshes
//! at least that often, so a key added to the ring (rotation's first step) reaches
//! every verifier within the key file's reload interval plus `MAX_AGE`, the wait
//! the rotation guide (docs/tokens.md) asks for before the new key signs. A strong
//! `ETag` lets verifiers revalidate with `If-None-Match` for a `304`.

use axum::{
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use ed25519_dalek::VerifyingKey;
use serde::Serialize;
use sha2::{Digest as _, Sha256};
use std::sync::Arc;

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
    /// The document of these Ed25519 public keys (kid and key), in this order. Only
    /// public keys can be given: an HMAC key is never published, since whoever can
    /// verify with it can also sign.
    pub(super) fn of<'a>(keys: impl Iterator<Item = (&'a str, &'a VerifyingKey)>) -> Self {
        let keys: Vec<PublicJwk> = keys
            .map(|(kid, public)| PublicJwk {
                kty: "OKP",
                crv: "Ed25519",
                kid: kid.to_owned(),
                // The JOSE name of Ed25519 (`keys::Algorithm::EdDsa`).
                alg: "EdDSA",
                use_: "sig",
                x: URL_SAFE_NO_PAD.encode(public.as_bytes()),
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

/// The path of the document.
pub(crate) const PATH: &str = "/.well-known/jwks.json";

/// How long verifiers may cache the document, in seconds.
pub const MAX_AGE: u64 = 300;

/// The router of the document that `current` returns at each request, merged into
/// the HTTP port's.
pub(super) fn router(current: impl Fn() -> Jwks + Clone + Send + Sync + 'static) -> axum::Router {
    axum::Router::new().route(
        PATH,
        get(move |headers: HeaderMap| {
            let jwks = current();
            async move { document(jwks, &headers) }
        }),
    )
}

fn document(jwks: Jwks, headers: &HeaderMap) -> Response {
    let cache = HeaderValue::from_str(&format!("public, max-age={MAX_AGE}"))
        .expect("a visible ASCII header value");
    // An ETag is visible ASCII by construction (base64url in quotes).
    let etag = HeaderValue::from_str(&jwks.etag).expect("a visible ASCII entity tag");
    let matches = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|tag| tag.trim().trim_start_matches("W/"))
        .any(|tag| tag == "*" || tag == &*jwks.etag);
    let common = [(header::CACHE_CONTROL, cache), (header::ETAG, etag)];
    if matches {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (
        common,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        jwks.json.to_string(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use crate::token::{
        KeyRing,
        tests::{KEY_A, ed25519_entry},
    };
    use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};

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
}
