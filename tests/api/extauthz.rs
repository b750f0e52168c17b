//! Envoy's external authorization (`envoy.service.auth.v3.Authorization/Check`)
//! through a tonic client built from envoy-types: a valid token passes with the
//! identity headers and the client's forged ones removed; every bad token, a missing
//! one, an ended session and a missing second factor are refused with the right
//! HTTP status and `WWW-Authenticate` challenge; the route's policy comes from
//! `context_extensions`; the call is a method like any for the rate limits.

use crate::helpers::{
    TEST_KEY, TEST_KID, TestApp, TestDb, expect_code, metric, spawn_app_on, spawn_app_with,
};
use crate::totp::{K1, app_on, challenge, code_at, complete, enroll, now};
use authd::{ManualClock, pb::LogoutRequest};
use envoy_types::pb::envoy::{
    config::core::v3::{HeaderMap, HeaderValue},
    service::auth::v3::{
        AttributeContext, CheckRequest, CheckResponse, attribute_context,
        authorization_client::AuthorizationClient, check_response::HttpResponse,
    },
};
use std::{collections::HashMap, sync::Arc};
use tonic::Code;

crate::backend_tests!(
    a_valid_token_passes_with_the_identity_headers_and_no_forged_ones,
    bad_missing_and_ended_tokens_are_refused_with_a_bearer_challenge,
    a_disabled_users_tokens_are_refused_at_once,
);

