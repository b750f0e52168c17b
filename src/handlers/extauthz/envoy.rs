//! `envoy.service.auth.v3.Authorization/Check`: Envoy's external authorization
//! over gRPC, on the gRPC port behind every layer (trace, mutual-TLS allow-list,
//! rate limits, admission), as any RPC.
//!
//! The call itself answers OK with the decision in the CheckResponse, as Envoy
//! expects: `status` OK and an `OkHttpResponse` that sets the identity headers
//! (replacing any the client sent), removes every other header of the prefix the
//! client sent (and `authorization` when so configured), with the claims in
//! `dynamic_metadata` for later filters; or a `google.rpc` code and a
//! `DeniedHttpResponse` with the HTTP status and `WWW-Authenticate` challenge.
//! The route's policy is read from `context_extensions` (see `Policy`).

use super::{
    Authorizer, Decision, IDENTITY_HEADERS, Policy, UNREADABLE, identity_values,
    wire::{
        CheckRequest, CheckResponse, DeniedHttpResponse, Field, HeaderValueOption, HttpResponse,
        HttpStatus, Kind, ListValue, OkHttpResponse, RpcStatus, Struct, Value,
    },
};
use crate::{
    error::Denial,
    pb::envoy_auth::authorization_server::{Authorization, AuthorizationServer},
    rpc::{AuthzDecision, MAX_CHECK_REQUEST_BYTES, UserId},
    token::VerifiedToken,
};
use bytes::Bytes;
use std::{sync::Arc, time::UNIX_EPOCH};
use tonic::{Request, Response, Status};

/// Envoy's Authorization service, deciding with the shared [`Authorizer`].
pub(crate) struct AuthorizationApi {
    authorizer: Arc<Authorizer>,
}

impl AuthorizationApi {
    pub(crate) fn server(authorizer: Arc<Authorizer>) -> AuthorizationServer<Self> {
        AuthorizationServer::new(Self { authorizer })
            .max_decoding_message_size(MAX_CHECK_REQUEST_BYTES)
    }
}

#[tonic::async_trait]
impl Authorization for AuthorizationApi {
    async fn check(
        &self,
        request: Request<CheckRequest>,
    ) -> Result<Response<CheckResponse>, Status> {
        let check = request.into_inner();
        // Envoy sends one `authorization` header (it joins repeated ones); two, or
        // one that is not text, is a credential that cannot be read.
        let mut credentials = check
            .headers()
            .filter(|(name, _)| name.eq_ignore_ascii_case(b"authorization"))
            .map(|(_, value)| value);
        let authorization = match (credentials.next(), credentials.next()) {
            (None, _) => None,
            (Some(value), None) => Some(std::str::from_utf8(value).unwrap_or(UNREADABLE)),
            (Some(_), Some(_)) => Some(UNREADABLE),
        };
        let policy = check
            .context_extensions()
            .iter()
            .map(|entry| {
                match (
                    std::str::from_utf8(&entry.key),
                    std::str::from_utf8(&entry.value),
                ) {
                    (Ok(key), Ok(value)) => Ok((key, value)),
                    _ => Err("a context extension that is not text".to_owned()),
                }
            })
            .collect::<Result<Vec<_>, _>>()
            .and_then(Policy::parse);
        let decision = self.authorizer.decide("grpc", authorization, policy);
        let logged = AuthzDecision {
            outcome: decision.outcome(),
            reason: decision.reason(),
        };
        let mut user = None;
        let answer = match decision {
            Decision::Allow(token) => {
                user = token.as_ref().map(|t| UserId(t.user_id.clone()));
                self.allowed(token.map(|t| *t), &check)
            }
            Decision::Deny(denial) => self.denied(denial),
        };
        let mut response = Response::new(answer);
        response.extensions_mut().insert(logged);
        if let Some(user) = user {
            response.extensions_mut().insert(user);
        }
        Ok(response)
    }
}

