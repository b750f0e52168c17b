//! HTTP forward-auth: `/forward-auth` for nginx `auth_request`, Traefik ForwardAuth,
//! Caddy `forward_auth` (and Envoy's HTTP ext_authz mode), on a port of its own
//! (`AUTHD_FORWARD_AUTH_LISTEN`), served by `transport::Listener` within the same
//! bounds of connections and time as every listener.
//!
//! Any method: the proxies send the client's (nginx), or GET. It reads the
//! `authorization` header and the query string, nothing else: never the body, never
//! a URL to go to (it redirects nowhere, proxies nothing). 200 with the identity
//! headers, or the denial's status with its `WWW-Authenticate` challenge.
//!
//! The route's policy is the query string of `/forward-auth` exactly, which the
//! proxy's configuration writes (`/forward-auth?require_second_factor=true`). Under
//! `/forward-auth/…` (Envoy's HTTP mode appends the client's path and query to a
//! prefix) the query is the client's, so it is never read there: the default
//! policy applies.

use super::{Authorizer, Decision, Policy, UNREADABLE, identity_headers};
use axum::{
    extract::{RawQuery, State},
    http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::any,
};
use std::sync::Arc;

/// The router of the forward-auth port.
pub(crate) fn router(authorizer: Arc<Authorizer>) -> axum::Router {
    axum::Router::new()
        .route("/forward-auth", any(with_policy))
        .route("/forward-auth/{*path}", any(default_policy))
        .with_state(authorizer)
}

async fn with_policy(
    State(authorizer): State<Arc<Authorizer>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let pairs = query.as_deref().map(query_pairs).unwrap_or_default();
    let policy = pairs
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .and_then(|pairs| Policy::parse(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str()))));
    answer(&authorizer, &headers, policy)
}

async fn default_policy(State(authorizer): State<Arc<Authorizer>>, headers: HeaderMap) -> Response {
    answer(&authorizer, &headers, Ok(Policy::default()))
}

fn answer(
    authorizer: &Authorizer,
    headers: &HeaderMap,
    policy: Result<Policy, String>,
) -> Response {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let authorization = match (values.next(), values.next()) {
        (None, _) => None,
        (Some(value), None) => Some(value.to_str().unwrap_or(UNREADABLE)),
        // Two credentials: which one the upstream would read is anyone's guess.
        (Some(_), Some(_)) => Some(UNREADABLE),
    };
    let decision = authorizer.decide("http", authorization, policy);
    let settings = authorizer.settings();
    let (outcome, reason) = (decision.outcome(), decision.reason());
    let mut response = match &decision {
        Decision::Allow(token) => {
            let mut response = StatusCode::OK.into_response();
            for (name, value) in token
                .iter()
                .flat_map(|t| identity_headers(&settings.header_prefix, t))
            {
                // Checked by the authorizer: every value is a valid header value.
                if let (Ok(name), Ok(value)) =
                    (HeaderName::try_from(name), HeaderValue::try_from(value))
                {
                    response.headers_mut().insert(name, value);
                }
            }
            response
        }
        Decision::Deny(denial) => {
            let status = StatusCode::from_u16(denial.http_status())
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            let mut response = status.into_response();
            if let Some(challenge) = denial.challenge(&settings.realm)
                && let Ok(value) = HeaderValue::try_from(challenge)
            {
                response
                    .headers_mut()
                    .insert(header::WWW_AUTHENTICATE, value);
            }
            response
        }
    };
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let user_id = match &decision {
        Decision::Allow(Some(token)) => Some(token.user_id.as_str()),
        _ => None,
    };
    tracing::info!(api = "http", outcome, reason, user_id, "forward-auth");
    response
}

/// The `name=value` pairs of a query string, percent-decoded (`+` is a space);
/// an error for a pair that is not UTF-8 once decoded.
fn query_pairs(query: &str) -> Vec<Result<(String, String), String>> {
    let decode = |s: &str| {
        let s = s.replace('+', " ");
        percent_encoding::percent_decode_str(&s)
            .decode_utf8()
            .map(|d| d.into_owned())
            .map_err(|_| "a query parameter is not UTF-8".to_owned())
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(name)?, decode(value)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_pairs_are_decoded() {
        let pairs: Vec<_> = query_pairs("audience=a%20b&&require_second_factor=true&x")
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            pairs,
            [
                ("audience".to_owned(), "a b".to_owned()),
                ("require_second_factor".to_owned(), "true".to_owned()),
                ("x".to_owned(), String::new()),
            ]
        );
        assert!(query_pairs("a=%ff")[0].is_err());
    }
}
