//! `POST /oauth2/revoke` (RFC 7009): the token is the credential, so no client
//! authentication. A refresh token ends its session as Logout does; an access
//! token that carries its session (`sid`) ends that session too; an access token
//! without one, or a token that is unknown, malformed, expired or of a session
//! already ended, changes nothing and answers 200 all the same (§2.2: the client
//! cannot tell, and need not). Only the form bound and the rate limit refuse; a
//! store that does not answer is a 503, so the client knows to retry.

use super::{Endpoints, REVOKE, form};
use crate::{audit::Caller, error::Error, rpc};
use axum::{
    body::Body,
    extract::{Request, State},
    http::StatusCode,
    response::Response,
};
use serde_json::json;
use std::sync::Arc;

pub(super) async fn revoke(
    State(endpoints): State<Arc<Endpoints>>,
    request: Request<Body>,
) -> Response {
    let (parts, body) = request.into_parts();
    if let Err(refused) = form::rate_limit(&endpoints.rate_limiter, REVOKE, &parts, None).await {
        return refused;
    }
    let form = match form::read(&parts, body, endpoints.receive_timeout).await {
        Ok(form) => form,
        Err(refused) => return refused,
    };
    let Some(token) = form.get("token") else {
        return form::invalid_request("the token parameter is missing");
    };
    let caller = Caller {
        request_id: (parts.extensions.get::<rpc::RequestId>()).map(|id| id.as_str().to_owned()),
        client: rpc::client_ip(&parts.extensions),
        identity: rpc::client_identity(&parts.extensions).map(|i| i.as_str().to_owned()),
        trace_id: crate::otel::current_trace_id(),
    };
    // A JWT has three dot-separated parts; a refresh token has none.
    let is_access = token.split('.').count() == 3;
    let outcome = if is_access {
        endpoints.accounts.logout(None, Some(token), false, &caller)
    } else {
        endpoints.accounts.logout(Some(token), None, false, &caller)
    }
    .await;
    let metrics = &endpoints.metrics;
    match outcome {
        Ok(ended) if ended > 0 => metrics.revocation("ended"),
        Ok(_) => metrics.revocation("nothing"),
        Err(Error::InvalidToken(_) | Error::InvalidRefreshToken(_) | Error::InvalidArgument(_)) => {
            metrics.revocation("nothing")
        }
        Err(e) => {
            metrics.revocation("failed");
            tracing::warn!(error = %e, "a token revocation could not reach the store");
            return form::unavailable();
        }
    }
    form::token_answer(StatusCode::OK, &json!({}))
}
