//! `GET /.well-known/jwks.json` on the plain-HTTP port (the one `/metrics` is served
//! on): the public keys that verify authd's EdDSA tokens, as a JWK Set (RFC 7517).
//!
//! The document holds Ed25519 public keys only (see `token::Jwks`): never an HMAC
//! key, never private material; `{"keys":[]}` for an HMAC-only ring. It is built
//! when a ring is loaded, so a request costs a clone of a reference count.
//!
//! `Cache-Control: max-age` is [`MAX_AGE`]: a verifier caching the document refreshes
//! at least that often, so a key added to the ring (rotation's first step) reaches
//! every verifier within the key file's reload interval plus `MAX_AGE`, the wait
//! the rotation guide (docs/tokens.md) asks for before the new key signs. A strong
//! `ETag` lets verifiers revalidate with `If-None-Match` for a `304`.

use crate::token::LiveKeyRing;
use axum::{
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};

/// The path of the document.
pub(crate) const PATH: &str = "/.well-known/jwks.json";

/// How long verifiers may cache the document, in seconds.
pub const MAX_AGE: u64 = 300;

/// The router of the document, merged into the HTTP port's.
pub(crate) fn router(ring: LiveKeyRing) -> axum::Router {
    axum::Router::new().route(
        PATH,
        get(move |headers: HeaderMap| {
            let ring = ring.clone();
            async move { document(&ring, &headers) }
        }),
    )
}

fn document(ring: &LiveKeyRing, headers: &HeaderMap) -> Response {
    let jwks = ring.current().jwks().clone();
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
