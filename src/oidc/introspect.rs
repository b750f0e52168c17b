//! `POST /oauth2/introspect` (RFC 7662): an authenticated client asks whether an
//! access token is active and what it says.
//!
//! The client is checked first (`clients`): no credential or a wrong one answers
//! 401 with `WWW-Authenticate: Basic realm="authd"`, whatever the token. The token
//! is then checked exactly as ValidateToken checks it (signature, expiry, issuer,
//! and the sessions and accounts ended on this replica: logout, password change,
//! disabled or deleted user); anything but an active access token answers
//! `{"active":false}` (refresh tokens included: they are opaque to everyone but
//! authd). The token never reaches a log.

use super::{Endpoints, INTROSPECT, form};
use axum::{
    body::Body,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    response::Response,
};
use serde_json::{Map, Value, json};
use std::{sync::Arc, time::UNIX_EPOCH};

pub(super) async fn introspect(
    State(endpoints): State<Arc<Endpoints>>,
    request: Request<Body>,
) -> Response {
    let (parts, body) = request.into_parts();
    let metrics = &endpoints.metrics;
    if let Err(refused) = form::rate_limit(&endpoints.rate_limiter, INTROSPECT, &parts, None).await
    {
        return refused;
    }
    let Some(client) = (endpoints.settings.clients).authenticate(&parts.headers, &parts.extensions)
    else {
        metrics.introspection("unauthorized");
        let mut response = form::error(
            StatusCode::UNAUTHORIZED,
            "invalid_client",
            "client authentication failed",
        );
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"authd\""),
        );
        return response;
    };
    let form = match form::read(&parts, body, endpoints.receive_timeout).await {
        Ok(form) => form,
        Err(refused) => {
            metrics.introspection("bad_request");
            return refused;
        }
    };
    let Some(token) = form.get("token") else {
        metrics.introspection("bad_request");
        return form::invalid_request("the token parameter is missing");
    };
    // `token_type_hint` may be anything (RFC 7662 §2.1): only access tokens can be
    // active here, whatever it says.
    let answer = match endpoints.accounts.validate(token, None) {
        Ok(verified) => {
            metrics.introspection("active");
            tracing::debug!(
                client,
                user_id = verified.user_id,
                "token introspected: active"
            );
            active(verified, endpoints.settings.issuer.as_deref())
        }
        Err(_) => {
            metrics.introspection("inactive");
            tracing::debug!(client, "token introspected: inactive");
            json!({"active": false})
        }
    };
    form::token_answer(StatusCode::OK, &answer)
}

/// The answer for an active token: RFC 7662 §2.2's members, and authd's own claims
/// under their JWT names.
fn active(token: crate::token::VerifiedToken, issuer_url: Option<&str>) -> Value {
    let service = crate::accounts::is_service_token(&token);
    let mut answer = Map::new();
    answer.insert("active".into(), true.into());
    answer.insert("token_type".into(), "Bearer".into());
    answer.insert("sub".into(), token.user_id.into());
    answer.insert("username".into(), token.username.clone().into());
    answer.insert("name".into(), token.username.into());
    let issuer = match (token.issuer_url, issuer_url) {
        (true, Some(url)) => url,
        _ => crate::token::ISSUER,
    };
    answer.insert("iss".into(), issuer.into());
    answer.insert("iat".into(), token.issued_at.into());
    let exp = (token.expires_at.duration_since(UNIX_EPOCH))
        .map(|d| d.as_secs())
        .unwrap_or(0);
    answer.insert("exp".into(), exp.into());
    if let Some(nbf) = token.not_before {
        answer.insert("nbf".into(), nbf.into());
    }
    match token.audience.as_slice() {
        [] => {}
        [one] => {
            answer.insert("aud".into(), one.clone().into());
        }
        many => {
            answer.insert("aud".into(), many.to_vec().into());
        }
    }
    if let Some(sid) = token.session_id {
        answer.insert("sid".into(), sid.into());
    }
    if let Some(jti) = token.token_id {
        answer.insert("jti".into(), jti.into());
    }
    if !service {
        answer.insert("amr".into(), token.amr.into());
    }
    if let Some(client_id) = token.client_id {
        answer.insert("client_id".into(), client_id.into());
    }
    if !token.scopes.is_empty() {
        answer.insert("scope".into(), token.scopes.join(" ").into());
    }
    if let Some(actor) = token.actor {
        answer.insert(
            "act".into(),
            serde_json::to_value(actor).unwrap_or(Value::Null),
        );
    }
    Value::Object(answer)
}
