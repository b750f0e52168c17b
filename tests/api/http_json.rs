//! The JSON form of every RPC (the Connect protocol's unary calls) on the gRPC port,
//! over HTTP/1.1 and HTTP/2: answers in proto3 JSON, errors in Connect's form, the
//! unknown path, the wrong method and media type, bodies malformed and too large,
//! deadlines from `Connect-Timeout-Ms`, the `protocol` label of the metrics; the
//! admin API's JSON form with its own credentials; one rate limit and one login
//! throttle across gRPC, gRPC-Web and JSON; and real clients: curl and Python's
//! `requests` (skipped, one line, when missing, unless AUTHD_TEST_REQUIRE_SERVICES=1).
//!
//! The HTTP client here (`send`, `Reply`) is hyper's connection API over TCP or TLS,
//! shared by the gRPC-Web and CORS tests: every status and header is seen as sent.

use crate::helpers::{metric_of, spawn_app};
use bytes::Bytes;
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use std::{net::SocketAddr, sync::Arc};
use tokio::net::TcpStream;

/// The HTTP version a request is sent with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    H1,
    H2,
}

/// An answer, whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().unwrap())
    }
}

/// Sends `request` on a new connection to `addr` (TLS when `tls` is given, with
/// ALPN for the version), and reads the whole answer.
pub async fn send_with(
    addr: SocketAddr,
    version: Version,
    tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
    request: Request<Full<Bytes>>,
) -> Reply {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    match tls {
        None => exchange(TokioIo::new(tcp), version, request).await,
        Some(config) => {
            let mut config = (*config).clone();
            config.alpn_protocols = vec![match version {
                Version::H1 => b"http/1.1".to_vec(),
                Version::H2 => b"h2".to_vec(),
            }];
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            let name = tokio_rustls::rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let stream = connector.connect(name, tcp).await.expect("TLS handshake");
            exchange(TokioIo::new(stream), version, request).await
        }
    }
}

/// [`send_with`] in plaintext.
pub async fn send(addr: SocketAddr, version: Version, request: Request<Full<Bytes>>) -> Reply {
    send_with(addr, version, None, request).await
}

async fn exchange<I>(io: I, version: Version, mut request: Request<Full<Bytes>>) -> Reply
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let response = match version {
        Version::H1 => {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            if !request.headers().contains_key(http::header::HOST) {
                request
                    .headers_mut()
                    .insert(http::header::HOST, "localhost".parse().unwrap());
            }
            sender.send_request(request).await.expect("an answer")
        }
        Version::H2 => {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(conn);
            *request.version_mut() = http::Version::HTTP_2;
            sender.send_request(request).await.expect("an answer")
        }
    };
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.expect("the whole body");
    Reply {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: collected.to_bytes(),
    }
}

/// A Connect JSON call's request to `path`, its body still to give.
pub fn json_request(path: &str) -> http::request::Builder {
    Request::builder()
        .method(Method::POST)
        .uri(format!("http://localhost{path}"))
        .header("content-type", "application/json")
}

