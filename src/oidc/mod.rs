//! The standard HTTP endpoints, served on the gRPC port beside gRPC (docs/api.md,
//! "Standard endpoints"): what an OAuth 2.0 / OpenID Connect library expects of an
//! issuer, so that clients nobody here wrote can find authd's keys and ask about
//! its tokens.
//!
//! - `GET /.well-known/openid-configuration`: the discovery document (RFC 8414 /
//!   OpenID Connect Discovery), built from the configured issuer URL
//!   (`AUTHD_ISSUER`), never from the request's `Host` (a client chooses that).
//! - `GET /.well-known/jwks.json`: the JWKS document, the handler `token` serves on
//!   the metrics port too.
//! - `POST /oauth2/introspect`: RFC 7662, for authenticated clients only.
//! - `POST /oauth2/revoke`: RFC 7009, the token itself is the credential.
//! - `POST /oauth2/token`: the grants of service accounts (RFC 6749 §4.4's client
//!   credentials, RFC 8693's token exchange).
//!
//! Forms are bounded ([`MAX_FORM_BYTES`]); answers are JSON; token answers carry
//! `Cache-Control: no-store`. Tokens are checked exactly as ValidateToken checks
//! them (`Accounts::validate`), and never logged. Introspection and revocation go
//! through the rate limiter under the method names [`INTROSPECT`] and [`REVOKE`].
//! This module sees no gRPC: the port's front (`web`) sends it every request that
//! is no RPC, as its plain-HTTP routes (see `app::grpc`).
//!
//! # Layout
//!
//! - this file: the router and what its handlers share.
//! - `discovery`: the issuer URL and the discovery document.
//! - `clients`: the introspection clients and their credentials (HTTP Basic with a
//!   keys file of digests, or mutual TLS identities).
//! - `form`: reading a bounded form, the rate limit, and the JSON answers.
//! - `introspect`, `revoke`: the two token endpoints.
//! - `token`: the token endpoint of service accounts.

mod clients;
mod discovery;
mod form;
mod introspect;
mod revoke;
mod token;

pub use clients::IntrospectionClients;
pub use discovery::parse_issuer;

use crate::{accounts::Accounts, metrics::OidcMetrics, ratelimit::RateLimiter, token::LiveKeyRing};
use axum::routing::{get, post};
use std::sync::Arc;

/// The path of the discovery document.
pub const DISCOVERY_PATH: &str = "/.well-known/openid-configuration";
/// The path of the introspection endpoint.
pub const INTROSPECT_PATH: &str = "/oauth2/introspect";
/// The path of the revocation endpoint.
pub const REVOKE_PATH: &str = "/oauth2/revoke";
/// The path of the token endpoint (service accounts' grants).
pub const TOKEN_PATH: &str = "/oauth2/token";
/// The method name rate-limit rules give the token endpoint (`Token:peer=…`).
pub const TOKEN: &str = crate::rpc::STANDARD_METHODS[2];
/// The largest form the token endpoints read; a larger one answers 413.
pub const MAX_FORM_BYTES: usize = 8 * 1024;
/// The method name rate-limit rules give introspection (`Introspect:peer=…`).
pub const INTROSPECT: &str = crate::rpc::STANDARD_METHODS[0];
/// The method name rate-limit rules give revocation (`Revoke:peer=…`).
pub const REVOKE: &str = crate::rpc::STANDARD_METHODS[1];

/// What the configuration gives the standard endpoints.
#[derive(Debug, Default)]
pub struct OidcSettings {
    /// The public issuer URL (`AUTHD_ISSUER`), without a trailing slash.
    pub issuer: Option<String>,
    /// Who may introspect tokens.
    pub clients: IntrospectionClients,
}

/// What the endpoints are served from.
pub(crate) struct Endpoints {
    pub accounts: Arc<Accounts>,
    pub key_ring: LiveKeyRing,
    pub rate_limiter: Arc<RateLimiter>,
    pub metrics: OidcMetrics,
    pub settings: OidcSettings,
    /// How long a form may take to arrive (`AUTHD_RECEIVE_TIMEOUT`, as for RPCs).
    pub receive_timeout: std::time::Duration,
}

/// The endpoints' router.
pub(crate) fn router(endpoints: Endpoints) -> axum::Router {
    let key_ring = endpoints.key_ring.clone();
    let endpoints = Arc::new(endpoints);
    axum::Router::new()
        .route(DISCOVERY_PATH, get(discovery::document))
        .route(INTROSPECT_PATH, post(introspect::introspect))
        .route(REVOKE_PATH, post(revoke::revoke))
        .route(TOKEN_PATH, post(token::token))
        .fallback(form::not_found)
        .with_state(endpoints)
        .merge(crate::token::jwks_router(key_ring))
        .layer(axum::middleware::from_fn(with_request_id))
}

/// Gives every request an id, as RPCs have one (its client's `x-request-id` when it
/// is a sane one, else a new one): in its extensions for the audit trail, and in the
/// answer's `x-request-id`.
async fn with_request_id(
    mut request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let id = crate::rpc::RequestId::of(request.headers());
    let header = id.0.clone();
    request.extensions_mut().insert(id);
    let mut response = next.run(request).await;
    (response.headers_mut()).insert(crate::rpc::REQUEST_ID_HEADER, header);
    response
}