/// One Check of a request with `headers`, on a route whose policy is `policy`.
pub(crate) async fn check(
    app: &TestApp,
    headers: &[(&str, &str)],
    policy: &[(&str, &str)],
) -> Result<CheckResponse, tonic::Status> {
    let owned = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let request = CheckRequest {
        attributes: Some(AttributeContext {
            request: Some(attribute_context::Request {
                http: Some(attribute_context::HttpRequest {
                    method: "GET".into(),
                    path: "/orders/1".into(),
                    headers: owned(headers),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            context_extensions: owned(policy),
            ..Default::default()
        }),
    };
    AuthorizationClient::new(app.channel().await)
        .check(request)
        .await
        .map(|r| r.into_inner())
}

/// What an allowed Check tells Envoy: headers set, headers removed.
struct Allowed {
    set: HashMap<String, String>,
    removed: Vec<String>,
    metadata: Option<envoy_types::pb::google::protobuf::Struct>,
}

fn allowed(response: CheckResponse) -> Allowed {
    assert_eq!(
        response.status.as_ref().map(|s| s.code),
        Some(0),
        "{response:?}"
    );
    let Some(HttpResponse::OkResponse(ok)) = response.http_response else {
        panic!("not allowed: {response:?}");
    };
    let set = ok
        .headers
        .iter()
        .map(|h| {
            let header = h.header.as_ref().unwrap();
            // Replaces whatever the client sent under that name.
            assert_eq!(h.append_action, 2, "{h:?}");
            (header.key.clone(), header.value.clone())
        })
        .collect();
    Allowed {
        set,
        removed: ok.headers_to_remove,
        metadata: response.dynamic_metadata,
    }
}

/// The refusal of a request with `headers` on a route of `policy`.
async fn refused(
    app: &TestApp,
    headers: Vec<(&'static str, String)>,
    policy: Vec<(&'static str, &'static str)>,
) -> (i32, Option<String>, i32) {
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    denied(check(app, &headers, &policy).await.unwrap())
}

/// The HTTP status, `WWW-Authenticate` and google.rpc code of a refusal.
fn denied(response: CheckResponse) -> (i32, Option<String>, i32) {
    let code = response.status.as_ref().map_or(0, |s| s.code);
    let Some(HttpResponse::DeniedResponse(denied)) = response.http_response else {
        panic!("not denied: {response:?}");
    };
    let challenge = denied
        .headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .find(|h| h.key == "www-authenticate")
        .map(|h| h.value.clone());
    (denied.status.unwrap().code, challenge, code)
}

/// Asserts the decision counters of `api` (`grpc` or `http`): one `(outcome, reason,
/// count)` each.
pub(crate) fn assert_decisions(app: &TestApp, api: &str, expected: &[(&str, &str, f64)]) {
    let metrics = app.handle.render_metrics();
    for (outcome, reason, n) in expected {
        let series = format!(
            r#"authd_authz_decisions_total{{api="{api}",outcome="{outcome}",reason="{reason}"}}"#
        );
        assert_eq!(metric(&metrics, &series), Some(*n), "{series}\n{metrics}");
    }
}

const PASSWORD: &str = "a fine password";
pub(crate) const MISSING: &str = r#"Bearer realm="authd""#;
pub(crate) const INVALID: &str = r#"Bearer realm="authd", error="invalid_token""#;
pub(crate) const STEP_UP: &str =
    r#"Bearer realm="authd", error="insufficient_user_authentication""#;

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn a_valid_token_passes_with_the_identity_headers_and_no_forged_ones(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let user_id = app.register("ada", PASSWORD).await.unwrap();
    let login = app.login("ada", PASSWORD).await.unwrap();
    let authorization = bearer(&login.access_token);
    let answer = check(
        &app,
        &[
            ("authorization", &authorization),
            ("x-authd-user-id", "someone-else"),
            ("x-authd-role", "admin"),
            ("x-request-id", "r-1"),
        ],
        &[],
    )
    .await
    .unwrap();
    let ok = allowed(answer);
    assert_eq!(ok.set["x-authd-user-id"], user_id);
    assert_eq!(ok.set["x-authd-username"], "ada");
    assert_eq!(ok.set["x-authd-session-id"], login.session_id);
    assert_eq!(ok.set["x-authd-amr"], "pwd");
    assert_eq!(ok.set.len(), 4, "no audience configured: {:?}", ok.set);
    // The client's header of the prefix that is not set goes; so does any identity
    // header not set this time; what is set replaces the client's.
    assert!(ok.removed.contains(&"x-authd-role".to_owned()));
    assert!(ok.removed.contains(&"x-authd-audience".to_owned()));
    assert!(!ok.removed.iter().any(|r| ok.set.contains_key(r)));
    assert!(!ok.removed.contains(&"x-request-id".to_owned()));
    assert!(!ok.removed.contains(&"authorization".to_owned()));
    let metadata = ok.metadata.expect("the claims as dynamic metadata");
    let user = metadata.fields["user_id"].kind.as_ref().unwrap();
    assert_eq!(
        *user,
        envoy_types::pb::google::protobuf::value::Kind::StringValue(user_id.clone())
    );

    // The scheme is case-insensitive (RFC 6750 / RFC 9110).
    let lower = format!("bearer {}", login.access_token);
    allowed(
        check(&app, &[("authorization", &lower)], &[])
            .await
            .unwrap(),
    );

    let metrics = app.handle.render_metrics();
    let series = r#"authd_authz_decisions_total{api="grpc",outcome="allow",reason="valid"}"#;
    assert_eq!(metric(&metrics, series), Some(2.0), "{metrics}");
    let series = r#"authd_grpc_requests_total{code="OK",method="Check",protocol="grpc",service="envoy.service.auth.v3.Authorization"}"#;
    assert_eq!(metric(&metrics, series), Some(2.0), "{metrics}");
}

async fn bad_missing_and_ended_tokens_are_refused_with_a_bearer_challenge(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    app.register("bob", PASSWORD).await.unwrap();
    let login = app.login("bob", PASSWORD).await.unwrap();
    let token = login.access_token.clone();
    let mut tampered = token.clone().into_bytes();
    let last = tampered.len() - 2;
    tampered[last] = if tampered[last] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).unwrap();
    let expired = signed_token("u-1", "bob", -3600, &["pwd"]);

    let unauthenticated = 16;
    assert_eq!(
        refused(&app, vec![], vec![]).await,
        (401, Some(MISSING.into()), unauthenticated)
    );
    assert_eq!(
        refused(
            &app,
            vec![("authorization", "Basic Ym9iOnB3".into())],
            vec![]
        )
        .await,
        (401, Some(MISSING.into()), unauthenticated)
    );
    for (what, value) in [
        ("tampered", bearer(&tampered)),
        ("expired", bearer(&expired)),
        ("garbage", "Bearer not.a.token".to_owned()),
        ("empty", "Bearer ".to_owned()),
    ] {
        assert_eq!(
            refused(&app, vec![("authorization", value)], vec![]).await,
            (401, Some(INVALID.into()), unauthenticated),
            "{what}"
        );
    }
    // A route for another audience: the token names none.
    assert_eq!(
        refused(
            &app,
            vec![("authorization", bearer(&token))],
            vec![("audience", "orders")]
        )
        .await,
        (401, Some(INVALID.into()), unauthenticated)
    );
    // Allowed until its session ends, then refused at once.
    allowed(
        check(&app, &[("authorization", &bearer(&token))], &[])
            .await
            .unwrap(),
    );
    app.client
        .logout(LogoutRequest {
            access_token: token.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(
        refused(&app, vec![("authorization", bearer(&token))], vec![]).await,
        (401, Some(INVALID.into()), unauthenticated)
    );

    let metrics = app.handle.render_metrics();
    for (reason, n) in [
        ("missing_token", 2.0),
        ("bad_signature", 1.0),
        ("expired", 1.0),
        ("malformed", 2.0),
        ("wrong_audience", 1.0),
        ("revoked", 1.0),
    ] {
        let series = format!(
            r#"authd_authz_decisions_total{{api="grpc",outcome="deny",reason="{reason}"}}"#
        );
        assert_eq!(metric(&metrics, &series), Some(n), "{series}\n{metrics}");
    }
}

async fn a_disabled_users_tokens_are_refused_at_once(db: TestDb) {
    let mut admin = crate::admin::admin_app(&db, |_| {}).await;
    admin.app.register("dora", PASSWORD).await.unwrap();
    let token = admin
        .app
        .login("dora", PASSWORD)
        .await
        .unwrap()
        .access_token;
    // A token signed later, with no session: the per-user cutoff refuses it too.
    let signed = admin.app.validate(&token).await.unwrap();
    let sessionless = signed_token(&signed.user_id, "dora", 600, &["pwd"]);
    for token in [&token, &sessionless] {
        allowed(
            check(&admin.app, &[("authorization", &bearer(token))], &[])
                .await
                .unwrap(),
        );
    }
    use authd::pb::admin::{DisableUserRequest, UserSelector, user_selector::Selector};
    let mut request = tonic::Request::new(DisableUserRequest {
        user: Some(UserSelector {
            selector: Some(Selector::Username("dora".into())),
        }),
        reason: "left the company".into(),
    });
    let key = format!("Bearer {}", crate::admin::ADMIN_KEY);
    request
        .metadata_mut()
        .insert("authorization", key.parse().unwrap());
    admin.client.disable_user(request).await.unwrap();
    for token in [&token, &sessionless] {
        assert_eq!(
            refused(&admin.app, vec![("authorization", bearer(token))], vec![]).await,
            (401, Some(INVALID.into()), Code::Unauthenticated as i32)
        );
    }
}

#[tokio::test]
async fn a_route_that_needs_a_second_factor_refuses_a_password_only_sign_in() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite, "")
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::new());
    let mut app = app_on(&db, K1, &clock, |_| {}).await;
    let eve = enroll(&mut app, &clock, "eve").await;
    let policy = [("require_second_factor", "true")];
    let (status, challenge_header, code) = denied(
        check(&app, &[("authorization", &bearer(&eve.token))], &policy)
            .await
            .unwrap(),
    );
    assert_eq!(
        (status, challenge_header.as_deref(), code),
        (403, Some(STEP_UP), Code::PermissionDenied as i32)
    );
    // Without the requirement, the same token passes.
    allowed(
        check(&app, &[("authorization", &bearer(&eve.token))], &[])
            .await
            .unwrap(),
    );
    let pending = challenge(&mut app.client, "eve").await;
    let signed_in = complete(
        &mut app.client,
        &pending,
        &code_at(&eve.secret, now(&clock)),
    )
    .await
    .unwrap();
    let ok = allowed(
        check(
            &app,
            &[("authorization", &bearer(&signed_in.access_token))],
            &policy,
        )
        .await
        .unwrap(),
    );
    assert_eq!(ok.set["x-authd-amr"], "pwd,otp");
    assert_eq!(ok.set["x-authd-user-id"], eve.user_id);
}

#[tokio::test]
async fn anonymous_routes_strip_every_identity_header_and_bad_policies_fail_closed() {
    let mut app = spawn_app_with(|c| {
        c.authz.authz_header_prefix = "x-user-".into();
        c.authz.authz_strip_authorization = authd::config::Switch::On;
        c.authz.authz_realm = "orders".into();
    })
    .await;
    app.register("cyd", PASSWORD).await.unwrap();
    let token = app.login("cyd", PASSWORD).await.unwrap().access_token;
    let anonymous = [("allow_anonymous", "true")];
    let ok = allowed(
        check(&app, &[("x-user-user-id", "forged")], &anonymous)
            .await
            .unwrap(),
    );
    assert!(ok.set.is_empty(), "{:?}", ok.set);
    for name in ["user-id", "username", "session-id", "amr", "audience"] {
        assert!(ok.removed.contains(&format!("x-user-{name}")), "{name}");
    }
    assert!(ok.metadata.is_none());
    // A bad token is refused even where anonymous requests pass.
    let (status, challenge_header, _) = denied(
        check(&app, &[("authorization", "Bearer x.y.z")], &anonymous)
            .await
            .unwrap(),
    );
    assert_eq!(status, 401);
    assert_eq!(
        challenge_header.as_deref(),
        Some(r#"Bearer realm="orders", error="invalid_token""#)
    );
    // A valid one passes with its identity, and the credential stays here.
    let ok = allowed(
        check(&app, &[("authorization", &bearer(&token))], &anonymous)
            .await
            .unwrap(),
    );
    assert_eq!(ok.set["x-user-username"], "cyd");
    assert!(ok.removed.contains(&"authorization".to_owned()));

    // A policy authd does not know is a misconfigured route: refused, never let through.
    for policy in [
        [("allow_anonymus", "true")],
        [("allow_anonymous", "yes")],
        [("require_second_factor", "1")],
    ] {
        let (status, challenge_header, code) = denied(
            check(&app, &[("authorization", &bearer(&token))], &policy)
                .await
                .unwrap(),
        );
        assert_eq!(
            (status, challenge_header, code),
            (500, None, Code::Internal as i32)
        );
    }
    let metrics = app.handle.render_metrics();
    let series = r#"authd_authz_decisions_total{api="grpc",outcome="deny",reason="bad_policy"}"#;
    assert_eq!(metric(&metrics, series), Some(3.0), "{metrics}");
    let series = r#"authd_authz_decisions_total{api="grpc",outcome="allow",reason="anonymous"}"#;
    assert_eq!(metric(&metrics, series), Some(1.0), "{metrics}");
}

/// A Check of Envoy's raw headers (`encode_raw_headers`): the list in `header_map`,
/// values in `raw_value`, repeated names kept; `headers` is then empty.
async fn check_raw(
    app: &TestApp,
    headers: &[(&str, &[u8])],
    policy: HashMap<String, String>,
) -> CheckResponse {
    let header_map = HeaderMap {
        headers: headers
            .iter()
            .map(|(key, value)| HeaderValue {
                key: key.to_string(),
                raw_value: value.to_vec(),
                ..Default::default()
            })
            .collect(),
    };
    let request = CheckRequest {
        attributes: Some(AttributeContext {
            request: Some(attribute_context::Request {
                http: Some(attribute_context::HttpRequest {
                    header_map: Some(header_map),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            context_extensions: policy,
            ..Default::default()
        }),
    };
    AuthorizationClient::new(app.channel().await)
        .check(request)
        .await
        .unwrap()
        .into_inner()
}

#[tokio::test]
async fn raw_headers_are_read_and_a_second_credential_is_refused() {
    let mut app = spawn_app_with(|_| {}).await;
    app.register("dee", PASSWORD).await.unwrap();
    let token = bearer(&app.login("dee", PASSWORD).await.unwrap().access_token);
    let ok = allowed(
        check_raw(
            &app,
            &[
                ("Authorization", token.as_bytes()),
                ("X-Authd-Username", b"forged"),
                ("x-authd-team", b"ops"),
            ],
            HashMap::new(),
        )
        .await,
    );
    assert_eq!(ok.set["x-authd-username"], "dee");
    // Set over the forged one, never removed after it is set.
    assert!(!ok.removed.contains(&"x-authd-username".to_owned()));
    assert!(
        ok.removed.contains(&"x-authd-team".to_owned()),
        "{:?}",
        ok.removed
    );

    // Two credentials (whichever the upstream reads is a guess), or one that is not
    // text: refused as a malformed token, never as a missing one.
    for headers in [
        vec![
            ("authorization", token.as_bytes()),
            ("authorization", token.as_bytes()),
        ],
        vec![("authorization", &b"Bearer \xff\xfe"[..])],
    ] {
        let (status, challenge_header, _) = denied(check_raw(&app, &headers, HashMap::new()).await);
        assert_eq!((status, challenge_header.as_deref()), (401, Some(INVALID)));
    }
    let metrics = app.handle.render_metrics();
    let series = r#"authd_authz_decisions_total{api="grpc",outcome="deny",reason="malformed"}"#;
    assert_eq!(metric(&metrics, series), Some(2.0), "{metrics}");
}

#[tokio::test]
async fn check_is_rate_limited_by_rules_that_name_it() {
    let app = spawn_app_with(|c| {
        c.limits.rate_limits = Some("Check:global=2/1h".parse().unwrap());
    })
    .await;
    for _ in 0..2 {
        denied(check(&app, &[], &[]).await.unwrap());
    }
    let status = expect_code(check(&app, &[], &[]).await, Code::ResourceExhausted);
    assert!(status.metadata().get("retry-after").is_some());
    // ValidateToken is not counted by a Check rule.
    let signed = signed_token("u-2", "dee", 600, &["pwd"]);
    let mut app = app;
    app.validate(&signed).await.unwrap();
}

/// A token signed here with the test key, expiring `expires_in` seconds from now
/// (negative: already expired), issued an hour before that.
pub(crate) fn signed_token(sub: &str, name: &str, expires_in: i64, amr: &[&str]) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let claims = serde_json::json!({
        "sub": sub,
        "name": name,
        "iss": "authd",
        "iat": now + expires_in - 3600,
        "exp": now + expires_in,
        "amr": amr,
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some(TEST_KID.into());
    jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(TEST_KEY),
    )
    .unwrap()
}
