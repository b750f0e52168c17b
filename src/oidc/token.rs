//! `POST /oauth2/token`: the grants of service accounts (docs/service-accounts.md).
//!
//! - `grant_type=client_credentials` (RFC 6749 §4.4): the client authenticates with
//!   HTTP Basic (`client_secret_basic`) or with `client_id` and `client_secret` in
//!   the form (`client_secret_post`), or, under mutual TLS with neither, with its
//!   certificate's identity, or with RFC 7523's `client_assertion` (a JWT of an
//!   external issuer, `client_assertion_type` `…:jwt-bearer`); `audience` (or RFC 8707's `resource`) and `scope`
//!   narrow the token.
//! - `grant_type=urn:ietf:params:oauth:grant-type:token-exchange` (RFC 8693): the
//!   same client authentication, a `subject_token` of type
//!   `urn:ietf:params:oauth:token-type:access_token`, and one `audience`.
//!
//! The answer is RFC 6749 §5.1's (no refresh token) or §5.2's error: 401
//! `invalid_client` (with `WWW-Authenticate: Basic`) for any credential that proves
//! nothing, 400 `invalid_scope` / `invalid_target` for what the account may not
//! have, 400 `invalid_grant` for a subject token refused, 429 with `Retry-After`
//! when the client id is throttled. The form is bounded and rate-limited as the
//! other endpoints' are, under the method name [`TOKEN`](super::TOKEN); secrets and
//! tokens never reach a log.

use super::{Endpoints, TOKEN, clients::basic, form};
use crate::{
    accounts::{AUDIENCE_NOT_ALLOWED, ClientProof, MAX_SCOPES, SCOPE_NOT_ALLOWED, parse_items},
    audit::Caller,
    error::Error,
    rpc,
};
use axum::{
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    response::Response,
};
use serde_json::json;
use std::{sync::Arc, time::Instant};

/// The grant type of token exchange (RFC 8693 §2.1).
pub const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
/// The client assertion type of RFC 7523 §2.2.
pub const JWT_BEARER: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// The subject token type an exchange takes, and the type of what it issues.
pub const ACCESS_TOKEN_TYPE: &str = "urn:ietf:params:oauth:token-type:access_token";

fn invalid_client() -> Response {
    let mut response = form::error(
        StatusCode::UNAUTHORIZED,
        "invalid_client",
        "client authentication failed",
    );
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        HeaderValue::from_static("Basic realm=\"authd\""),
    );
    response
}

/// The answer to a grant that failed with `e`.
fn refused(e: Error) -> Response {
    match e {
        Error::InvalidClient => invalid_client(),
        Error::NotAllowed(why) if why == SCOPE_NOT_ALLOWED => {
            form::error(StatusCode::BAD_REQUEST, "invalid_scope", why)
        }
        Error::NotAllowed(why) if why == AUDIENCE_NOT_ALLOWED => {
            form::error(StatusCode::BAD_REQUEST, "invalid_target", why)
        }
        Error::NotAllowed(why) => form::error(StatusCode::BAD_REQUEST, "invalid_grant", why),
        Error::InvalidToken(_) => form::error(
            StatusCode::BAD_REQUEST,
            "invalid_grant",
            "the subject token is not valid",
        ),
        Error::InvalidArgument(_) => form::invalid_request(&e.to_string()),
        Error::Throttled { retry_after, .. } => {
            let mut response = form::error(
                StatusCode::TOO_MANY_REQUESTS,
                "slow_down",
                "too many failed attempts for this client; retry after the time in Retry-After",
            );
            let seconds = crate::error::whole_seconds(retry_after).max(1);
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&seconds.to_string()).expect("digits"),
            );
            response
        }
        Error::Internal(cause) => {
            tracing::error!(error = format!("{cause:#}"), "a token grant failed");
            form::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal error",
            )
        }
        _ => form::unavailable(),
    }
}

/// The client id a grant's request names, for a rule that counts it: HTTP Basic's
/// user, else the form's `client_id`; none beside a client assertion, whose
/// subject is in the token (and unknown before it is verified).
fn named_client_id(parts: &axum::http::request::Parts, form: &form::Form) -> Option<String> {
    if form.contains_key("client_assertion") {
        return None;
    }
    let header = (parts.headers.get(header::AUTHORIZATION)).and_then(|v| v.to_str().ok());
    match header.and_then(basic) {
        Some((client_id, _)) => Some(client_id),
        None => form.get("client_id").cloned(),
    }
}

