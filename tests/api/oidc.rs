//! The standard endpoints on the gRPC port, over plain HTTP/1.1: the discovery
//! document with and without AUTHD_ISSUER, the issuer in tokens (and tokens of the
//! old issuer still valid), the JWKS beside the metrics port's, introspection (active,
//! expired by the clock, revoked by Logout and ChangePassword, disabled, refused
//! clients, a form too large, its rate limit) and revocation (a refresh token, an
//! access token, unknown tokens). Clients nobody here wrote: `curl`, and Python's
//! PyJWT (`PyJWKClient` fed from the discovery document) and Authlib (an RFC 7662 and
//! RFC 7009 client), from a venv (`AUTHD_TEST_PYTHON`, or `.ci/.venv` as `.ci/run`
//! installs it); skipped with one line without them, unless
//! AUTHD_TEST_REQUIRE_SERVICES=1.

use crate::admin::admin_app;
use crate::helpers::{
    Backend, TestApp, TestDb, expect_code, http_get, metric_of, skipped, spawn_app_with,
};
use authd::{
    KeyAlgorithm, ManualClock,
    config::Config,
    generate_key_entry,
    pb::{ChangePasswordRequest, LogoutRequest, RefreshRequest},
};
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use std::{
    io::Write as _, net::SocketAddr, path::PathBuf, process::Command, sync::Arc, time::Duration,
};
use tonic::Code;

const PASSWORD: &str = "a fine password";
/// The form bound of the token endpoints (docs/api.md).
const MAX_FORM_BYTES: usize = 8 * 1024;
const CLIENT_ID: &str = "gateway";
const SECRET: &str = "0123456789abcdef0123456789abcdef-gateway";

/// An answer of an HTTP/1.1 request: the status, the head, and the body.
struct Answer {
    status: u16,
    head: String,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.head
            .lines()
            .filter_map(|l| l.split_once(':'))
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    }
}

/// `METHOD path` with extra header lines (each ending in CRLF) and a body, over a
/// connection of its own.
async fn http(addr: SocketAddr, method: &str, path: &str, headers: &str, body: &str) -> Answer {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).expect("a UTF-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    Answer {
        status,
        head: head.to_owned(),
        body: body.to_owned(),
    }
}

const FORM: &str = "Content-Type: application/x-www-form-urlencoded\r\n";

fn basic(id: &str, secret: &str) -> String {
    use base64::engine::general_purpose::STANDARD;
    format!(
        "Authorization: Basic {}\r\n",
        STANDARD.encode(format!("{id}:{secret}"))
    )
}

/// Introspects `token` as the test's client.
async fn introspect(app: &TestApp, token: &str) -> Answer {
    let headers = format!("{FORM}{}", basic(CLIENT_ID, SECRET));
    http(
        app.addr,
        "POST",
        "/oauth2/introspect",
        &headers,
        &format!("token={token}"),
    )
    .await
}

async fn revoke(app: &TestApp, form: &str) -> Answer {
    http(app.addr, "POST", "/oauth2/revoke", FORM, form).await
}

/// The introspection clients' file: the test's client, by the digest of its secret.
fn clients_file() -> tempfile::NamedTempFile {
    let mut file = tempfile::NamedTempFile::new().unwrap();
    let digest = hex::encode(Sha256::digest(SECRET.as_bytes()));
    writeln!(file, "# id   role        SHA-256 of the secret").unwrap();
    writeln!(file, "{CLIENT_ID} introspect {digest}").unwrap();
    file
}

/// An issuer URL (no server answers it: only the document's text is checked).
const ISSUER: &str = "https://auth.example.com";

/// The settings of the standard endpoints: the issuer, when given, and the clients.
fn standard(issuer: Option<&str>, clients: &tempfile::NamedTempFile) -> impl FnOnce(&mut Config) {
    let (issuer, path) = (issuer.map(str::to_owned), clients.path().to_owned());
    move |c: &mut Config| {
        c.oidc.issuer = issuer;
        c.oidc.introspection_keys_file = Some(path);
    }
}

/// The claims of a JWT, unverified.
fn claims(token: &str) -> Value {
    let payload = token.split('.').nth(1).unwrap();
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
}