impl AuthorizationApi {
    fn allowed(&self, token: Option<VerifiedToken>, check: &CheckRequest) -> CheckResponse {
        let settings = self.authorizer.settings();
        let names = self.authorizer.header_names();
        let values: [Option<Bytes>; IDENTITY_HEADERS] = match &token {
            Some(token) => identity_values(token).map(|v| v.map(|v| Bytes::from(v.into_owned()))),
            None => Default::default(),
        };
        let mut headers = Vec::with_capacity(names.len());
        // The identity headers not set are removed even when absent from the map
        // Envoy sent (it may be cut to `allowed_headers`): removing a header that is
        // not there is a no-op.
        let mut headers_to_remove = Vec::new();
        for (name, value) in names.iter().zip(&values) {
            match value {
                Some(value) => {
                    headers.push(HeaderValueOption::overwrite(name.clone(), value.clone()))
                }
                None => headers_to_remove.push(name.clone()),
            }
        }
        // And every other header of the prefix the client sent. The ones set are
        // never listed, so whatever order Envoy applies removals and sets in, what
        // is set stays. A name that is not text is no header a proxy passes on (and
        // would not be a `string` on the wire): skipped.
        let prefix = settings.header_prefix.as_bytes();
        for (name, _) in check.headers() {
            if std::str::from_utf8(name).is_err() {
                continue;
            }
            let prefixed =
                name.len() >= prefix.len() && name[..prefix.len()].eq_ignore_ascii_case(prefix);
            let set = || {
                names
                    .iter()
                    .zip(&values)
                    .any(|(n, v)| v.is_some() && n.eq_ignore_ascii_case(name))
            };
            if prefixed && !set() {
                headers_to_remove.push(Bytes::from(name.to_ascii_lowercase()));
            }
        }
        if settings.strip_authorization {
            headers_to_remove.push(Bytes::from_static(b"authorization"));
        }
        headers_to_remove.sort_unstable();
        headers_to_remove.dedup();
        CheckResponse {
            status: Some(RpcStatus {
                code: tonic::Code::Ok as i32,
            }),
            dynamic_metadata: token.map(|token| claims(token, &values)),
            http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                headers,
                headers_to_remove,
            })),
        }
    }

    fn denied(&self, denial: Denial) -> CheckResponse {
        let headers = denial
            .challenge(&self.authorizer.settings().realm)
            .map(|challenge| {
                HeaderValueOption::overwrite(
                    Bytes::from_static(b"www-authenticate"),
                    Bytes::from(challenge),
                )
            })
            .into_iter()
            .collect();
        CheckResponse {
            // The code only: why a token was refused goes to metrics and the log.
            status: Some(RpcStatus {
                code: denial.code() as i32,
            }),
            dynamic_metadata: None,
            http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                status: Some(HttpStatus {
                    code: i32::from(denial.http_status()),
                }),
                headers,
            })),
        }
    }
}

/// The token's claims, for Envoy's `dynamic_metadata` (under the ext_authz
/// filter's namespace): `client_id` and `service_id` of a service, `user_id`,
/// `username`, `session_id` and `amr` of a user, `audience`, `expires_at` (Unix
/// seconds). `values` are the token's identity header values (`identity_values`),
/// shared rather than copied where they are the same: a field is set exactly when
/// its header is, so a service's token names no user and no sign-in method.
fn claims(token: VerifiedToken, values: &[Option<Bytes>; IDENTITY_HEADERS]) -> Struct {
    let text = |value: Bytes| Kind::String(value);
    let list = |items: Vec<String>| {
        Kind::List(ListValue {
            values: items
                .into_iter()
                .map(|item| Value {
                    kind: Some(Kind::String(Bytes::from(item))),
                })
                .collect(),
        })
    };
    let expires_at = token
        .expires_at
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs() as f64);
    let [
        user_id,
        username,
        session_id,
        amr,
        _,
        client_id,
        service_id,
        ..,
    ] = values;
    let mut fields = Vec::with_capacity(8);
    if let Some(client_id) = client_id {
        fields.push(Field::new("client_id", text(client_id.clone())));
    }
    if let Some(service_id) = service_id {
        fields.push(Field::new("service_id", text(service_id.clone())));
    }
    if let Some(user_id) = user_id {
        fields.push(Field::new("user_id", text(user_id.clone())));
    }
    if let Some(username) = username {
        fields.push(Field::new("username", text(username.clone())));
    }
    if let Some(session_id) = session_id {
        fields.push(Field::new("session_id", text(session_id.clone())));
    }
    // As its header: a user's sign-in methods, never a service's (whose token has
    // no `amr`, read as `pwd` for users' tokens issued before it existed).
    if amr.is_some() {
        fields.push(Field::new("amr", list(token.amr)));
    }
    fields.push(Field::new("audience", list(token.audience)));
    fields.push(Field::new("expires_at", Kind::Number(expires_at)));
    Struct { fields }
}