/// Calls `method` of AuthService with a JSON `body` and returns the answer.
pub async fn call_json(addr: SocketAddr, version: Version, method: &str, body: Value) -> Reply {
    let request = json_request(&format!("/auth.v1.AuthService/{method}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    send(addr, version, request).await
}

#[tokio::test]
async fn register_login_and_validate_in_json_over_http1_and_http2() {
    let app = spawn_app().await;
    for (version, name) in [(Version::H1, "jsonone"), (Version::H2, "jsontwo")] {
        let credentials = json!({ "username": name, "password": "correct horse battery" });
        let registered = call_json(app.addr, version, "Register", credentials.clone()).await;
        assert_eq!(registered.status, 200, "{version:?}: {registered:?}");
        assert_eq!(registered.header("content-type"), Some("application/json"));
        assert!(registered.header("x-request-id").is_some());
        let user_id = registered.json()["userId"].as_str().unwrap().to_owned();

        let login = call_json(app.addr, version, "Login", credentials).await;
        assert_eq!(login.status, 200, "{login:?}");
        let login = login.json();
        // proto3 JSON: lowerCamelCase names, Timestamps as RFC 3339.
        assert_eq!(login["userId"], user_id.as_str());
        assert_eq!(login["tokenType"], "Bearer");
        assert!(login["expiresAt"].as_str().unwrap().ends_with('Z'));
        assert!(login["refreshToken"].as_str().is_some());
        let token = login["accessToken"].as_str().unwrap();

        let validated = call_json(
            app.addr,
            version,
            "ValidateToken",
            json!({ "accessToken": token }),
        )
        .await;
        assert_eq!(validated.status, 200);
        assert_eq!(validated.json()["username"], name);
        assert_eq!(validated.json()["userId"], user_id.as_str());
        // The proto field name is accepted too, as proto3 JSON parsers must.
        let validated = call_json(
            app.addr,
            version,
            "ValidateToken",
            json!({ "access_token": token }),
        )
        .await;
        assert_eq!(validated.status, 200);
    }
    app.stop().await.unwrap();
}

#[tokio::test]
async fn errors_are_one_status_and_one_json_body_with_the_grpc_code_and_details() {
    let app = spawn_app().await;
    let bad = call_json(
        app.addr,
        Version::H1,
        "Register",
        json!({ "username": "x", "password": "correct horse battery" }),
    )
    .await;
    assert_eq!(bad.status, 400);
    assert_eq!(bad.header("content-type"), Some("application/json"));
    let body = bad.json();
    assert_eq!(body["code"], "invalid_argument");
    assert!(body["message"].as_str().is_some());
    let detail = &body["details"][0];
    assert_eq!(detail["type"], "google.rpc.BadRequest");
    assert!(detail["value"].as_str().is_some());
    assert_eq!(detail["debug"]["fieldViolations"][0]["field"], "username");

    let wrong = call_json(
        app.addr,
        Version::H2,
        "Login",
        json!({ "username": "nobody", "password": "correct horse battery" }),
    )
    .await;
    assert_eq!(wrong.status, 401);
    assert_eq!(wrong.json()["code"], "unauthenticated");

    let credentials = json!({ "username": "twice", "password": "correct horse battery" });
    assert_eq!(
        call_json(app.addr, Version::H1, "Register", credentials.clone())
            .await
            .status,
        200
    );
    let taken = call_json(app.addr, Version::H1, "Register", credentials).await;
    assert_eq!(taken.status, 409);
    assert_eq!(taken.json()["code"], "already_exists");
    app.stop().await.unwrap();
}

#[tokio::test]
async fn malformed_and_oversized_bodies_are_refused_as_grpc_refuses_them() {
    let app = spawn_app().await;
    let secret = "hunter2-never-echoed";
    for body in [
        format!(r#"{{"username": "a", "password": "{secret}""#),
        format!(r#"{{"username": 7, "password": "{secret}"}}"#),
        format!(r#"{{"username": "a", "password": "{secret}"}} trailing"#),
    ] {
        let request = json_request("/auth.v1.AuthService/Login")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let reply = send(app.addr, Version::H1, request).await;
        assert_eq!(reply.status, 400);
        let answer = reply.json();
        assert_eq!(answer["code"], "invalid_argument");
        assert_eq!(answer["message"], "malformed request message");
        assert!(!String::from_utf8_lossy(&reply.body).contains(secret));
    }
    // Larger than any valid request, JSON or not: gRPC's code for an oversized
    // message (OUT_OF_RANGE), before the body is read to its end.
    let huge = json!({ "username": "a", "password": "p".repeat(64 * 1024) });
    let reply = call_json(app.addr, Version::H2, "Login", huge).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.json()["code"], "out_of_range");
    // Within the JSON bound but larger than a protobuf message may be: the same
    // refusal, from the decoder, as a gRPC client gets.
    let big = json!({ "username": "a", "password": "p".repeat(6 * 1024) });
    let reply = call_json(app.addr, Version::H1, "Login", big).await;
    assert_eq!(reply.json()["code"], "out_of_range");
    let text = metrics_text(&app).await;
    assert_eq!(
        metric_of(
            &text,
            r#"authd_grpc_requests_total{code="INVALID_ARGUMENT",method="Login",protocol="json",service="auth.v1.AuthService"}"#
        ),
        3.0
    );
    app.stop().await.unwrap();
}

/// The app's metrics text.
pub async fn metrics_text(app: &crate::helpers::TestApp) -> String {
    let addr = app.handle.metrics_addr().unwrap();
    let request = Request::get("http://localhost/metrics")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let reply = send(addr, Version::H1, request).await;
    String::from_utf8(reply.body.to_vec()).unwrap()
}

#[tokio::test]
async fn an_unknown_path_is_404_a_wrong_method_405_and_a_wrong_media_type_415() {
    let app = spawn_app().await;
    for version in [Version::H1, Version::H2] {
        let request = Request::get("http://localhost/no/such/path")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let reply = send(app.addr, version, request).await;
        assert_eq!(reply.status, 404, "{version:?}");
        assert_eq!(reply.json()["code"], "not_found");

        let request = Request::get("http://localhost/auth.v1.AuthService/Login")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let reply = send(app.addr, version, request).await;
        assert_eq!(reply.status, 405);
        assert_eq!(reply.header("allow"), Some("POST"));
        assert_eq!(reply.json()["code"], "unimplemented");

        let request = Request::post("http://localhost/auth.v1.AuthService/Login")
            .header("content-type", "text/plain")
            .body(Full::new(Bytes::from_static(b"hi")))
            .unwrap();
        let reply = send(app.addr, version, request).await;
        assert_eq!(reply.status, 415);

        // An unknown method of a known service is an unknown path.
        let request = json_request("/auth.v1.AuthService/Nothing")
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap();
        assert_eq!(send(app.addr, version, request).await.status, 404);
    }
    app.stop().await.unwrap();
}

#[tokio::test]
async fn the_request_metrics_carry_the_protocol() {
    let app = spawn_app().await;
    let mut client = app.client.clone();
    let _ = client
        .validate_token(authd::pb::ValidateTokenRequest {
            access_token: "x".into(),
            ..Default::default()
        })
        .await;
    for _ in 0..2 {
        let reply = call_json(
            app.addr,
            Version::H1,
            "ValidateToken",
            json!({ "accessToken": "x" }),
        )
        .await;
        assert_eq!(reply.status, 401);
    }
    let text = metrics_text(&app).await;
    let series = |protocol: &str| {
        format!(
            r#"authd_grpc_requests_total{{code="UNAUTHENTICATED",method="ValidateToken",protocol="{protocol}",service="auth.v1.AuthService"}}"#
        )
    };
    assert_eq!(metric_of(&text, &series("grpc")), 1.0);
    assert_eq!(metric_of(&text, &series("json")), 2.0);
    // Translated protocols' series come with their first request.
    assert_eq!(crate::helpers::metric(&text, &series("grpc-web")), None);
    app.stop().await.unwrap();
}

#[tokio::test]
async fn connect_timeout_ms_is_the_calls_deadline() {
    let app = spawn_app().await;
    let request = json_request("/auth.v1.AuthService/ValidateToken")
        .header("connect-timeout-ms", "0")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let reply = send(app.addr, Version::H1, request).await;
    // A deadline already passed: refused before any work, as gRPC's `grpc-timeout: 0m`.
    assert_eq!(reply.status, 504);
    assert_eq!(reply.json()["code"], "deadline_exceeded");
    let request = json_request("/auth.v1.AuthService/ValidateToken")
        .header("connect-timeout-ms", "soon")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    assert_eq!(send(app.addr, Version::H1, request).await.status, 400);
    app.stop().await.unwrap();
}

/// A JSON call of the admin API on `addr`, with `key` as its credential.
async fn admin_json(addr: SocketAddr, method: &str, key: Option<&str>, body: Value) -> Reply {
    let mut request = json_request(&format!("/auth.admin.v1.AdminService/{method}"));
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    send(addr, Version::H1, request).await
}

#[tokio::test]
async fn the_admin_port_speaks_json_with_its_own_credentials() {
    use crate::admin::{ADMIN_KEY, READ_KEY, admin_app};
    let db = crate::helpers::TestDb::new(crate::helpers::Backend::Sqlite, "")
        .await
        .unwrap();
    let admin = admin_app(&db, |_| {}).await;
    let mut app = admin.app;
    let user_id = app.register("adminjson", "a fine password").await.unwrap();
    let addr = app.handle.admin_addr().unwrap();
    let selector = json!({ "user": { "username": "adminjson" } });

    let found = admin_json(addr, "GetUser", Some(READ_KEY), selector.clone()).await;
    assert_eq!(found.status, 200, "{found:?}");
    let user = &found.json()["user"];
    assert_eq!(user["id"], user_id.as_str());
    assert_eq!(user["username"], "adminjson");

    // The same credentials as over gRPC: none, a wrong one, a read key for a change.
    let none = admin_json(addr, "GetUser", None, selector.clone()).await;
    assert_eq!(
        (none.status, none.json()["code"].clone()),
        (401, json!("unauthenticated"))
    );
    let wrong = admin_json(addr, "GetUser", Some("not-a-key"), selector.clone()).await;
    assert_eq!(wrong.status, 401);
    let disable = json!({ "user": { "username": "adminjson" }, "reason": "test" });
    let read_only = admin_json(addr, "DisableUser", Some(READ_KEY), disable.clone()).await;
    assert_eq!(
        (read_only.status, read_only.json()["code"].clone()),
        (403, json!("permission_denied"))
    );
    let disabled = admin_json(addr, "DisableUser", Some(ADMIN_KEY), disable).await;
    assert_eq!(disabled.status, 200, "{disabled:?}");
    let gone = admin_json(
        addr,
        "GetUser",
        Some(ADMIN_KEY),
        json!({ "user": { "username": "nobody" } }),
    )
    .await;
    assert_eq!(
        (gone.status, gone.json()["code"].clone()),
        (404, json!("not_found"))
    );

    // gRPC-Web too, with the same header.
    let request = authd::pb::admin::GetUserRequest {
        user: Some(authd::pb::admin::UserSelector {
            selector: Some(authd::pb::admin::user_selector::Selector::UserId(
                user_id.clone(),
            )),
        }),
    };
    let mut headers = HeaderMap::new();
    headers.insert(
        "authorization",
        format!("Bearer {READ_KEY}").parse().unwrap(),
    );
    let (message, status) = crate::grpc_web::grpc_web(
        addr,
        Version::H2,
        "/auth.admin.v1.AdminService/GetUser",
        &prost::Message::encode_to_vec(&request),
        false,
        headers,
    )
    .await;
    assert_eq!(status.code(), tonic::Code::Ok, "{status:?}");
    let answer: authd::pb::admin::GetUserResponse =
        prost::Message::decode(message.unwrap()).unwrap();
    assert!(answer.user.unwrap().disabled);

    // Each API only on its own port.
    let on_grpc_port = admin_json(app.addr, "GetUser", Some(ADMIN_KEY), selector).await;
    assert_eq!(on_grpc_port.status, 404);
    let auth_on_admin = call_json(addr, Version::H1, "ValidateToken", json!({})).await;
    assert_eq!(auth_on_admin.status, 404);
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_rate_limit_counts_grpc_grpc_web_and_json_calls_together() {
    use crate::grpc_web::{Wire, call};
    let app = crate::helpers::spawn_app_with(|c| {
        c.limits.rate_limits = Some("ValidateToken:global=4/1h".parse().unwrap());
    })
    .await;
    let request = || authd::pb::ValidateTokenRequest {
        access_token: "x".into(),
        ..Default::default()
    };
    let mut codes = Vec::new();
    for wire in [
        Wire::Grpc,
        Wire::Json,
        Wire::GrpcWeb,
        Wire::Json,
        Wire::Grpc,
        Wire::GrpcWebText,
    ] {
        let result: Result<authd::pb::ValidateTokenResponse, _> =
            call(app.addr, wire, "ValidateToken", request()).await;
        codes.push((wire, result.unwrap_err().code));
    }
    use tonic::Code::{ResourceExhausted, Unauthenticated};
    assert_eq!(
        codes,
        [
            (Wire::Grpc, Unauthenticated),
            (Wire::Json, Unauthenticated),
            (Wire::GrpcWeb, Unauthenticated),
            (Wire::Json, Unauthenticated),
            (Wire::Grpc, ResourceExhausted),
            (Wire::GrpcWebText, ResourceExhausted),
        ]
    );
    // In JSON: 429, the hint as a detail and as Retry-After.
    let refused = call_json(app.addr, Version::H2, "ValidateToken", json!({})).await;
    assert_eq!(refused.status, 429);
    let seconds: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&seconds), "{seconds}");
    let types: Vec<Value> = refused.json()["details"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["type"].clone())
        .collect();
    assert!(types.contains(&json!("google.rpc.RetryInfo")), "{types:?}");
    assert!(
        types.contains(&json!("google.rpc.QuotaFailure")),
        "{types:?}"
    );
    app.stop().await.unwrap();
}

#[tokio::test]
async fn the_login_throttle_counts_failures_in_every_protocol() {
    use crate::grpc_web::{Wire, call};
    let mut app = crate::helpers::spawn_app_with(|c| {
        let hour = std::time::Duration::from_secs(3600);
        c.limits.login_failures = 3;
        c.limits.login_delay = hour;
        c.limits.login_delay_max = hour;
    })
    .await;
    app.register("throttled", "correct horse battery")
        .await
        .unwrap();
    let wrong = || authd::pb::LoginRequest {
        username: "throttled".into(),
        password: "not the password".into(),
    };
    let mut codes = Vec::new();
    for wire in [Wire::Json, Wire::GrpcWeb, Wire::Grpc, Wire::Json] {
        let result: Result<authd::pb::LoginResponse, _> =
            call(app.addr, wire, "Login", wrong()).await;
        codes.push(result.unwrap_err().code);
    }
    use tonic::Code::{ResourceExhausted, Unauthenticated};
    assert_eq!(
        codes,
        [
            Unauthenticated,
            Unauthenticated,
            Unauthenticated,
            ResourceExhausted
        ]
    );
    // The right password too, while throttled, over gRPC and JSON alike.
    let right = json!({ "username": "throttled", "password": "correct horse battery" });
    let reply = call_json(app.addr, Version::H1, "Login", right).await;
    assert_eq!(reply.status, 429);
    assert!(reply.header("retry-after").is_some());
    crate::helpers::expect_code(
        app.login("throttled", "correct horse battery").await,
        ResourceExhausted,
    );
    app.stop().await.unwrap();
}

/// Runs `program` with `args` off the runtime (the server answers meanwhile) and
/// returns its exit success and standard output.
async fn run(program: std::path::PathBuf, args: Vec<String>) -> (bool, String, String) {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(program).args(args).output()
    })
    .await
    .unwrap()
    .expect("the program runs");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// `name` on the PATH, if it is there.
fn on_path(name: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

#[tokio::test]
async fn curl_calls_every_form_over_http1_and_http2() {
    let Some(curl) = on_path("curl") else {
        crate::helpers::skipped(
            "curl_calls_every_form_over_http1_and_http2",
            "curl is not installed",
        );
        return;
    };
    let app = spawn_app().await;
    let base = format!("http://{}/auth.v1.AuthService", app.addr);
    let args = |version: &str, method: &str, body: &str| -> Vec<String> {
        [
            "-sS",
            "--max-time",
            "30",
            version,
            "-H",
            "content-type: application/json",
            "-d",
            body,
            "-w",
            "\n%{http_code} %{http_version}",
            &format!("{base}/{method}"),
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let credentials = r#"{"username":"curluser","password":"correct horse battery"}"#;
    let (ok, out, err) = run(curl.clone(), args("--http1.1", "Register", credentials)).await;
    assert!(ok, "{err}");
    let (body, status) = out.rsplit_once('\n').unwrap();
    assert_eq!(status, "200 1.1");
    let user_id = serde_json::from_str::<Value>(body).unwrap()["userId"].clone();

    let (ok, out, err) = run(
        curl.clone(),
        args("--http2-prior-knowledge", "Login", credentials),
    )
    .await;
    assert!(ok, "{err}");
    let (body, status) = out.rsplit_once('\n').unwrap();
    assert_eq!(status, "200 2");
    assert_eq!(
        serde_json::from_str::<Value>(body).unwrap()["userId"],
        user_id
    );

    let (_, out, _) = run(
        curl,
        args(
            "--http1.1",
            "Register",
            r#"{"username":"x","password":"p"}"#,
        ),
    )
    .await;
    let (body, status) = out.rsplit_once('\n').unwrap();
    assert_eq!(status, "400 1.1");
    assert_eq!(
        serde_json::from_str::<Value>(body).unwrap()["code"],
        "invalid_argument"
    );
    app.stop().await.unwrap();
}

/// A Python interpreter with `requests`: `AUTHD_TEST_PYTHON` (the venv `.ci/run`
/// makes), else `python3` on the PATH when it has it.
fn python_with_requests() -> Option<std::path::PathBuf> {
    let python = std::env::var_os("AUTHD_TEST_PYTHON")
        .map(std::path::PathBuf::from)
        .or_else(|| on_path("python3"))?;
    let imports = std::process::Command::new(&python)
        .args(["-c", "import requests"])
        .output()
        .is_ok_and(|o| o.status.success());
    imports.then_some(python)
}

/// What the Python client does: register, log in, validate, and one error.
const PYTHON_CLIENT: &str = r#"
import json, sys, requests
base = sys.argv[1]
s = requests.Session()
def call(method, body):
    r = s.post(f"{base}/auth.v1.AuthService/{method}", json=body, timeout=30)
    return {"status": r.status_code, "body": r.json(), "retry_after": r.headers.get("Retry-After")}
creds = {"username": "pyuser", "password": "correct horse battery"}
out = {"register": call("Register", creds), "login": call("Login", creds)}
out["validate"] = call("ValidateToken", {"accessToken": out["login"]["body"]["accessToken"]})
out["bad"] = call("ValidateToken", {"accessToken": "nope"})
out["limited"] = call("ValidateToken", {"accessToken": "nope"})
print(json.dumps(out))
"#;

#[tokio::test]
async fn python_requests_calls_the_json_form() {
    let Some(python) = python_with_requests() else {
        crate::helpers::skipped(
            "python_requests_calls_the_json_form",
            "no Python with requests (AUTHD_TEST_PYTHON, or python3 with requests)",
        );
        return;
    };
    let app = crate::helpers::spawn_app_with(|c| {
        c.limits.rate_limits = Some("ValidateToken:peer=2/1h".parse().unwrap());
    })
    .await;
    let args = vec![
        "-c".to_owned(),
        PYTHON_CLIENT.to_owned(),
        format!("http://{}", app.addr),
    ];
    let (ok, out, err) = run(python, args).await;
    assert!(ok, "{err}");
    let out: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(out["register"]["status"], 200);
    assert_eq!(out["login"]["status"], 200);
    assert_eq!(out["validate"]["status"], 200);
    assert_eq!(out["validate"]["body"]["username"], "pyuser");
    assert_eq!(out["bad"]["status"], 401);
    assert_eq!(out["bad"]["body"]["code"], "unauthenticated");
    assert_eq!(out["limited"]["status"], 429);
    assert_eq!(out["limited"]["body"]["code"], "resource_exhausted");
    assert!(out["limited"]["retry_after"].as_str().is_some());
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_answered_and_the_call_never_made() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let app = crate::helpers::spawn_app_with(|c| {
        c.overload.receive_timeout = std::time::Duration::from_millis(100);
    })
    .await;
    let mut stream = TcpStream::connect(app.addr).await.unwrap();
    // Headers promising 100 bytes, then 10 of them, and no more.
    stream
        .write_all(
            b"POST /auth.v1.AuthService/Login HTTP/1.1\r\nhost: localhost\r\n\
              content-type: application/json\r\ncontent-length: 100\r\n\r\n{\"username",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.ends_with(b"}") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed before an answer: {answer:?}");
        answer.extend_from_slice(&buf[..n]);
    }
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 504"), "{answer}");
    assert!(answer.contains(r#""code":"deadline_exceeded""#), "{answer}");
    assert!(
        answer.contains("the request was not received in time"),
        "{answer}"
    );
    // Refused before the layers: no Login was counted.
    let text = metrics_text(&app).await;
    let logins: f64 = text
        .lines()
        .filter(|l| l.starts_with("authd_grpc_requests_total{") && l.contains(r#"method="Login""#))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(logins, 0.0);
    app.stop().await.unwrap();
}
