//! The issuer URL (`AUTHD_ISSUER`) and the discovery document built from it
//! (RFC 8414, OpenID Connect Discovery 1.0): only what is true of authd, so a
//! library that reads it finds the keys, the algorithms, the token endpoints
//! (introspection, revocation, and the service accounts' grants), and nothing
//! authd does not serve (no authorization endpoint: users' tokens come from Login
//! over gRPC).
//!
//! Every URL is the issuer's: a document built from the request's `Host` would
//! let a client choose where verifiers fetch keys from. Without an issuer the
//! document answers 404 with a JSON error naming the setting.

use super::{Endpoints, INTROSPECT_PATH, REVOKE_PATH, form};
use crate::token::Algorithm;
use axum::{
    extract::State,
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use serde_json::{Value, json};
use std::sync::Arc;

/// The longest issuer URL accepted.
const MAX_ISSUER_BYTES: usize = 256;

/// How long clients may cache the document, in seconds (as the JWKS).
const MAX_AGE: u64 = crate::token::JWKS_MAX_AGE;

/// An issuer URL as `AUTHD_ISSUER` takes it: `https://` (or `http://`, for tests
/// and local use), a host, an optional path, no query, no fragment, no spaces; a
/// trailing slash is dropped (clients append `/.well-known/…` to it).
pub fn parse_issuer(text: &str) -> Result<String, String> {
    let url = text.trim().trim_end_matches('/');
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or("must start with https:// (or http:// for local use)")?;
    if url.len() > MAX_ISSUER_BYTES {
        return Err(format!("must be at most {MAX_ISSUER_BYTES} bytes"));
    }
    let host = rest.split('/').next().unwrap_or_default();
    if host.is_empty() {
        return Err("has no host".into());
    }
    if url.contains(['?', '#']) {
        return Err("must have no query and no fragment".into());
    }
    if !url.chars().all(|c| c.is_ascii_graphic()) {
        return Err("must be visible ASCII, without spaces".into());
    }
    Ok(url.to_owned())
}

/// `GET /.well-known/openid-configuration`.
pub(super) async fn document(State(endpoints): State<Arc<Endpoints>>) -> Response {
    let Some(issuer) = endpoints.settings.issuer.as_deref() else {
        return form::error(
            StatusCode::NOT_FOUND,
            "not_found",
            "the discovery document needs a public issuer URL: set AUTHD_ISSUER",
        );
    };
    let ring = endpoints.key_ring.current();
    // What signs now, and EdDSA while the JWKS holds keys (tokens that a previous
    // signing key signed still verify).
    let mut algorithms = vec![ring.signing_algorithm()];
    if !ring.jwks().keys.is_empty() && !algorithms.contains(&Algorithm::EdDsa) {
        algorithms.push(Algorithm::EdDsa);
    }
    let document = of(issuer, algorithms, &endpoints.settings.clients);
    let cache = HeaderValue::from_str(&format!("public, max-age={MAX_AGE}"))
        .expect("a visible ASCII header value");
    (
        [
            (header::CACHE_CONTROL, cache),
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            ),
        ],
        document.to_string(),
    )
        .into_response()
}

/// The document of `issuer`, whose ring signs and verifies with `algorithms`.
fn of(issuer: &str, algorithms: Vec<Algorithm>, clients: &super::IntrospectionClients) -> Value {
    let algorithms: Vec<&str> = algorithms.iter().map(|a| a.jose_name()).collect();
    let mut document = json!({
        "issuer": issuer,
        "jwks_uri": format!("{issuer}{}", crate::token::JWKS_PATH),
        "revocation_endpoint": format!("{issuer}{REVOKE_PATH}"),
        // The token is the credential: no client authentication.
        "revocation_endpoint_auth_methods_supported": ["none"],
        "id_token_signing_alg_values_supported": algorithms,
        // Required by OpenID Connect Discovery; authd's tokens name the user by a
        // stable id (`sub`), the same for every client.
        "subject_types_supported": ["public"],
        "claims_supported": [
            "iss", "sub", "name", "iat", "exp", "nbf", "aud", "sid", "jti", "amr",
            "client_id", "scope", "act"
        ],
        // Service accounts' grants (docs/service-accounts.md).
        "token_endpoint": format!("{issuer}{}", super::TOKEN_PATH),
        "token_endpoint_auth_methods_supported": [
            "client_secret_basic", "client_secret_post", "tls_client_auth"
        ],
        "grant_types_supported": [
            "client_credentials", super::token::TOKEN_EXCHANGE
        ],
    });
    let methods = clients.auth_methods();
    if !methods.is_empty() {
        document["introspection_endpoint"] = json!(format!("{issuer}{INTROSPECT_PATH}"));
        document["introspection_endpoint_auth_methods_supported"] = json!(methods);
    }
    document
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_issuer_is_an_absolute_url_without_query() {
        assert_eq!(
            parse_issuer("https://auth.example.com/").unwrap(),
            "https://auth.example.com"
        );
        assert_eq!(
            parse_issuer("http://127.0.0.1:8080/tenant").unwrap(),
            "http://127.0.0.1:8080/tenant"
        );
        for bad in [
            "auth.example.com",
            "https://",
            "https:///path",
            "https://a.example?x=1",
            "https://a.example#f",
            "https://a example",
            "ftp://a.example",
        ] {
            assert!(parse_issuer(bad).is_err(), "{bad}");
        }
        assert!(parse_issuer(&format!("https://{}", "a".repeat(300))).is_err());
    }

    #[test]
    fn the_document_names_only_what_is_served() {
        let none = super::super::IntrospectionClients::default();
        let doc = of("https://a.example", vec![Algorithm::EdDsa], &none);
        assert_eq!(doc["jwks_uri"], "https://a.example/.well-known/jwks.json");
        assert_eq!(
            doc["id_token_signing_alg_values_supported"],
            json!(["EdDSA"])
        );
        assert!(doc.get("introspection_endpoint").is_none());
        assert!(doc.get("authorization_endpoint").is_none());
        assert!(doc.get("token_endpoint").is_some());
    }
}
