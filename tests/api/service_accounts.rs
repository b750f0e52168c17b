//! Service accounts through the real server, on both backends: the admin API
//! creates them, IssueServiceToken and `POST /oauth2/token` grant their tokens
//! (client credentials, token exchange), ValidateToken, Envoy's Check and
//! forward-auth accept them with the service's identity; wrong credentials,
//! audiences and scopes are refused with the right codes; two secrets are live
//! during a rotation and removing one refuses its tokens; disabling and deleting
//! refuse the account's tokens (across two replicas on PostgreSQL); an exchanged
//! token names the service in `act`, its depth is bounded, and the user's logout
//! ends it; concurrent grants with one wrong secret refuse that one only, and the
//! throttle counts it; a replica's copy of an account follows changes made on
//! another.

use crate::admin::{ADMIN_KEY, Admin, admin_app};
use crate::extauthz::check;
use crate::helpers::{
    Backend, TestDb, connect_from, expect_code, http_get, metric, redis_url, spawn_app_on,
    unique_name,
};
use authd::ManualClock;
use authd::pb::{
    IssueServiceTokenRequest, IssueServiceTokenResponse, LogoutRequest,
    admin::{
        AddServiceCredentialRequest, ClientSecret, CreateServiceAccountRequest,
        CreateServiceAccountResponse, DeleteServiceAccountRequest, DisableServiceAccountRequest,
        GetServiceAccountRequest, ListServiceAccountsRequest, RemoveServiceCredentialRequest,
        ServiceAccountSelector, add_service_credential_request, service_account_selector::Selector,
    },
    auth_service_client::AuthServiceClient,
};
use base64::Engine as _;
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use futures::future::join_all;
use serde_json::Value;
use std::{
    collections::HashMap,
    net::{Ipv4Addr, SocketAddr},
    sync::Arc,
    time::Duration,
};
use tonic::{Code, Request, Status, transport::Channel};
use tonic_types::StatusExt as _;

crate::backend_tests!(
    each_grant_gives_a_token_that_validate_check_and_forward_auth_accept,
    wrong_credentials_audiences_and_scopes_are_refused,
    two_secrets_are_live_during_a_rotation_and_a_removed_one_is_refused,
    disabling_and_deleting_refuse_the_accounts_tokens,
    token_exchange_acts_for_the_user_within_its_bounds,
    concurrent_grants_with_one_wrong_secret_refuse_that_one_only,
    a_disable_wins_against_grants_in_flight,
    checks_metadata_names_a_service_as_its_headers_do,
    a_client_id_rule_refuses_the_service_over_it_and_serves_the_others,
    each_grant_is_audited_without_a_secret_or_a_token,
);

const PASSWORD: &str = "a fine password";

fn with_key<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_KEY}").parse().unwrap(),
    );
    request
}

fn by_name(name: &str) -> Option<ServiceAccountSelector> {
    Some(ServiceAccountSelector {
        selector: Some(Selector::Name(name.into())),
    })
}

async fn app(db: &TestDb) -> Admin {
    admin_app(db, |c| {
        c.authz.forward_auth_listen = "127.0.0.1:0".parse().unwrap();
    })
    .await
}

async fn create(
    admin: &mut Admin,
    name: &str,
    audiences: &[&str],
    scopes: &[&str],
) -> CreateServiceAccountResponse {
    let request = CreateServiceAccountRequest {
        name: name.into(),
        audiences: audiences.iter().map(|s| s.to_string()).collect(),
        scopes: scopes.iter().map(|s| s.to_string()).collect(),
        with_secret: true,
        ..Default::default()
    };
    admin
        .client
        .create_service_account(with_key(request))
        .await
        .unwrap()
        .into_inner()
}