pub(super) async fn token(
    State(endpoints): State<Arc<Endpoints>>,
    request: Request<Body>,
) -> Response {
    let (parts, body) = request.into_parts();
    let limiter = &endpoints.rate_limiter;
    // A rule that counts the client id waits for the form, which may name it; then
    // every rule is decided at once, as before the form otherwise.
    let deferred = limiter.defers(TOKEN);
    if !deferred && let Err(refused) = form::rate_limit(limiter, TOKEN, &parts, None).await {
        return refused;
    }
    let form = form::read(&parts, body, endpoints.receive_timeout).await;
    if deferred {
        let named = form
            .as_ref()
            .ok()
            .and_then(|form| named_client_id(&parts, form));
        if let Err(refused) = form::rate_limit(limiter, TOKEN, &parts, named.as_deref()).await {
            return refused;
        }
    }
    let mut form = match form {
        Ok(form) => form,
        Err(refused) => return refused,
    };
    let caller = Caller {
        request_id: (parts.extensions.get::<rpc::RequestId>()).map(|id| id.as_str().to_owned()),
        client: rpc::client_ip(&parts.extensions),
        identity: rpc::client_identity(&parts.extensions).map(|i| i.as_str().to_owned()),
        trace_id: crate::otel::current_trace_id(),
    };
    // The client: HTTP Basic, or the form, or its certificate; never two of them
    // (RFC 6749 §2.3: one method per request).
    let header = (parts.headers.get(header::AUTHORIZATION)).and_then(|v| v.to_str().ok());
    let in_form = (form.remove("client_id"), form.remove("client_secret"));
    let assertion = match (
        form.remove("client_assertion_type"),
        form.remove("client_assertion"),
    ) {
        (Some(kind), Some(jwt)) if kind == JWT_BEARER => Some(jwt),
        (None, None) => None,
        _ => {
            return form::invalid_request(
                "client_assertion_type must be urn:ietf:params:oauth:client-assertion-type:jwt-bearer, with a client_assertion",
            );
        }
    };
    let proof = match (header, in_form, assertion) {
        (None, (None, None), Some(jwt)) => ClientProof::Assertion { jwt },
        // RFC 7523 §3: a client_id beside the assertion is allowed; it names nothing
        // the assertion does not.
        (None, (Some(_), None), Some(jwt)) => ClientProof::Assertion { jwt },
        (_, _, Some(_)) => {
            return form::invalid_request("authenticate the client one way, not several");
        }
        (header, in_form, None) => match (header, in_form) {
            (Some(value), (None, None)) => match basic(value) {
                Some((client_id, secret)) => ClientProof::Secret { client_id, secret },
                None => return invalid_client(),
            },
            (None, (Some(client_id), Some(secret))) => ClientProof::Secret { client_id, secret },
            (None, (None, None)) => match caller.identity.clone() {
                Some(identity) => ClientProof::Certificate { identity },
                None => return invalid_client(),
            },
            (Some(_), _) => {
                return form::invalid_request("authenticate the client one way, not several");
            }
            (None, _) => return invalid_client(),
        },
    };
    if let ClientProof::Secret { client_id, secret } = &proof
        && (client_id.len() > 256 || secret.len() > 256)
    {
        return invalid_client();
    }
    let audience = form
        .get("audience")
        .or_else(|| form.get("resource"))
        .map(String::as_str);
    if audience.is_some_and(|a| a.is_empty() || a.len() > crate::token::MAX_AUDIENCE_BYTES) {
        return form::error(
            StatusCode::BAD_REQUEST,
            "invalid_target",
            "the audience must be 1 to 256 bytes",
        );
    }
    let requested: Vec<String> = (form.get("scope"))
        .map(|s| {
            s.split(' ')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let scopes = match parse_items(&requested, "scope", MAX_SCOPES) {
        Ok(scopes) => scopes,
        Err(_) => {
            return form::error(
                StatusCode::BAD_REQUEST,
                "invalid_scope",
                "the scope is malformed",
            );
        }
    };
    let deadline = Some(Instant::now() + endpoints.receive_timeout);
    let accounts = &endpoints.accounts;
    let outcome = match form.get("grant_type").map(String::as_str) {
        Some("client_credentials") => {
            accounts
                .client_credentials(&proof, audience, &scopes, &caller, deadline)
                .await
        }
        Some(TOKEN_EXCHANGE) => {
            let Some(subject) = form.get("subject_token") else {
                return form::invalid_request("the subject_token parameter is missing");
            };
            if form.get("subject_token_type").map(String::as_str) != Some(ACCESS_TOKEN_TYPE) {
                return form::invalid_request(
                    "subject_token_type must be urn:ietf:params:oauth:token-type:access_token",
                );
            }
            if form.contains_key("actor_token") {
                return form::invalid_request("actor_token is not supported: the client acts");
            }
            let Some(audience) = audience else {
                return form::error(
                    StatusCode::BAD_REQUEST,
                    "invalid_target",
                    "an exchange names the audience it is for",
                );
            };
            accounts
                .exchange_token(&proof, subject, audience, &scopes, &caller, deadline)
                .await
        }
        Some(_) => {
            return form::error(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                "grant_type must be client_credentials or token exchange",
            );
        }
        None => return form::invalid_request("the grant_type parameter is missing"),
    };
    let exchange = form.get("grant_type").map(String::as_str) == Some(TOKEN_EXCHANGE);
    match outcome {
        Ok(granted) => {
            let now = endpoints.accounts.clock().system_time();
            let expires_in = (granted.token.expires_at.duration_since(now))
                .map(|d| d.as_secs())
                .unwrap_or(0);
            let mut answer = json!({
                "access_token": granted.token.token,
                "token_type": "Bearer",
                "expires_in": expires_in,
            });
            if !granted.scopes.is_empty() {
                answer["scope"] = json!(granted.scopes.join(" "));
            }
            if exchange {
                answer["issued_token_type"] = json!(ACCESS_TOKEN_TYPE);
            }
            form::token_answer(StatusCode::OK, &answer)
        }
        Err(e) => refused(e),
    }
}
