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

use super::{Authorizer, Decision, Policy, identity_header_names, identity_headers};
use crate::{
    error::Denial,
    pb::envoy_auth::{
        CheckRequest, CheckResponse, DeniedHttpResponse, OkHttpResponse,
        authorization_server::{Authorization, AuthorizationServer},
        check_response::HttpResponse,
    },
    rpc::{AuthzDecision, MAX_CHECK_REQUEST_BYTES, UserId},
    token::VerifiedToken,
};
use envoy_types::pb::{
    envoy::{
        config::core::v3::{HeaderValue, HeaderValueOption, header_value_option},
        r#type::v3::HttpStatus,
    },
    google::{
        protobuf::{ListValue, Struct, Value, value::Kind},
        rpc,
    },
};
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
        let attributes = check.attributes.unwrap_or_default();
        let http = attributes.request.and_then(|r| r.http).unwrap_or_default();
        // Envoy sends the headers as a map, or (`encode_raw_headers`) as a list.
        let mut headers: Vec<(String, String)> = http.headers.into_iter().collect();
        if let Some(map) = http.header_map {
            headers.extend(map.headers.into_iter().map(|h| {
                let value = if h.raw_value.is_empty() {
                    h.value
                } else {
                    String::from_utf8_lossy(&h.raw_value).into_owned()
                };
                (h.key, value)
            }));
        }
        let authorization = headers
            .iter()
            .find(|(name, _)| name.eq_ignore_ascii_case("authorization"))
            .map(|(_, value)| value.as_str());
        let policy = Policy::parse(
            attributes
                .context_extensions
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        );
        let decision = self.authorizer.decide("grpc", authorization, policy);
        let logged = AuthzDecision {
            outcome: decision.outcome(),
            reason: decision.reason(),
        };
        let mut user = None;
        let answer = match decision {
            Decision::Allow(token) => {
                user = token.as_ref().map(|t| UserId(t.user_id.clone()));
                self.allowed(token.as_ref(), &headers)
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
    fn allowed(&self, token: Option<&VerifiedToken>, sent: &[(String, String)]) -> CheckResponse {
        let settings = self.authorizer.settings();
        let set = token
            .map(|t| identity_headers(&settings.header_prefix, t))
            .unwrap_or_default();
        // The client's headers of the prefix that are not overwritten below: all of
        // them go. The ones set are never listed, so whatever order Envoy applies
        // removals and sets in, what is set stays.
        let mut headers_to_remove: Vec<String> = sent
            .iter()
            .map(|(name, _)| name.to_ascii_lowercase())
            .filter(|name| name.starts_with(&settings.header_prefix))
            .filter(|name| !set.iter().any(|(s, _)| s == name))
            .collect();
        // And the identity headers even when absent from the map Envoy sent (it may
        // be cut to `allowed_headers`): removing a header not there is a no-op.
        for name in identity_header_names(&settings.header_prefix) {
            if !set.iter().any(|(s, _)| *s == name) && !headers_to_remove.contains(&name) {
                headers_to_remove.push(name);
            }
        }
        if settings.strip_authorization {
            headers_to_remove.push("authorization".to_owned());
        }
        headers_to_remove.sort();
        headers_to_remove.dedup();
        let headers = set
            .into_iter()
            .map(|(key, value)| HeaderValueOption {
                header: Some(HeaderValue {
                    key,
                    value,
                    ..Default::default()
                }),
                append_action: header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd
                    as i32,
                ..Default::default()
            })
            .collect();
        CheckResponse {
            status: Some(rpc::Status {
                code: tonic::Code::Ok as i32,
                ..Default::default()
            }),
            dynamic_metadata: token.map(claims),
            http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                headers,
                headers_to_remove,
                ..Default::default()
            })),
        }
    }

    fn denied(&self, denial: Denial) -> CheckResponse {
        let headers = denial
            .challenge(&self.authorizer.settings().realm)
            .map(|challenge| HeaderValueOption {
                header: Some(HeaderValue {
                    key: "www-authenticate".to_owned(),
                    value: challenge,
                    ..Default::default()
                }),
                append_action: header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd
                    as i32,
                ..Default::default()
            })
            .into_iter()
            .collect();
        CheckResponse {
            // The code only: why a token was refused goes to metrics and the log.
            status: Some(rpc::Status {
                code: denial.code() as i32,
                ..Default::default()
            }),
            dynamic_metadata: None,
            http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                status: Some(HttpStatus {
                    code: i32::from(denial.http_status()),
                }),
                headers,
                body: String::new(),
            })),
        }
    }
}

/// The token's claims, for Envoy's `dynamic_metadata` (under the ext_authz
/// filter's namespace): `user_id`, `username`, `session_id`, `amr`, `audience`,
/// `expires_at` (Unix seconds).
fn claims(token: &VerifiedToken) -> Struct {
    let string = |s: &str| Value {
        kind: Some(Kind::StringValue(s.to_owned())),
    };
    let list = |items: &[String]| Value {
        kind: Some(Kind::ListValue(ListValue {
            values: items.iter().map(|s| string(s)).collect(),
        })),
    };
    let expires_at = token
        .expires_at
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs() as f64);
    let mut fields = std::collections::HashMap::new();
    fields.insert("user_id".to_owned(), string(&token.user_id));
    fields.insert("username".to_owned(), string(&token.username));
    if let Some(session) = &token.session_id {
        fields.insert("session_id".to_owned(), string(session));
    }
    fields.insert("amr".to_owned(), list(&token.amr));
    fields.insert("audience".to_owned(), list(&token.audience));
    fields.insert(
        "expires_at".to_owned(),
        Value {
            kind: Some(Kind::NumberValue(expires_at)),
        },
    );
    Struct { fields }
}