async fn grant(
    client: &mut AuthServiceClient<Channel>,
    id: &str,
    secret: &str,
    audience: &str,
    scopes: &[&str],
) -> Result<IssueServiceTokenResponse, Status> {
    client
        .issue_service_token(IssueServiceTokenRequest {
            client_id: id.into(),
            client_secret: secret.into(),
            audience: audience.into(),
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
            subject_token: String::new(),
            client_assertion: String::new(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn exchange(
    client: &mut AuthServiceClient<Channel>,
    id: &str,
    secret: &str,
    subject: &str,
    audience: &str,
) -> Result<IssueServiceTokenResponse, Status> {
    client
        .issue_service_token(IssueServiceTokenRequest {
            client_id: id.into(),
            client_secret: secret.into(),
            audience: audience.into(),
            scopes: Vec::new(),
            subject_token: subject.into(),
            client_assertion: String::new(),
        })
        .await
        .map(|r| r.into_inner())
}

/// A POST of a form to the gRPC port's HTTP face: the status and the JSON body.
async fn post_form(
    addr: SocketAddr,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String, Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/x-www-form-urlencoded\r\n\
         {headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let json = serde_json::from_str(body).unwrap_or(Value::Null);
    (status, head.to_owned(), json)
}

fn basic(id: &str, secret: &str) -> String {
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{id}:{secret}"));
    format!("Authorization: Basic {encoded}\r\n")
}

/// The headers an allowed Check sets.
async fn check_headers(admin: &Admin, token: &str) -> HashMap<String, String> {
    let authorization = format!("Bearer {token}");
    let answer = check(
        &admin.app,
        &[
            ("authorization", &authorization),
            ("x-authd-client-id", "forged"),
        ],
        &[],
    )
    .await
    .unwrap();
    let Some(HttpResponse::OkResponse(ok)) = answer.http_response else {
        panic!("not allowed: {answer:?}");
    };
    ok.headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect()
}

/// The headers an allowed Check sets for `token`, and its dynamic metadata as JSON.
async fn check_answer(admin: &Admin, token: &str) -> (HashMap<String, String>, Value) {
    use envoy_types::pb::google::protobuf::{self as pb, value::Kind};
    fn json_of(value: &pb::Value) -> Value {
        match value.kind.as_ref() {
            Some(Kind::StringValue(text)) => Value::from(text.as_str()),
            Some(Kind::NumberValue(n)) => Value::from(*n),
            Some(Kind::ListValue(list)) => list.values.iter().map(json_of).collect(),
            other => panic!("an unexpected metadata value: {other:?}"),
        }
    }
    let authorization = format!("Bearer {token}");
    let answer = check(&admin.app, &[("authorization", &authorization)], &[])
        .await
        .unwrap();
    let Some(HttpResponse::OkResponse(ok)) = &answer.http_response else {
        panic!("not allowed: {answer:?}");
    };
    let headers = ok
        .headers
        .iter()
        .filter_map(|h| h.header.as_ref())
        .map(|h| (h.key.clone(), h.value.clone()))
        .collect();
    let metadata = answer
        .dynamic_metadata
        .expect("the claims as dynamic metadata");
    let metadata = (metadata.fields.iter())
        .map(|(name, value)| (name.clone(), json_of(value)))
        .collect();
    (headers, metadata)
}

/// The status and the `x-authd-*` headers forward-auth answers for `token`.
async fn forward_auth(admin: &Admin, token: &str) -> (u16, HashMap<String, String>) {
    let addr = admin.app.handle.forward_auth_addr().unwrap();
    let (head, _) = http_get(
        addr,
        "/forward-auth",
        &format!("Authorization: Bearer {token}\r\n"),
    )
    .await;
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let headers = head
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.to_ascii_lowercase().starts_with("x-authd-"))
        .map(|(n, v)| (n.to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    (status, headers)
}

async fn each_grant_gives_a_token_that_validate_check_and_forward_auth_accept(db: TestDb) {
    let mut admin = app(&db).await;
    let made = create(
        &mut admin,
        "Orders",
        &["billing", "stock"],
        &["read", "write"],
    )
    .await;
    let account = made.account.unwrap();
    assert_eq!(account.name, "orders");
    assert_eq!(account.credentials.len(), 1);
    let secret = made.client_secret;
    assert!(
        secret.starts_with("authd_sa_") && secret.len() >= 9 + 43,
        "{secret}"
    );
    // Never shown again.
    let shown = admin
        .client
        .get_service_account(with_key(GetServiceAccountRequest {
            account: by_name("orders"),
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(!format!("{shown:?}").contains(&secret));

    // gRPC: every audience and scope it may have, when none is asked for.
    let mut client = admin.app.client.clone();
    let all = grant(&mut client, "orders", &secret, "", &[])
        .await
        .unwrap();
    assert_eq!(all.token_type, "Bearer");
    assert_eq!(all.audiences, ["billing", "stock"]);
    assert_eq!(all.scopes, ["read", "write"]);
    // One audience and one scope, when asked for.
    let one = grant(&mut client, "orders", &secret, "billing", &["read"])
        .await
        .unwrap();
    assert_eq!(one.audiences, ["billing"]);
    let valid = admin.app.validate(&one.access_token).await.unwrap();
    assert!(valid.service);
    assert_eq!(valid.user_id, account.id);
    assert_eq!(valid.client_id, "orders");
    assert_eq!(valid.username, "");
    assert!(valid.amr.is_empty() && valid.session_id.is_empty());
    assert_eq!(valid.scopes, ["read"]);
    assert_eq!(valid.audiences, ["billing"]);
    // Checked for an audience it is not for: refused.
    let wrong_audience = admin
        .app
        .client
        .clone()
        .validate_token(authd::pb::ValidateTokenRequest {
            access_token: one.access_token.clone(),
            audience: "stock".into(),
            ..Default::default()
        })
        .await;
    expect_code(wrong_audience, Code::Unauthenticated);

    // Envoy's Check: the service's own headers, never a user's, nothing forged.
    let set = check_headers(&admin, &one.access_token).await;
    assert_eq!(set["x-authd-client-id"], "orders");
    assert_eq!(set["x-authd-service-id"], account.id);
    assert_eq!(set["x-authd-scope"], "read");
    assert_eq!(set["x-authd-audience"], "billing");
    assert!(!set.contains_key("x-authd-user-id") && !set.contains_key("x-authd-username"));
    // Forward-auth alike.
    let (status, headers) = forward_auth(&admin, &one.access_token).await;
    assert_eq!(status, 200);
    assert_eq!(headers["x-authd-client-id"], "orders");
    assert_eq!(headers["x-authd-service-id"], account.id);
    assert!(!headers.contains_key("x-authd-user-id"));

    // HTTP: client_secret_basic and client_secret_post.
    let addr = admin.app.addr;
    let (status, head, body) = post_form(
        addr,
        "/oauth2/token",
        &basic("orders", &secret),
        "grant_type=client_credentials&scope=write&audience=stock",
    )
    .await;
    assert_eq!(status, 200, "{head} {body}");
    assert!(
        head.to_ascii_lowercase()
            .contains("cache-control: no-store"),
        "{head}"
    );
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["scope"], "write");
    assert!(body.get("refresh_token").is_none());
    let expires_in = body["expires_in"].as_u64().unwrap();
    assert!(expires_in > 0 && expires_in <= 300, "{body}");
    let token = body["access_token"].as_str().unwrap();
    let valid = admin.app.validate(token).await.unwrap();
    assert_eq!(
        (valid.client_id.as_str(), valid.scopes.as_slice()),
        ("orders", &["write".to_owned()][..])
    );
    let form = format!("grant_type=client_credentials&client_id=orders&client_secret={secret}");
    let (status, _, body) = post_form(addr, "/oauth2/token", "", &form).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = forward_auth(&admin, body["access_token"].as_str().unwrap()).await;
    assert_eq!(status, 200);

    let metrics = admin.app.handle.render_metrics();
    let ok = r#"authd_service_grants_total{grant="client_credentials",outcome="ok"}"#;
    assert_eq!(metric(&metrics, ok), Some(4.0), "{metrics}");
}

async fn wrong_credentials_audiences_and_scopes_are_refused(db: TestDb) {
    let mut admin = app(&db).await;
    let secret = create(&mut admin, "orders", &["billing"], &["read"])
        .await
        .client_secret;
    let other = create(&mut admin, "stock", &[], &[]).await.client_secret;
    let mut client = admin.app.client.clone();
    let wrong = expect_code(
        grant(&mut client, "orders", "authd_sa_not-the-secret", "", &[]).await,
        Code::Unauthenticated,
    );
    // Another account's secret, an unknown client: the same answer.
    let theirs = expect_code(
        grant(&mut client, "orders", &other, "", &[]).await,
        Code::Unauthenticated,
    );
    let unknown = expect_code(
        grant(&mut client, "nobody", &secret, "", &[]).await,
        Code::Unauthenticated,
    );
    assert_eq!(wrong.message(), theirs.message());
    assert_eq!(wrong.message(), unknown.message());
    assert!(!wrong.message().contains(&secret));
    expect_code(
        grant(&mut client, "orders", &secret, "stock", &[]).await,
        Code::PermissionDenied,
    );
    expect_code(
        grant(&mut client, "orders", &secret, "", &["write"]).await,
        Code::PermissionDenied,
    );
    expect_code(
        grant(&mut client, "", "", "", &[]).await,
        Code::InvalidArgument,
    );

    let addr = admin.app.addr;
    let (status, head, body) = post_form(
        addr,
        "/oauth2/token",
        &basic("orders", "authd_sa_wrong"),
        "grant_type=client_credentials",
    )
    .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("invalid_client"))
    );
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: basic"),
        "{head}"
    );
    for (form, error) in [
        ("grant_type=client_credentials&scope=write", "invalid_scope"),
        (
            "grant_type=client_credentials&audience=stock",
            "invalid_target",
        ),
        ("grant_type=password", "unsupported_grant_type"),
    ] {
        let (status, _, body) =
            post_form(addr, "/oauth2/token", &basic("orders", &secret), form).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (400, Some(error)),
            "{form}"
        );
    }
    // No credential at all.
    let (status, _, _) =
        post_form(addr, "/oauth2/token", "", "grant_type=client_credentials").await;
    assert_eq!(status, 401);

    let metrics = admin.app.handle.render_metrics();
    let series =
        r#"authd_service_grants_total{grant="client_credentials",outcome="invalid_client"}"#;
    assert_eq!(metric(&metrics, series), Some(4.0), "{metrics}");
}

async fn two_secrets_are_live_during_a_rotation_and_a_removed_one_is_refused(db: TestDb) {
    let mut admin = app(&db).await;
    let made = create(&mut admin, "orders", &[], &[]).await;
    let first_id = made.account.unwrap().credentials[0].id.clone();
    let first = made.client_secret;
    let add = || AddServiceCredentialRequest {
        account: by_name("orders"),
        kind: Some(add_service_credential_request::Kind::Secret(
            ClientSecret {},
        )),
    };
    let added = admin
        .client
        .add_service_credential(with_key(add()))
        .await
        .unwrap()
        .into_inner();
    let second = added.client_secret;
    assert_ne!(first, second);
    // A third is refused: two at most.
    expect_code(
        admin.client.add_service_credential(with_key(add())).await,
        Code::FailedPrecondition,
    );
    // Both are live.
    let mut client = admin.app.client.clone();
    let old = grant(&mut client, "orders", &first, "", &[]).await.unwrap();
    let new = grant(&mut client, "orders", &second, "", &[])
        .await
        .unwrap();
    admin.app.validate(&old.access_token).await.unwrap();
    admin.app.validate(&new.access_token).await.unwrap();

    // The old one removed: it proves nothing, and its tokens are refused; the new
    // one's stay valid.
    admin
        .client
        .remove_service_credential(with_key(RemoveServiceCredentialRequest {
            account: by_name("orders"),
            credential_id: first_id.clone(),
        }))
        .await
        .unwrap();
    expect_code(
        grant(&mut client, "orders", &first, "", &[]).await,
        Code::Unauthenticated,
    );
    expect_code(
        admin.app.validate(&old.access_token).await,
        Code::Unauthenticated,
    );
    admin.app.validate(&new.access_token).await.unwrap();
    grant(&mut client, "orders", &second, "", &[])
        .await
        .unwrap();
    // Removing it again: no such credential.
    expect_code(
        admin
            .client
            .remove_service_credential(with_key(RemoveServiceCredentialRequest {
                account: by_name("orders"),
                credential_id: first_id,
            }))
            .await,
        Code::NotFound,
    );
    // A restarted server still refuses the removed credential's token.
    let mut again = spawn_app_on(&db, |_| {}).await;
    expect_code(
        again.validate(&old.access_token).await,
        Code::Unauthenticated,
    );
    again.validate(&new.access_token).await.unwrap();
}

async fn disabling_and_deleting_refuse_the_accounts_tokens(db: TestDb) {
    let mut admin = app(&db).await;
    let orders = create(&mut admin, "orders", &[], &[]).await.client_secret;
    let stock = create(&mut admin, "stock", &[], &[]).await.client_secret;
    let mut client = admin.app.client.clone();
    let orders_token = grant(&mut client, "orders", &orders, "", &[])
        .await
        .unwrap();
    let stock_token = grant(&mut client, "stock", &stock, "", &[]).await.unwrap();

    let disabled = admin
        .client
        .disable_service_account(with_key(DisableServiceAccountRequest {
            account: by_name("orders"),
            reason: "compromised".into(),
        }))
        .await
        .unwrap()
        .into_inner();
    assert!(disabled.changed && disabled.account.unwrap().disabled);
    expect_code(
        admin.app.validate(&orders_token.access_token).await,
        Code::Unauthenticated,
    );
    expect_code(
        grant(&mut client, "orders", &orders, "", &[]).await,
        Code::Unauthenticated,
    );
    let (status, _) = forward_auth(&admin, &orders_token.access_token).await;
    assert_eq!(status, 401);
    admin.app.validate(&stock_token.access_token).await.unwrap();

    admin
        .client
        .delete_service_account(with_key(DeleteServiceAccountRequest {
            account: by_name("stock"),
        }))
        .await
        .unwrap();
    expect_code(
        admin.app.validate(&stock_token.access_token).await,
        Code::Unauthenticated,
    );
    expect_code(
        grant(&mut client, "stock", &stock, "", &[]).await,
        Code::Unauthenticated,
    );
    // A taken name, or a certificate identity bound to another account: nothing
    // stored.
    let taken = CreateServiceAccountRequest {
        name: "ORDERS".into(),
        ..Default::default()
    };
    expect_code(
        admin.client.create_service_account(with_key(taken)).await,
        Code::AlreadyExists,
    );
    let bound = |name: &str| CreateServiceAccountRequest {
        name: name.into(),
        mtls_identities: vec!["spiffe://corp/ns/shop/sa/shared".into()],
        ..Default::default()
    };
    admin
        .client
        .create_service_account(with_key(bound("first")))
        .await
        .unwrap();
    expect_code(
        admin
            .client
            .create_service_account(with_key(bound("second")))
            .await,
        Code::AlreadyExists,
    );
    expect_code(
        admin
            .client
            .get_service_account(with_key(GetServiceAccountRequest {
                account: by_name("second"),
            }))
            .await,
        Code::NotFound,
    );
    admin
        .client
        .delete_service_account(with_key(DeleteServiceAccountRequest {
            account: by_name("first"),
        }))
        .await
        .unwrap();
    let listed = admin
        .client
        .list_service_accounts(with_key(ListServiceAccountsRequest::default()))
        .await
        .unwrap()
        .into_inner();
    let names: Vec<_> = listed.accounts.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["orders"]);
    // The name is free again; the new account's tokens work, the old ones do not.
    let again = create(&mut admin, "stock", &[], &[]).await.client_secret;
    let fresh = grant(&mut client, "stock", &again, "", &[]).await.unwrap();
    admin.app.validate(&fresh.access_token).await.unwrap();
    expect_code(
        admin.app.validate(&stock_token.access_token).await,
        Code::Unauthenticated,
    );
}

async fn token_exchange_acts_for_the_user_within_its_bounds(db: TestDb) {
    let mut admin = app(&db).await;
    let front = create(&mut admin, "front", &["orders"], &[]).await;
    let front_id = front.account.unwrap().id;
    let front = front.client_secret;
    let orders = create(&mut admin, "orders", &["billing"], &[]).await;
    let orders_id = orders.account.unwrap().id;
    let orders = orders.client_secret;
    let billing = create(&mut admin, "billing", &["ledger"], &[])
        .await
        .client_secret;
    let user_id = admin.app.register("ada", PASSWORD).await.unwrap();
    let login = admin.app.login("ada", PASSWORD).await.unwrap();
    let mut client = admin.app.client.clone();

    // Allowed: the user's token for one audience the account may have.
    let first = exchange(&mut client, "front", &front, &login.access_token, "orders")
        .await
        .unwrap();
    assert_eq!(first.audiences, ["orders"]);
    let valid = admin.app.validate(&first.access_token).await.unwrap();
    assert_eq!(valid.user_id, user_id);
    assert_eq!(valid.username, "ada");
    assert!(!valid.service);
    assert_eq!(valid.actors, std::slice::from_ref(&front_id));
    assert_eq!(valid.client_id, "front");
    assert_eq!(valid.session_id, login.session_id);
    assert_eq!(valid.audiences, ["orders"]);
    // Never outlives its source.
    let source_exp = admin
        .app
        .validate(&login.access_token)
        .await
        .unwrap()
        .expires_at
        .unwrap();
    assert!(first.expires_at.unwrap().seconds <= source_exp.seconds);
    // Check passes the user and the actor.
    let set = check_headers(&admin, &first.access_token).await;
    assert_eq!(set["x-authd-user-id"], user_id);
    assert_eq!(set["x-authd-actor"], front_id);
    assert_eq!(set["x-authd-client-id"], "front");

    // Refused by policy: an audience the account may not have.
    expect_code(
        exchange(&mut client, "front", &front, &login.access_token, "billing").await,
        Code::PermissionDenied,
    );
    // A service token is no user's.
    let service = grant(&mut client, "orders", &orders, "", &[])
        .await
        .unwrap();
    expect_code(
        exchange(
            &mut client,
            "front",
            &front,
            &service.access_token,
            "orders",
        )
        .await,
        Code::PermissionDenied,
    );
    // A chain: orders exchanges front's token (depth 2, the default bound) ...
    let second = exchange(
        &mut client,
        "orders",
        &orders,
        &first.access_token,
        "billing",
    )
    .await
    .unwrap();
    let valid = admin.app.validate(&second.access_token).await.unwrap();
    assert_eq!(valid.actors, [orders_id, front_id]);
    // ... and billing may not exchange it again (depth 3).
    expect_code(
        exchange(
            &mut client,
            "billing",
            &billing,
            &second.access_token,
            "ledger",
        )
        .await,
        Code::PermissionDenied,
    );
    // Over HTTP (RFC 8693's form).
    let (status, _, body) = post_form(
        admin.app.addr,
        "/oauth2/token",
        &basic("front", &front),
        &format!(
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Atoken-exchange&audience=orders\
             &subject_token={}&subject_token_type=urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Aaccess_token",
            login.access_token
        ),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["issued_token_type"],
        "urn:ietf:params:oauth:token-type:access_token"
    );
    let third = body["access_token"].as_str().unwrap().to_owned();
    admin.app.validate(&third).await.unwrap();

    // The user's logout ends every token exchanged from the session.
    admin
        .app
        .client
        .logout(LogoutRequest {
            access_token: login.access_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    for token in [&first.access_token, &second.access_token, &third] {
        expect_code(admin.app.validate(token).await, Code::Unauthenticated);
    }
    // And an ended session's token cannot be exchanged.
    expect_code(
        exchange(&mut client, "front", &front, &login.access_token, "orders").await,
        Code::PermissionDenied,
    );
}

async fn concurrent_grants_with_one_wrong_secret_refuse_that_one_only(db: TestDb) {
    let mut admin = app(&db).await;
    let secret = create(&mut admin, "orders", &[], &[]).await.client_secret;
    // 49 grants from one client address, the wrong one from another (whose count
    // no success of the others resets).
    let good = admin.app.client.clone();
    let bad = connect_from(admin.app.addr, Ipv4Addr::new(127, 0, 0, 2)).await;
    let grants = (0..50).map(|i| {
        let (mut client, secret) = if i == 17 {
            (bad.clone(), "authd_sa_wrong".to_owned())
        } else {
            (good.clone(), secret.clone())
        };
        async move { grant(&mut client, "orders", &secret, "", &[]).await }
    });
    let results = join_all(grants).await;
    let refused: Vec<usize> = (results.iter().enumerate())
        .filter(|(_, r)| r.is_err())
        .map(|(i, _)| i)
        .collect();
    assert_eq!(refused, [17], "{results:?}");
    assert_eq!(
        results[17].as_ref().unwrap_err().code(),
        Code::Unauthenticated
    );
    let metrics = admin.app.handle.render_metrics();
    let series = |outcome: &str| {
        format!(r#"authd_service_grants_total{{grant="client_credentials",outcome="{outcome}"}}"#)
    };
    assert_eq!(metric(&metrics, &series("ok")), Some(49.0), "{metrics}");
    assert_eq!(metric(&metrics, &series("invalid_client")), Some(1.0));

    // The throttle counted that failure: four more from that client (five, the
    // default threshold) and its next grant of this client id is refused before any
    // check, even with the right secret; the other client is not held.
    let mut bad = bad.clone();
    for _ in 0..4 {
        expect_code(
            grant(&mut bad, "orders", "authd_sa_wrong", "", &[]).await,
            Code::Unauthenticated,
        );
    }
    let throttled = expect_code(
        grant(&mut bad, "orders", &secret, "", &[]).await,
        Code::ResourceExhausted,
    );
    assert!(throttled.metadata().get("retry-after").is_some());
    // It names what was counted (failed authentications, never logins), as it
    // would for a client id that names no account.
    assert_eq!(
        throttled.message(),
        "too many failed authentications for this service account; retry later"
    );
    assert!(throttled.get_details_retry_info().is_some());
    let quota = throttled.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations[0].subject, "login-throttle:client");
    assert_eq!(
        quota.violations[0].description,
        "failed authentications for this service account from this client"
    );
    let mut good = good.clone();
    grant(&mut good, "orders", &secret, "", &[]).await.unwrap();
    let metrics = admin.app.handle.render_metrics();
    assert_eq!(
        metric(&metrics, &series("throttled")),
        Some(1.0),
        "{metrics}"
    );
}

/// Grants in flight while the account is disabled: whatever each answered, no
/// token it issued is valid once the disable has answered (a grant whose account
/// was read before the disable is issued with that moment as its `iat`).
async fn a_disable_wins_against_grants_in_flight(db: TestDb) {
    let mut admin = app(&db).await;
    let secret = create(&mut admin, "orders", &[], &[]).await.client_secret;
    let client = admin.app.client.clone();
    let grants = join_all((0..40).map(|_| {
        let mut client = client.clone();
        let secret = secret.clone();
        async move { grant(&mut client, "orders", &secret, "", &[]).await }
    }));
    let mut admin_client = admin.client.clone();
    let disable = async move {
        admin_client
            .disable_service_account(with_key(DisableServiceAccountRequest {
                account: by_name("orders"),
                reason: "race".into(),
            }))
            .await
            .unwrap()
    };
    let (results, _) = tokio::join!(grants, disable);
    for result in results {
        match result {
            Ok(granted) => {
                expect_code(
                    admin.app.validate(&granted.access_token).await,
                    Code::Unauthenticated,
                );
            }
            // Refused after the disable, or by the throttle once those refusals
            // add up.
            Err(status) => assert!(
                matches!(
                    status.code(),
                    Code::Unauthenticated | Code::ResourceExhausted
                ),
                "{status:?}"
            ),
        }
    }
    // After the disable, none is issued.
    let refused = grant(&mut admin.app.client.clone(), "orders", &secret, "", &[])
        .await
        .unwrap_err();
    assert!(
        matches!(
            refused.code(),
            Code::Unauthenticated | Code::ResourceExhausted
        ),
        "{refused:?}"
    );
}

/// PostgreSQL: a service account disabled or deleted on one replica has its tokens
/// refused by another within the revocation delay.
#[tokio::test]
async fn disable_and_delete_reach_every_replica() {
    let Some(db) = TestDb::new(Backend::Postgres, "service_across_replicas").await else {
        return;
    };
    let delay = Duration::from_millis(200);
    let mut a = admin_app(&db, |c| c.tokens.revocation_delay = delay).await;
    let b = spawn_app_on(&db, |c| c.tokens.revocation_delay = delay).await;
    let orders = create(&mut a, "orders", &[], &[]).await.client_secret;
    let stock = create(&mut a, "stock", &[], &[]).await.client_secret;
    let mut client = b.client.clone();
    let orders_token = grant(&mut client, "orders", &orders, "", &[])
        .await
        .unwrap();
    let stock_token = grant(&mut client, "stock", &stock, "", &[]).await.unwrap();
    let mut on_b = b.client.clone();
    on_b.validate_token(authd::pb::ValidateTokenRequest {
        access_token: orders_token.access_token.clone(),
        ..Default::default()
    })
    .await
    .unwrap();

    a.client
        .disable_service_account(with_key(DisableServiceAccountRequest {
            account: by_name("orders"),
            reason: "test".into(),
        }))
        .await
        .unwrap();
    b.until_refused(&orders_token.access_token).await;
    expect_code(
        grant(&mut client, "orders", &orders, "", &[]).await,
        Code::Unauthenticated,
    );
    a.client
        .delete_service_account(with_key(DeleteServiceAccountRequest {
            account: by_name("stock"),
        }))
        .await
        .unwrap();
    b.until_refused(&stock_token.access_token).await;
}

/// PostgreSQL: a replica's copy of an account (grants read the database once, then
/// use it) follows the changes made on another: a secret added there proves the
/// account here at once; a secret removed there proves nothing here once this
/// replica has read its cutoff; a disable there refuses grants here likewise.
#[tokio::test]
async fn a_replicas_copy_of_an_account_follows_changes_made_on_another() {
    let Some(db) = TestDb::new(Backend::Postgres, "service_cache_replicas").await else {
        return;
    };
    let delay = Duration::from_millis(200);
    // The copy's age is the clock's: standing still, it never runs out here.
    let clock = Arc::new(ManualClock::new());
    let on = |c: &mut authd::config::Config| {
        c.tokens.revocation_delay = delay;
        c.clock = Some(clock.clone());
    };
    let mut a = admin_app(&db, on).await;
    let b = spawn_app_on(&db, on).await;
    let made = create(&mut a, "orders", &[], &[]).await;
    let (first, first_id) = (
        made.client_secret,
        made.account.unwrap().credentials[0].id.clone(),
    );
    let reads = |source: &str| {
        let series = format!(r#"authd_service_account_reads_total{{source="{source}"}}"#);
        metric(&b.handle.render_metrics(), &series).unwrap_or(0.0)
    };
    let mut on_b = b.client.clone();
    let mut old = None;
    for _ in 0..5 {
        old = Some(grant(&mut on_b, "orders", &first, "", &[]).await.unwrap());
    }
    assert_eq!((reads("database"), reads("cache")), (1.0, 4.0));

    // A secret added on A: B's copy does not know it, so B reads the account again.
    let second = a
        .client
        .add_service_credential(with_key(AddServiceCredentialRequest {
            account: by_name("orders"),
            kind: Some(add_service_credential_request::Kind::Secret(
                ClientSecret {},
            )),
        }))
        .await
        .unwrap()
        .into_inner()
        .client_secret;
    grant(&mut on_b, "orders", &second, "", &[]).await.unwrap();
    grant(&mut on_b, "orders", &first, "", &[]).await.unwrap();
    assert_eq!((reads("database"), reads("cache")), (2.0, 5.0));

    // The first removed on A: once B refuses its token, B's copy no longer proves
    // the account with it.
    a.client
        .remove_service_credential(with_key(RemoveServiceCredentialRequest {
            account: by_name("orders"),
            credential_id: first_id,
        }))
        .await
        .unwrap();
    b.until_refused(&old.unwrap().access_token).await;
    expect_code(
        grant(&mut on_b, "orders", &first, "", &[]).await,
        Code::Unauthenticated,
    );
    let kept = grant(&mut on_b, "orders", &second, "", &[]).await.unwrap();

    // Disabled on A: once B refuses the account's tokens, B grants none.
    a.client
        .disable_service_account(with_key(DisableServiceAccountRequest {
            account: by_name("orders"),
            reason: "test".into(),
        }))
        .await
        .unwrap();
    b.until_refused(&kept.access_token).await;
    expect_code(
        grant(&mut on_b, "orders", &second, "", &[]).await,
        Code::Unauthenticated,
    );
}

/// Envoy's dynamic metadata names what the identity headers name: a service's token
/// its account (`client_id`, `service_id`) and neither a user nor a sign-in method
/// (`amr`); an exchanged token the user, how they signed in, and the service acting.
async fn checks_metadata_names_a_service_as_its_headers_do(db: TestDb) {
    let mut admin = app(&db).await;
    let made = create(&mut admin, "orders", &["billing"], &["read"]).await;
    let account = made.account.unwrap();
    let mut client = admin.app.client.clone();
    let token = grant(&mut client, "orders", &made.client_secret, "", &[])
        .await
        .unwrap()
        .access_token;
    let (headers, metadata) = check_answer(&admin, &token).await;
    let mut names: Vec<&str> = headers.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "x-authd-audience",
            "x-authd-client-id",
            "x-authd-scope",
            "x-authd-service-id"
        ]
    );
    let fields = metadata.as_object().unwrap();
    let mut names: Vec<&str> = fields.keys().map(String::as_str).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        ["audience", "client_id", "expires_at", "service_id"],
        "{metadata}"
    );
    assert_eq!(metadata["client_id"], "orders");
    assert_eq!(metadata["service_id"], account.id.as_str());
    assert_eq!(metadata["audience"], serde_json::json!(["billing"]));
    assert!(metadata["expires_at"].as_f64().unwrap() > 0.0);

    // A user's token exchanged by a service: the user's claims, `amr` among them,
    // and the service acting, as the headers have them.
    let front = create(&mut admin, "front", &["orders"], &[]).await;
    let user_id = admin.app.register("ada", PASSWORD).await.unwrap();
    let login = admin.app.login("ada", PASSWORD).await.unwrap();
    let exchanged = exchange(
        &mut client,
        "front",
        &front.client_secret,
        &login.access_token,
        "orders",
    )
    .await
    .unwrap()
    .access_token;
    let (headers, metadata) = check_answer(&admin, &exchanged).await;
    assert_eq!(headers["x-authd-amr"], "pwd");
    assert_eq!(metadata["amr"], serde_json::json!(["pwd"]), "{metadata}");
    assert_eq!(metadata["user_id"], user_id.as_str());
    assert_eq!(metadata["username"], "ada");
    assert_eq!(metadata["session_id"], login.session_id.as_str());
    assert_eq!(metadata["client_id"], "front");
    assert!(metadata.get("service_id").is_none(), "{metadata}");
}

/// A rule keyed on the client id a grant names (`*:client-id`): one service's grants
/// over gRPC and HTTP count in one log, and once it is over its limit its grants are
/// refused before any check (RESOURCE_EXHAUSTED with RetryInfo and QuotaFailure;
/// 429 over HTTP), whatever the letter case of the name, while another service is
/// still served. On PostgreSQL the counts are in Redis when one is configured, in
/// process otherwise (and on SQLite).
async fn a_client_id_rule_refuses_the_service_over_it_and_serves_the_others(db: TestDb) {
    let redis = match db.url {
        authd::config::DatabaseUrl::Postgres(_) => redis_url("client_id_rule"),
        authd::config::DatabaseUrl::Sqlite(_) => None,
    };
    let mut admin = admin_app(&db, |c| {
        c.limits.rate_limits = Some("*:client-id=3/1h,*:peer=1000/1h".parse().unwrap());
        if let Some(url) = &redis {
            c.limits.redis_url = Some(url.parse().unwrap());
            c.limits.rate_limit_prefix = unique_name("sa_client_id");
            c.limits.redis_timeout = Duration::from_secs(10);
        }
    })
    .await;
    let backend = admin.app.handle.rate_limit_stats().backend;
    let expected = match redis {
        Some(_) => authd::RateLimitBackend::Redis,
        None => authd::RateLimitBackend::Local,
    };
    assert_eq!(backend, expected);
    let orders = create(&mut admin, "orders", &[], &[]).await.client_secret;
    let stock = create(&mut admin, "stock", &[], &[]).await.client_secret;
    let mut client = admin.app.client.clone();
    let request = |id: &str, secret: &str| IssueServiceTokenRequest {
        client_id: id.into(),
        client_secret: secret.into(),
        ..Default::default()
    };

    // Three grants of orders: two over gRPC, told what is left, one over HTTP.
    for remaining in ["2", "1"] {
        let answer = client
            .issue_service_token(request("orders", &orders))
            .await
            .unwrap();
        let metadata = answer.metadata();
        assert_eq!(metadata.get("ratelimit-limit").unwrap(), "3");
        assert_eq!(metadata.get("ratelimit-remaining").unwrap(), remaining);
    }
    let addr = admin.app.addr;
    let (status, _, body) = post_form(
        addr,
        "/oauth2/token",
        &basic("orders", &orders),
        "grant_type=client_credentials",
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // The fourth is refused, however it names orders, over gRPC and HTTP, with the
    // right secret or a wrong one.
    for (id, secret) in [
        ("orders", orders.as_str()),
        ("ORDERS", orders.as_str()),
        ("orders", "authd_sa_wrong"),
    ] {
        let refused = expect_code(
            client.issue_service_token(request(id, secret)).await,
            Code::ResourceExhausted,
        );
        assert_eq!(refused.message(), "rate limit exceeded: *:client-id=3/1h");
        let delay = refused
            .get_details_retry_info()
            .and_then(|r| r.retry_delay)
            .expect("RetryInfo");
        assert!(delay > Duration::ZERO && delay <= Duration::from_secs(3600));
        let quota = refused.get_details_quota_failure().expect("QuotaFailure");
        assert_eq!(quota.violations.len(), 1);
        assert_eq!(quota.violations[0].subject, "*:client-id=3/1h");
        assert_eq!(
            quota.violations[0].description,
            "at most 3 requests per 1h per client id"
        );
        assert!(refused.metadata().get("retry-after").is_some());
    }
    let form = format!("grant_type=client_credentials&client_id=Orders&client_secret={orders}");
    let (status, head, body) = post_form(addr, "/oauth2/token", "", &form).await;
    assert_eq!((status, body["error"].as_str()), (429, Some("slow_down")));
    assert!(
        head.to_ascii_lowercase().contains("retry-after: "),
        "{head}"
    );

    // Another service is still served, over both.
    client
        .issue_service_token(request("stock", &stock))
        .await
        .unwrap();
    let (status, _, body) = post_form(
        addr,
        "/oauth2/token",
        &basic("stock", &stock),
        "grant_type=client_credentials",
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // The refused grants never reached a credential check: five grants, all issued.
    let metrics = admin.app.handle.render_metrics();
    let series = |outcome: &str| {
        format!(r#"authd_service_grants_total{{grant="client_credentials",outcome="{outcome}"}}"#)
    };
    assert_eq!(metric(&metrics, &series("ok")), Some(5.0), "{metrics}");
    assert_eq!(
        metric(&metrics, &series("invalid_client")).unwrap_or(0.0),
        0.0
    );
    assert_eq!(admin.app.handle.rate_limit_stats().refused, 4);
}

/// The audit trail of grants as the binary writes it (JSON lines, target
/// `authd::audit`): each grant's `service_grant` event names the grant, its outcome
/// and the account (and the user of an exchange); no line of the log holds a client
/// secret, a wrong one, or a token (issued, exchanged or presented).
async fn each_grant_is_audited_without_a_secret_or_a_token(db: TestDb) {
    use crate::helpers::{TEST_KEY, TEST_KID, key_spec};
    use authd::{config::DatabaseUrl, pb::admin::admin_service_client::AdminServiceClient};
    let dir = tempfile::tempdir().unwrap();
    let keys = crate::admin::keys_file();
    let database = match &db.url {
        DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
        DatabaseUrl::Postgres(url) => url.expose().to_owned(),
    };
    let running = crate::cli::spawn_authd(
        dir.path(),
        &[
            ("AUTHD_DATABASE_URL", database),
            ("AUTHD_TOKEN_KEYS", key_spec(TEST_KID, TEST_KEY)),
            ("AUTHD_ADMIN_LISTEN", "127.0.0.1:0".into()),
            ("AUTHD_ADMIN_KEYS_FILE", keys.path().display().to_string()),
        ],
    );
    let admin_addr = running.admin_addr.clone().expect("the admin port is on");
    let admin = AdminServiceClient::connect(format!("http://{admin_addr}"))
        .await
        .unwrap();
    let made = |name: &str, audience: &str| {
        let request = CreateServiceAccountRequest {
            name: name.into(),
            audiences: vec![audience.into()],
            with_secret: true,
            ..Default::default()
        };
        let mut admin = admin.clone();
        async move {
            let made = admin
                .create_service_account(with_key(request))
                .await
                .unwrap()
                .into_inner();
            (made.account.unwrap().id, made.client_secret)
        }
    };
    let (orders_id, orders) = made("orders", "billing").await;
    let (front_id, front) = made("front", "orders").await;
    let (mut client, user_token) = running.signed_in("ada", PASSWORD).await;
    let user_id = (client.validate_token(authd::pb::ValidateTokenRequest {
        access_token: user_token.clone(),
        ..Default::default()
    }))
    .await
    .unwrap()
    .into_inner()
    .user_id;

    // Issued over gRPC and HTTP; a wrong secret; an audience it may not have; an
    // exchange of the user's token.
    let wrong = "authd_sa_not-the-secret-0123456789";
    let issued = grant(&mut client, "orders", &orders, "", &[])
        .await
        .unwrap()
        .access_token;
    expect_code(
        grant(&mut client, "orders", wrong, "", &[]).await,
        Code::Unauthenticated,
    );
    expect_code(
        grant(&mut client, "orders", &orders, "stock", &[]).await,
        Code::PermissionDenied,
    );
    let addr: SocketAddr = running.addr.parse().unwrap();
    let (status, head, body) = post_form(
        addr,
        "/oauth2/token",
        &format!(
            "{}X-Request-Id: grant-over-http\r\n",
            basic("orders", &orders)
        ),
        "grant_type=client_credentials",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        head.to_ascii_lowercase()
            .contains("\r\nx-request-id: grant-over-http\r\n"),
        "{head}"
    );
    let over_http = body["access_token"].as_str().unwrap().to_owned();
    let exchanged = exchange(&mut client, "front", &front, &user_token, "orders")
        .await
        .unwrap()
        .access_token;

    let (status, log) = running.terminate().await;
    assert!(status.success());
    let events: Vec<Value> = (log.iter())
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|e| e["target"] == "authd::audit" && e["event"] == "service_grant")
        .collect();
    let named = |e: &Value, field: &str| e.get(field).and_then(Value::as_str).map(str::to_owned);
    let seen: Vec<(String, String, Option<String>, Option<String>)> = (events.iter())
        .map(|e| {
            (
                named(e, "grant").unwrap(),
                named(e, "outcome").unwrap(),
                named(e, "service_id"),
                named(e, "user_id"),
            )
        })
        .collect();
    let line = |grant: &str, outcome: &str, service: Option<&str>, user: Option<&str>| {
        (
            grant.to_owned(),
            outcome.to_owned(),
            service.map(str::to_owned),
            user.map(str::to_owned),
        )
    };
    let orders_id = Some(orders_id.as_str());
    assert_eq!(
        seen,
        [
            line("client_credentials", "ok", orders_id, None),
            // The account is not named before a credential proves it.
            line("client_credentials", "invalid_client", None, None),
            line("client_credentials", "not_allowed", orders_id, None),
            line("client_credentials", "ok", orders_id, None),
            line(
                "token_exchange",
                "ok",
                Some(front_id.as_str()),
                Some(user_id.as_str())
            ),
        ],
        "{events:#?}"
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["message"], "service account grant", "{e}");
        assert_eq!(e["peer"], "127.0.0.1", "{e}");
        // Every call's request id, the token endpoint's the one its client sent.
        if i == 3 {
            assert_eq!(e["request_id"], "grant-over-http", "{e}");
        } else {
            assert!(
                e["request_id"].as_str().is_some_and(|id| !id.is_empty()),
                "{e}"
            );
        }
    }
    let all = log.join("\n");
    for secret in [
        orders.as_str(),
        front.as_str(),
        wrong,
        issued.as_str(),
        over_http.as_str(),
        exchanged.as_str(),
        user_token.as_str(),
        crate::admin::ADMIN_KEY,
    ] {
        assert!(!all.contains(secret), "{secret} was logged:\n{all}");
    }
}
