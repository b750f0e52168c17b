//! A real browser calls authd: headless Chromium loads a page from an origin of its
//! own (a second loopback address), which registers, logs in and validates a token
//! through authd's JSON form (`fetch`) and through gRPC-Web (Connect's gRPC-Web
//! transport from npm, the service read from authd's descriptor set), with CORS
//! allowing that origin; the same page from an origin not on the list is refused by
//! the browser itself.
//!
//! The page is `tests/browser/page.js`, bundled by `npm ci && npm run build` in
//! `tests/browser` (`.ci/run` does it) into `tests/browser/dist/page.js`, or found at
//! `AUTHD_TEST_BROWSER_PAGE`. Chromium is `AUTHD_TEST_CHROMIUM` or `chromium` on the
//! PATH (Debian's package; `.ci/run` installs it). Without either the test is skipped
//! (one line), unless AUTHD_TEST_REQUIRE_SERVICES=1.

use crate::helpers::{TestApp, skipped, spawn_app_with};
use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::header,
    response::{Html, IntoResponse},
    routing::{get, post},
};
use serde_json::Value;
use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};
use tokio::sync::mpsc;

/// Chromium and the bundled page, or `None` (and one line) when `test` is skipped.
fn browser_and_page(test: &str) -> Option<(PathBuf, Vec<u8>)> {
    let chromium = std::env::var_os("AUTHD_TEST_CHROMIUM")
        .map(PathBuf::from)
        .or_else(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .map(|dir| dir.join("chromium"))
                .find(|p| p.is_file())
        });
    let Some(chromium) = chromium else {
        skipped(test, "Chromium is not installed (apt-get install chromium)");
        return None;
    };
    let page = std::env::var_os("AUTHD_TEST_BROWSER_PAGE").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/browser/dist/page.js"),
        PathBuf::from,
    );
    let Ok(page) = std::fs::read(&page) else {
        skipped(
            test,
            "the page is not built (npm ci && npm run build in tests/browser)",
        );
        return None;
    };
    Some((chromium, page))
}

/// The page's own origin: the page, its script, authd's descriptor set (for the
/// gRPC-Web client) and `/result`, where the page posts what it saw.
struct PageServer {
    origin: String,
    results: mpsc::Receiver<Value>,
    task: tokio::task::JoinHandle<()>,
}

impl PageServer {
    async fn start(address: &str, script: Vec<u8>) -> Self {
        let listener = tokio::net::TcpListener::bind((address, 0)).await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let (tx, results) = mpsc::channel(4);
        let script = Bytes::from(script);
        let router = Router::new()
            .route(
                "/",
                get(|| async {
                    Html(r#"<!doctype html><script type="module" src="/page.js"></script>"#)
                }),
            )
            .route(
                "/page.js",
                get(move || {
                    let script = script.clone();
                    async move { ([(header::CONTENT_TYPE, "text/javascript")], script) }
                }),
            )
            .route(
                "/descriptors.bin",
                get(|| async {
                    (
                        [(header::CONTENT_TYPE, "application/octet-stream")],
                        authd::pb::FILE_DESCRIPTOR_SET,
                    )
                }),
            )
            .route(
                "/result",
                post(
                    |State(tx): State<mpsc::Sender<Value>>, body: Bytes| async move {
                        let value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let _ = tx.send(value).await;
                        "ok".into_response()
                    },
                ),
            )
            .with_state(tx);
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        Self {
            origin: format!("http://{addr}"),
            results,
            task,
        }
    }
}

impl Drop for PageServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Headless Chromium on one URL, killed when dropped.
struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
}

impl Browser {
    fn open(chromium: &PathBuf, url: &str) -> Self {
        let profile = tempfile::tempdir().unwrap();
        let child = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(url)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Chromium starts");
        Self {
            child,
            _profile: profile,
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Loads the page from `page` against `app` and returns what it posted.
async fn visit(chromium: &PathBuf, page: &mut PageServer, app: &TestApp, user: &str) -> Value {
    let url = format!("{}/?authd=http://{}&user={user}", page.origin, app.addr);
    let _browser = Browser::open(chromium, &url);
    // A bound on a wait that ends as soon as the page posts, not a timing assertion.
    tokio::time::timeout(Duration::from_secs(120), page.results.recv())
        .await
        .expect("the page posts its result")
        .expect("the page server runs")
}

#[tokio::test]
async fn a_browser_on_an_allowed_origin_calls_authd_over_json_and_grpc_web_and_another_origin_is_refused()
 {
    let test = "a_browser_on_an_allowed_origin_calls_authd";
    let Some((chromium, script)) = browser_and_page(test) else {
        return;
    };
    let mut allowed = PageServer::start("127.0.0.2", script.clone()).await;
    let mut other = PageServer::start("127.0.0.3", script).await;
    let origin = allowed.origin.clone();
    let app = spawn_app_with(move |c| c.server.cors_origins = origin.parse().unwrap()).await;

    let seen = visit(&chromium, &mut allowed, &app, "browser").await;
    let json = &seen["json"];
    assert_eq!(json["register"], 200, "{seen}");
    assert_eq!(json["login"], 200, "{seen}");
    assert_eq!(json["validate"], 200, "{seen}");
    assert_eq!(json["validatedUsername"], "browser-json", "{seen}");
    assert_eq!(json["validatedUserId"], json["userId"], "{seen}");
    assert_eq!(json["wrongStatus"], 401, "{seen}");
    assert_eq!(json["wrongCode"], "unauthenticated", "{seen}");
    let grpc_web = &seen["grpcWeb"];
    assert!(grpc_web["error"].is_null(), "{seen}");
    assert_eq!(grpc_web["validatedUsername"], "browser-grpc-web", "{seen}");
    assert_eq!(grpc_web["validatedUserId"], grpc_web["userId"], "{seen}");
    // Connect's code for UNAUTHENTICATED.
    assert_eq!(grpc_web["wrongCode"], 16, "{seen}");

    // The same page from an origin not on the list: the browser refuses to let it
    // read any answer (and sends no JSON call at all: its preflight is refused).
    let seen = visit(&chromium, &mut other, &app, "elsewhere").await;
    let refused = |what: &Value| what["error"].as_str().is_some_and(|e| e.contains("fetch"));
    assert!(refused(&seen["json"]), "{seen}");
    assert!(!seen["grpcWeb"]["error"].is_null(), "{seen}");
    assert!(seen["grpcWeb"]["userId"].is_null(), "{seen}");
    // Nobody was registered from there.
    let mut client = app.client.clone();
    let login = crate::helpers::login(
        &mut client,
        "elsewhere-json",
        "a fine password for a browser",
    )
    .await
    .unwrap_err();
    assert_eq!(login.code(), tonic::Code::Unauthenticated);
}