async fn user(app: &mut TestApp, name: &str) -> authd::pb::LoginResponse {
    app.register(name, PASSWORD).await.unwrap();
    app.login(name, PASSWORD).await.unwrap()
}

#[tokio::test]
async fn without_an_issuer_discovery_says_what_it_needs_and_tokens_say_authd() {
    let clients = clients_file();
    let mut app = spawn_app_with(standard(None, &clients)).await;
    let answer = http(app.addr, "GET", "/.well-known/openid-configuration", "", "").await;
    assert_eq!(answer.status, 404, "{}", answer.head);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    let error = answer.json();
    assert!(
        error["error_description"]
            .as_str()
            .unwrap()
            .contains("AUTHD_ISSUER"),
        "{error}"
    );
    let login = user(&mut app, "ada").await;
    assert_eq!(claims(&login.access_token)["iss"], "authd");
    // Other paths under the prefixes are JSON 404s; gRPC is untouched.
    assert_eq!(
        http(app.addr, "GET", "/oauth2/authorize", "", "")
            .await
            .status,
        404
    );
    app.validate(&login.access_token).await.unwrap();
}

#[tokio::test]
async fn with_an_issuer_discovery_names_it_tokens_carry_it_and_old_tokens_stay_valid() {
    let clients = clients_file();
    // A replica without the setting issues a token: `iss` "authd".
    let mut old = spawn_app_with(standard(None, &clients)).await;
    let before = user(&mut old, "grace").await.access_token;
    let mut app = spawn_app_with(standard(Some(ISSUER), &clients)).await;
    let answer = http(app.addr, "GET", "/.well-known/openid-configuration", "", "").await;
    assert_eq!(answer.status, 200, "{}", answer.head);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    let doc = answer.json();
    assert_eq!(doc["issuer"], ISSUER);
    assert_eq!(doc["jwks_uri"], format!("{ISSUER}/.well-known/jwks.json"));
    assert_eq!(
        doc["introspection_endpoint"],
        format!("{ISSUER}/oauth2/introspect")
    );
    assert_eq!(
        doc["revocation_endpoint"],
        format!("{ISSUER}/oauth2/revoke")
    );
    assert_eq!(
        doc["introspection_endpoint_auth_methods_supported"],
        json!(["client_secret_basic"])
    );
    assert_eq!(
        doc["revocation_endpoint_auth_methods_supported"],
        json!(["none"])
    );
    // The test keys are HMAC: that is what signs.
    assert_eq!(
        doc["id_token_signing_alg_values_supported"],
        json!(["HS256"])
    );
    // Nothing authd does not serve.
    for absent in ["authorization_endpoint", "userinfo_endpoint"] {
        assert!(doc.get(absent).is_none(), "{absent}");
    }
    // The token endpoint is the service accounts' (docs/service-accounts.md).
    assert_eq!(
        doc["token_endpoint"],
        json!(format!("{ISSUER}/oauth2/token"))
    );
    assert_eq!(
        doc["grant_types_supported"],
        json!([
            "client_credentials",
            "urn:ietf:params:oauth:grant-type:token-exchange"
        ])
    );
    // A client-chosen Host changes nothing.
    let spoofed = http(
        app.addr,
        "GET",
        "/.well-known/openid-configuration",
        "X-Forwarded-Host: evil.example\r\n",
        "",
    )
    .await;
    assert_eq!(spoofed.json(), doc);

    let after = user(&mut app, "grace").await.access_token;
    assert_eq!(claims(&after)["iss"], ISSUER);
    // Both issuers are accepted, by ValidateToken and by introspection.
    app.validate(&before).await.unwrap();
    app.validate(&after).await.unwrap();
    assert_eq!(introspect(&app, &before).await.json()["iss"], "authd");
    assert_eq!(introspect(&app, &after).await.json()["iss"], ISSUER);
    // The replica without the setting refuses the new issuer's tokens: the reason
    // to set it only once every replica runs this release.
    expect_code(old.validate(&after).await, Code::Unauthenticated);
}

