//! What the token endpoints share: reading a form body within [`MAX_FORM_BYTES`],
//! the rate limit under an endpoint's method name, and the JSON answers (RFC 6749
//! §5.2 errors; `Cache-Control: no-store` on everything that concerns a token).

use super::MAX_FORM_BYTES;
use crate::{error::Error, ratelimit::RateLimiter, rpc};
use axum::{
    body::Body,
    http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
};
use http_body_util::{BodyExt as _, Limited};
use serde_json::{Value, json};
use std::collections::HashMap;

/// The parameters of a form, each named at most once.
pub(super) type Form = HashMap<String, String>;

/// The form of a request, or the answer that refuses it: 413 beyond
/// [`MAX_FORM_BYTES`], 408 when it has not arrived `within` (a client that sends
/// its headers and then trickles or withholds the body holds its connection no
/// longer than an RPC's would), 400 for another content type, a body that is no
/// form, or a parameter given twice (RFC 6749 §3.2).
pub(super) async fn read(
    parts: &Parts,
    body: Body,
    within: std::time::Duration,
) -> Result<Form, Response> {
    let form_type = (parts.headers.get(header::CONTENT_TYPE))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| {
            v.trim()
                .eq_ignore_ascii_case("application/x-www-form-urlencoded")
        });
    if !form_type {
        return Err(invalid_request(
            "the body must be application/x-www-form-urlencoded",
        ));
    }
    // tokio's time: the runtime's timers, paused and driven by tests.
    let read = tokio::time::timeout(within, Limited::new(body, MAX_FORM_BYTES).collect());
    let bytes = match read.await {
        Err(_) => {
            return Err(error(
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request",
                "the form did not arrive in time",
            ));
        }
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request",
                &format!("the form is larger than {MAX_FORM_BYTES} bytes"),
            ));
        }
        Ok(Err(_)) => return Err(invalid_request("the body could not be read")),
    };
    let mut form = Form::new();
    for (name, value) in form_urlencoded::parse(&bytes) {
        if form.insert(name.into_owned(), value.into_owned()).is_some() {
            return Err(invalid_request("a parameter is given more than once"));
        }
    }
    Ok(form)
}

/// Counts the request against the rate-limit rules of `method`, as a grant naming
/// `client_id` when it is one; the answer that refuses it (429 with `Retry-After`,
/// or 503 when the limiter cannot decide and fails closed).
pub(super) async fn rate_limit(
    limiter: &RateLimiter,
    method: &str,
    parts: &Parts,
    client_id: Option<&str>,
) -> Result<(), Response> {
    let planned = limiter.plan_grant(
        method,
        &parts.headers,
        rpc::client_ip(&parts.extensions),
        rpc::client_identity(&parts.extensions),
        client_id,
    );
    if planned.is_empty() {
        return Ok(());
    }
    match limiter.decide(&planned).await {
        Ok(_) => Ok(()),
        Err(Error::RateLimited { retry_after, .. }) => {
            let mut response = error(
                StatusCode::TOO_MANY_REQUESTS,
                "slow_down",
                "rate limit exceeded; retry after the time in Retry-After",
            );
            let seconds = crate::error::whole_seconds(retry_after).max(1);
            response.headers_mut().insert(
                header::RETRY_AFTER,
                HeaderValue::from_str(&seconds.to_string()).expect("digits"),
            );
            Err(response)
        }
        Err(e) => {
            tracing::warn!(error = %e, method, "the rate limiter could not decide");
            Err(unavailable())
        }
    }
}

/// A JSON answer about a token: `Cache-Control: no-store` (RFC 6749 §5.1).
pub(super) fn token_answer(status: StatusCode, body: &Value) -> Response {
    let mut response = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response();
    no_store(response.headers_mut());
    response
}

fn no_store(headers: &mut HeaderMap) {
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::PRAGMA, HeaderValue::from_static("no-cache"));
}

/// An RFC 6749 §5.2 error: `{"error":…,"error_description":…}`.
pub(super) fn error(status: StatusCode, code: &str, description: &str) -> Response {
    token_answer(
        status,
        &json!({"error": code, "error_description": description}),
    )
}

/// 400 `invalid_request`.
pub(super) fn invalid_request(description: &str) -> Response {
    error(StatusCode::BAD_REQUEST, "invalid_request", description)
}

/// 503: the store (or the rate limiter) did not answer.
pub(super) fn unavailable() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "temporarily_unavailable",
        "the service is unavailable; retry later",
    )
}

/// Any other path under the standard prefixes.
pub(super) async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not_found", "no such endpoint")
}
