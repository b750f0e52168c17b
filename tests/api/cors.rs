//! CORS on the gRPC port: a listed origin gets its headers on JSON and gRPC-Web
//! answers and its preflight answered by authd itself (the service never sees it);
//! an unlisted origin gets no CORS header and a 403 preflight; with no origin
//! configured, no CORS header at all.

use crate::{
    grpc_web::grpc_web,
    helpers::{TestApp, spawn_app, spawn_app_with},
    http_json::{Reply, Version, call_json, metrics_text, send},
};
use authd::pb;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use http_body_util::Full;
use prost::Message as _;
use serde_json::json;

const ALLOWED: &str = "https://app.example";
const OTHER: &str = "https://evil.example";

async fn app_allowing(origins: &str) -> TestApp {
    let origins = origins.to_owned();
    spawn_app_with(move |c| c.server.cors_origins = origins.parse().unwrap()).await
}

async fn json_from(app: &TestApp, version: Version, origin: &str) -> Reply {
    let request = Request::post("http://localhost/auth.v1.AuthService/ValidateToken")
        .header("content-type", "application/json")
        .header("origin", origin)
        .body(Full::new(Bytes::from(
            json!({ "accessToken": "x" }).to_string(),
        )))
        .unwrap();
    send(app.addr, version, request).await
}

async fn preflight(app: &TestApp, origin: &str) -> Reply {
    let request = Request::options("http://localhost/auth.v1.AuthService/Login")
        .header("origin", origin)
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "content-type, connect-protocol-version",
        )
        .body(Full::new(Bytes::new()))
        .unwrap();
    send(app.addr, Version::H1, request).await
}

fn cors_headers(reply: &Reply) -> Vec<&str> {
    reply
        .headers
        .keys()
        .map(|name| name.as_str())
        .filter(|name| name.starts_with("access-control-"))
        .collect()
}

#[tokio::test]
async fn a_listed_origin_gets_its_headers_and_credentials() {
    let app = app_allowing(&format!("{ALLOWED}, http://localhost:3000")).await;
    for version in [Version::H1, Version::H2] {
        let reply = json_from(&app, version, ALLOWED).await;
        assert_eq!(reply.status, 401, "served as any call: {reply:?}");
        assert_eq!(reply.header("access-control-allow-origin"), Some(ALLOWED));
        assert_eq!(
            reply.header("access-control-allow-credentials"),
            Some("true")
        );
        assert_eq!(reply.header("vary"), Some("origin"));
        let exposed = reply.header("access-control-expose-headers").unwrap();
        for name in [
            "grpc-status",
            "grpc-message",
            "grpc-status-details-bin",
            "retry-after",
        ] {
            assert!(exposed.contains(name), "{exposed}");
        }
    }
    // gRPC-Web too.
    let request = Request::post("http://localhost/auth.v1.AuthService/ValidateToken")
        .header("content-type", "application/grpc-web+proto")
        .header("origin", ALLOWED)
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .unwrap();
    let reply = send(app.addr, Version::H2, request).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("access-control-allow-origin"), Some(ALLOWED));
    let mut headers = HeaderMap::new();
    headers.insert("origin", HeaderValue::from_static("http://localhost:3000"));
    let request = pb::ValidateTokenRequest {
        access_token: "x".into(),
        ..Default::default()
    };
    let (_, status) = grpc_web(
        app.addr,
        Version::H1,
        "/auth.v1.AuthService/ValidateToken",
        &request.encode_to_vec(),
        false,
        headers,
    )
    .await;
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    app.stop().await.unwrap();
}

#[tokio::test]
async fn an_unlisted_origin_gets_no_cors_header() {
    let app = app_allowing(ALLOWED).await;
    let reply = json_from(&app, Version::H1, OTHER).await;
    // Answered (a browser keeps it from the page), without any CORS header.
    assert_eq!(reply.status, 401);
    assert!(cors_headers(&reply).is_empty(), "{reply:?}");
    // A prefix or a different port is another origin.
    let reply = json_from(&app, Version::H1, "https://app.example:8443").await;
    assert!(cors_headers(&reply).is_empty());
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_preflight_is_answered_without_touching_the_service() {
    let app = app_allowing(ALLOWED).await;
    let allowed = preflight(&app, ALLOWED).await;
    assert_eq!(allowed.status, 204);
    assert_eq!(allowed.header("access-control-allow-origin"), Some(ALLOWED));
    assert_eq!(
        allowed.header("access-control-allow-credentials"),
        Some("true")
    );
    assert_eq!(
        allowed.header("access-control-allow-methods"),
        Some("POST, GET")
    );
    let headers = allowed.header("access-control-allow-headers").unwrap();
    for name in [
        "content-type",
        "connect-protocol-version",
        "connect-timeout-ms",
        "grpc-timeout",
        "x-grpc-web",
        "x-user-agent",
        "authorization",
    ] {
        assert!(headers.contains(name), "{headers}");
    }
    assert!(allowed.header("access-control-max-age").is_some());

    let refused = preflight(&app, OTHER).await;
    assert_eq!(refused.status, 403);
    assert!(cors_headers(&refused).is_empty());

    // Neither reached the service: no request was counted.
    let text = metrics_text(&app).await;
    let counted: f64 = text
        .lines()
        .filter(|l| l.starts_with("authd_grpc_requests_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(counted, 0.0);
    app.stop().await.unwrap();
}

#[tokio::test]
async fn nothing_is_allowed_by_default() {
    let app = spawn_app().await;
    assert_eq!(preflight(&app, ALLOWED).await.status, 403);
    let reply = json_from(&app, Version::H2, ALLOWED).await;
    assert!(cors_headers(&reply).is_empty());
    let reply = call_json(app.addr, Version::H1, "ValidateToken", json!({})).await;
    assert!(cors_headers(&reply).is_empty());
    app.stop().await.unwrap();
}