#[tokio::test]
async fn the_jwks_on_the_grpc_port_is_the_metrics_ports() {
    let entry = generate_key_entry(KeyAlgorithm::EdDsa, "ed1").unwrap();
    let app = spawn_app_with(|c| c.tokens.token_keys = Some(entry.parse().unwrap())).await;
    let metrics = app.handle.metrics_addr().unwrap();
    let (old_head, old_body) = http_get(metrics, "/.well-known/jwks.json", "").await;
    let new = http(app.addr, "GET", "/.well-known/jwks.json", "", "").await;
    assert_eq!(new.status, 200);
    assert_eq!(new.body, old_body);
    let etag = new.header("etag").unwrap().to_owned();
    assert!(old_head.contains(&etag), "{old_head}");
    assert_eq!(new.json()["keys"][0]["kid"], "ed1");
    let revalidated = http(
        app.addr,
        "GET",
        "/.well-known/jwks.json",
        &format!("If-None-Match: {etag}\r\n"),
        "",
    )
    .await;
    assert_eq!(revalidated.status, 304);
}

#[tokio::test]
async fn introspection_answers_active_with_the_claims_then_inactive_once_expired() {
    let clients = clients_file();
    let clock = Arc::new(ManualClock::new());
    let settings = standard(Some(ISSUER), &clients);
    let mut app = spawn_app_with(|c| {
        settings(c);
        c.tokens.token_audience = vec!["orders".into()];
        c.tokens.token_ttl = Duration::from_secs(300);
        c.clock = Some(clock.clone());
    })
    .await;
    let login = user(&mut app, "ada").await;
    let answer = introspect(&app, &login.access_token).await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    let body = answer.json();
    let token = claims(&login.access_token);
    assert_eq!(body["active"], true);
    assert_eq!(body["token_type"], "Bearer");
    assert_eq!(body["username"], "ada");
    assert_eq!(body["aud"], "orders");
    for claim in [
        "sub", "exp", "iat", "iss", "nbf", "sid", "jti", "amr", "name",
    ] {
        assert_eq!(body[claim], token[claim], "{claim}");
    }
    // A refresh token is never active here.
    let refresh = introspect(&app, &login.refresh_token).await;
    assert_eq!(refresh.json(), json!({"active": false}));
    // Past `exp` and the clock skew: inactive.
    clock.advance(Duration::from_secs(300 + 31));
    assert_eq!(
        introspect(&app, &login.access_token).await.json(),
        json!({"active": false})
    );
    assert_eq!(
        introspect(&app, "not.a-token.at-all").await.json(),
        json!({"active": false})
    );
    let text = app.handle.render_metrics();
    assert_eq!(
        metric_of(&text, r#"authd_introspections_total{outcome="active"}"#),
        1.0
    );
    assert_eq!(
        metric_of(&text, r#"authd_introspections_total{outcome="inactive"}"#),
        3.0
    );
}

#[tokio::test]
async fn introspection_is_inactive_after_logout_password_change_and_disable() {
    let clients = clients_file();
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut admin = admin_app(&db, standard(None, &clients)).await;
    let app = &mut admin.app;
    let active = |a: Answer| a.json()["active"].as_bool().unwrap();

    let logged_out = user(app, "ada").await;
    assert!(active(introspect(app, &logged_out.access_token).await));
    app.client
        .logout(LogoutRequest {
            refresh_token: logged_out.refresh_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(!active(introspect(app, &logged_out.access_token).await));

    let changed = user(app, "grace").await;
    app.client
        .change_password(ChangePasswordRequest {
            username: "grace".into(),
            current_password: PASSWORD.into(),
            new_password: "violet tractor at dawn".into(),
        })
        .await
        .unwrap();
    assert!(!active(introspect(app, &changed.access_token).await));

    let disabled = user(app, "linus").await;
    assert!(active(introspect(app, &disabled.access_token).await));
    admin.disable("linus", "left").await.unwrap();
    assert!(!active(
        introspect(&admin.app, &disabled.access_token).await
    ));
}

#[tokio::test]
async fn introspection_refuses_clients_without_the_right_credential_and_large_forms() {
    let clients = clients_file();
    let mut app = spawn_app_with(standard(None, &clients)).await;
    let token = user(&mut app, "ada").await.access_token;
    let form = format!("token={token}");
    let wrong_secret = basic(CLIENT_ID, "a wrong secret of thirty-two bytes or more");
    let wrong_id = basic("other", SECRET);
    for headers in [
        FORM.to_owned(),
        format!("{FORM}{wrong_secret}"),
        format!("{FORM}{wrong_id}"),
        format!("{FORM}Authorization: Bearer {token}\r\n"),
    ] {
        let answer = http(app.addr, "POST", "/oauth2/introspect", &headers, &form).await;
        assert_eq!(answer.status, 401, "{headers}");
        assert_eq!(
            answer.header("www-authenticate"),
            Some(r#"Basic realm="authd""#)
        );
        // The same answer whichever part was wrong, and never the token's state.
        assert_eq!(answer.json()["error"], "invalid_client");
        assert!(!answer.body.contains("active"));
    }
    let large = format!("token={}", "a".repeat(MAX_FORM_BYTES));
    let headers = format!("{FORM}{}", basic(CLIENT_ID, SECRET));
    let answer = http(app.addr, "POST", "/oauth2/introspect", &headers, &large).await;
    assert_eq!(answer.status, 413);
    let answer = http(app.addr, "POST", "/oauth2/introspect", &headers, "").await;
    assert_eq!(answer.status, 400);
    assert_eq!(answer.json()["error"], "invalid_request");
    let text = app.handle.render_metrics();
    assert_eq!(
        metric_of(
            &text,
            r#"authd_introspections_total{outcome="unauthorized"}"#
        ),
        4.0
    );
    // Without a clients file nobody may introspect, and discovery does not offer it.
    let closed = spawn_app_with(|c| c.oidc.issuer = Some(ISSUER.into())).await;
    let answer = http(closed.addr, "POST", "/oauth2/introspect", &headers, &form).await;
    assert_eq!(answer.status, 401);
    let doc = http(
        closed.addr,
        "GET",
        "/.well-known/openid-configuration",
        "",
        "",
    )
    .await
    .json();
    assert!(doc.get("introspection_endpoint").is_none(), "{doc}");
}

#[tokio::test]
async fn a_bad_introspection_keys_file_stops_the_start_with_its_line() {
    let mut bad = tempfile::NamedTempFile::new().unwrap();
    writeln!(bad, "gateway admin {}", "0".repeat(64)).unwrap();
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut config = crate::helpers::test_config(db.url.clone());
    config.oidc.introspection_keys_file = Some(bad.path().to_owned());
    let err = authd::app::Application::build(config)
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("AUTHD_INTROSPECTION_KEYS_FILE"), "{err}");
    assert!(err.contains("line 1: unknown role"), "{err}");
}

#[tokio::test]
async fn introspection_has_its_own_rate_limit_rule() {
    let clients = clients_file();
    let settings = standard(None, &clients);
    let mut app = spawn_app_with(|c| {
        settings(c);
        c.limits.rate_limits = Some("Introspect:peer=2/1h".parse().unwrap());
    })
    .await;
    let token = user(&mut app, "ada").await.access_token;
    for _ in 0..2 {
        assert_eq!(introspect(&app, &token).await.status, 200);
    }
    let refused = introspect(&app, &token).await;
    assert_eq!(refused.status, 429, "{}", refused.body);
    let wait: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!(wait >= 1);
    // Other methods are not counted by the rule.
    app.validate(&token).await.unwrap();
}

#[tokio::test]
async fn revocation_ends_the_session_of_a_refresh_or_access_token_and_answers_200_to_anything() {
    let clients = clients_file();
    let mut app = spawn_app_with(standard(None, &clients)).await;
    let by_refresh = user(&mut app, "ada").await;
    let answer = revoke(
        &app,
        &format!(
            "token={}&token_type_hint=refresh_token",
            by_refresh.refresh_token
        ),
    )
    .await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(answer.header("cache-control"), Some("no-store"));
    let refreshed = app
        .client
        .refresh(RefreshRequest {
            refresh_token: by_refresh.refresh_token.clone(),
        })
        .await;
    expect_code(refreshed, Code::Unauthenticated);
    expect_code(
        app.validate(&by_refresh.access_token).await,
        Code::Unauthenticated,
    );

    let by_access = user(&mut app, "grace").await;
    let answer = revoke(&app, &format!("token={}", by_access.access_token)).await;
    assert_eq!(answer.status, 200);
    expect_code(
        app.validate(&by_access.access_token).await,
        Code::Unauthenticated,
    );
    let refreshed = app
        .client
        .refresh(RefreshRequest {
            refresh_token: by_access.refresh_token.clone(),
        })
        .await;
    expect_code(refreshed, Code::Unauthenticated);

    // Unknown, malformed and already revoked: 200, nothing ended.
    for form in [
        "token=unknown".to_owned(),
        "token=a.b.c".to_owned(),
        format!("token={}", by_access.access_token),
        format!(
            "token={}&token_type_hint=access_token",
            by_refresh.refresh_token
        ),
    ] {
        assert_eq!(revoke(&app, &form).await.status, 200, "{form}");
    }
    let text = app.handle.render_metrics();
    assert_eq!(
        metric_of(&text, r#"authd_token_revocations_total{outcome="ended"}"#),
        2.0
    );
    assert_eq!(
        metric_of(&text, r#"authd_token_revocations_total{outcome="nothing"}"#),
        4.0
    );
    let large = format!("token={}", "a".repeat(MAX_FORM_BYTES));
    assert_eq!(revoke(&app, &large).await.status, 413);
}

/// A program found on the PATH.
fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

#[tokio::test]
async fn curl_discovers_and_introspects() {
    let Some(curl) = on_path("curl") else {
        skipped("curl_discovers_and_introspects", "curl is not installed");
        return;
    };
    let clients = clients_file();
    let mut app = spawn_app_with(standard(Some(ISSUER), &clients)).await;
    let token = user(&mut app, "ada").await.access_token;
    let base = format!("http://{}", app.addr);
    // Blocking: curl runs on a thread of its own while this runtime serves it.
    let run = |args: Vec<String>| {
        let curl = curl.clone();
        async move {
            let out = tokio::task::spawn_blocking(move || {
                Command::new(&curl).args(&args).output().unwrap()
            })
            .await
            .unwrap();
            assert!(out.status.success(), "{out:?}");
            serde_json::from_slice::<Value>(&out.stdout).unwrap()
        }
    };
    // As docs/api.md shows them.
    let doc = run(vec![
        "-sS".into(),
        format!("{base}/.well-known/openid-configuration"),
    ])
    .await;
    assert_eq!(doc["issuer"], ISSUER);
    let introspect = |extra: &'static [&'static str]| {
        let mut args: Vec<String> = vec!["-sS".into()];
        args.extend(extra.iter().map(|a| a.to_string()));
        args.extend([
            "-u".into(),
            format!("{CLIENT_ID}:{SECRET}"),
            "-d".into(),
            format!("token={token}"),
            format!("{base}/oauth2/introspect"),
        ]);
        run(args)
    };
    let answer = introspect(&[]).await;
    assert_eq!(answer["active"], true);
    assert_eq!(answer["username"], "ada");
    // HTTP/2 without TLS (prior knowledge), as gRPC clients speak it.
    let answer = introspect(&["--http2-prior-knowledge"]).await;
    assert_eq!(answer["active"], true);
    let answer = run(vec![
        "-sS".into(),
        "-d".into(),
        format!("token={token}"),
        format!("{base}/oauth2/revoke"),
    ])
    .await;
    assert_eq!(answer, json!({}));
    assert_eq!(introspect(&[]).await, json!({"active": false}));
}

/// A Python with PyJWT, requests and Authlib: `AUTHD_TEST_PYTHON`, else the venv
/// `.ci/run` makes.
fn python(test: &str) -> Option<PathBuf> {
    let candidate = match std::env::var_os("AUTHD_TEST_PYTHON") {
        Some(path) => PathBuf::from(path),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".ci/.venv/bin/python"),
    };
    let usable = Command::new(&candidate)
        .args(["-c", "import jwt, requests, authlib, cryptography"])
        .output()
        .is_ok_and(|out| out.status.success());
    if !usable {
        skipped(
            test,
            "no Python with PyJWT[crypto], requests and authlib (AUTHD_TEST_PYTHON or .ci/.venv)",
        );
        return None;
    }
    Some(candidate)
}

/// Discovers the keys from the issuer URL alone and verifies the token with PyJWT;
/// introspects it and revokes the refresh token with Authlib's OAuth 2.0 client.
const PYTHON_CLIENT: &str = r#"
import json, os, jwt, requests
from authlib.integrations.requests_client import OAuth2Session

issuer = os.environ["ISSUER"]
doc = requests.get(issuer + "/.well-known/openid-configuration", timeout=10).json()
assert doc["issuer"] == issuer, doc
token = os.environ["TOKEN"]
key = jwt.PyJWKClient(doc["jwks_uri"]).get_signing_key_from_jwt(token)
claims = jwt.decode(
    token, key.key, algorithms=doc["id_token_signing_alg_values_supported"], issuer=issuer
)
client = OAuth2Session(
    os.environ["CLIENT_ID"],
    os.environ["SECRET"],
    token_endpoint_auth_method="client_secret_basic",
    revocation_endpoint_auth_method="client_secret_basic",
)
introspected = client.introspect_token(doc["introspection_endpoint"], token=token)
introspected.raise_for_status()
revoked = client.revoke_token(
    doc["revocation_endpoint"], token=os.environ["REFRESH"], token_type_hint="refresh_token"
)
print(json.dumps({
    "claims": claims,
    "introspection": introspected.json(),
    "revoked": revoked.status_code,
}))
"#;

#[tokio::test]
async fn python_oidc_clients_discover_verify_introspect_and_revoke() {
    let test = "python_oidc_clients_discover_verify_introspect_and_revoke";
    let Some(python) = python(test) else { return };
    let clients = clients_file();
    let entry = generate_key_entry(KeyAlgorithm::EdDsa, "ed1").unwrap();
    // The issuer is this server's own URL: the port is known once it is bound, so
    // bind one first and hand it over, on a loopback address of this test's own (the
    // other tests bind 127.0.0.1:0, which never takes a port of this address).
    let probe = std::net::TcpListener::bind("127.0.0.77:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let issuer = format!("http://{addr}");
    let settings = standard(Some(&issuer), &clients);
    let mut app = spawn_app_with(|c| {
        settings(c);
        c.server.listen = addr;
        c.tokens.token_keys = Some(entry.parse().unwrap());
    })
    .await;
    let login = user(&mut app, "ada").await;
    let out = tokio::task::spawn_blocking({
        let (token, refresh, issuer) = (
            login.access_token.clone(),
            login.refresh_token.clone(),
            issuer.clone(),
        );
        move || {
            Command::new(&python)
                .args(["-c", PYTHON_CLIENT])
                .env("ISSUER", issuer)
                .env("TOKEN", token)
                .env("REFRESH", refresh)
                .env("CLIENT_ID", CLIENT_ID)
                .env("SECRET", SECRET)
                .output()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["claims"], claims(&login.access_token));
    assert_eq!(result["claims"]["iss"], issuer);
    assert_eq!(result["introspection"]["active"], true);
    assert_eq!(result["introspection"]["username"], "ada");
    assert_eq!(result["revoked"], 200);
    let refreshed = app
        .client
        .refresh(RefreshRequest {
            refresh_token: login.refresh_token,
        })
        .await;
    expect_code(refreshed, Code::Unauthenticated);
}

#[tokio::test]
async fn a_form_whose_body_never_arrives_is_answered_408_at_the_receive_timeout() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let app = spawn_app_with(|c| c.overload.receive_timeout = Duration::from_millis(200)).await;
    let mut stream = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    // Headers promising 100 bytes, then 10 of them and nothing more.
    let head = format!(
        "POST /oauth2/revoke HTTP/1.1\r\nHost: {}\r\n\
         content-type: application/x-www-form-urlencoded\r\ncontent-length: 100\r\n\r\ntoken=abcd",
        app.addr
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0; 1024];
    let n = stream.read(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
}
