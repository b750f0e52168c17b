//! Webhooks through the real server, to loopback endpoints this test serves, on
//! both backends: deliveries signed the Standard Webhooks way (verified here and
//! by the reference Python package), in order, retried after failures; a hanging
//! endpoint delays no other; a restart mid-retry loses nothing. (Endpoints over TLS:
//! `webhooks_tls.rs`.)

use crate::{
    helpers::{TestDb, metric, spawn_app_on, wait_until},
    tls::Pair,
};
use base64::{Engine as _, engine::general_purpose::STANDARD};
use bytes::Bytes;
use hmac::{Hmac, KeyInit as _, Mac as _};
use http_body_util::{BodyExt as _, Full};
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::rt::TokioIo;
use sha2::Sha256;
use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpListener,
};
use tokio_rustls::{TlsAcceptor, rustls::ServerConfig};

crate::backend_tests!(
    deliveries_are_signed_in_order_and_retried_after_failures,
    a_restart_in_the_middle_of_retries_loses_nothing,
    a_hanging_endpoint_delays_no_other,
);

const SECRET_BYTES: [u8; 32] = *b"a webhook secret of 32 bytes!!!!";

pub(crate) fn secret() -> String {
    format!("whsec_{}", STANDARD.encode(SECRET_BYTES))
}

/// One request an endpoint received.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    id: String,
    timestamp: String,
    signature: String,
    pub(crate) body: String,
    /// The answer it got: 2xx or not.
    accepted: bool,
}

/// A loopback webhook endpoint: answers 500 to its first `failures` requests (or
/// never, while `hang`), 204 to the others, and keeps every request. Started with a
/// certificate, it speaks HTTPS, presents the certificate last given
/// ([`Endpoint::present`]) and counts the handshakes that did not complete.
#[derive(Clone)]
pub(crate) struct Endpoint {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    failures: Arc<AtomicUsize>,
    hang: Arc<AtomicBool>,
    tls: Option<Arc<Mutex<Arc<ServerConfig>>>>,
    refused: Arc<AtomicUsize>,
}

impl Endpoint {
    pub(crate) async fn start(failures: usize) -> Self {
        Self::serve(failures, None).await
    }

    /// An HTTPS endpoint presenting `pair`.
    pub(crate) async fn start_tls(failures: usize, pair: &Pair) -> Self {
        Self::serve(failures, Some(pair.server_config())).await
    }

    async fn serve(failures: usize, tls: Option<Arc<ServerConfig>>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = Endpoint {
            addr: listener.local_addr().unwrap(),
            received: Arc::default(),
            failures: Arc::new(AtomicUsize::new(failures)),
            hang: Arc::default(),
            tls: tls.map(|config| Arc::new(Mutex::new(config))),
            refused: Arc::default(),
        };
        let this = endpoint.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let this = this.clone();
                tokio::spawn(async move {
                    let tls = (this.tls.as_ref()).map(|config| config.lock().unwrap().clone());
                    match tls {
                        None => this.http(tcp).await,
                        Some(config) => match TlsAcceptor::from(config).accept(tcp).await {
                            Ok(tls) => this.http(tls).await,
                            // The client refused the certificate (an alert), or
                            // hung up before the handshake's end.
                            Err(_) => {
                                this.refused.fetch_add(1, Ordering::SeqCst);
                            }
                        },
                    }
                });
            }
        });
        endpoint
    }

    /// Serves HTTP/1.1 on one connection.
    async fn http(self, io: impl AsyncRead + AsyncWrite + Unpin + Send + 'static) {
        let service = service_fn(move |request: Request<Incoming>| {
            let this = self.clone();
            async move { Ok::<_, hyper::Error>(this.answer(request).await) }
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(io), service)
            .await;
    }

    /// Presents `pair` from the next connection on (an HTTPS endpoint).
    pub(crate) fn present(&self, pair: &Pair) {
        let tls = self.tls.as_ref().expect("an HTTPS endpoint");
        *tls.lock().unwrap() = pair.server_config();
    }

    /// The handshakes that did not complete.
    pub(crate) fn refused(&self) -> usize {
        self.refused.load(Ordering::SeqCst)
    }

    async fn answer(&self, request: Request<Incoming>) -> Response<Full<Bytes>> {
        let header = |name: &str| {
            (request.headers().get(name))
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        let (id, timestamp, signature) = (
            header("webhook-id"),
            header("webhook-timestamp"),
            header("webhook-signature"),
        );
        let body = request.into_body().collect().await.unwrap().to_bytes();
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        let accepted = self
            .failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err();
        self.received.lock().unwrap().push(Received {
            id,
            timestamp,
            signature,
            body: String::from_utf8(body.to_vec()).unwrap(),
            accepted,
        });
        let status = if accepted { 204 } else { 500 };
        Response::builder()
            .status(status)
            .body(Full::new(Bytes::new()))
            .unwrap()
    }

    pub(crate) fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}/hook", self.addr)
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    pub(crate) fn delivered(&self) -> Vec<Received> {
        self.received().into_iter().filter(|r| r.accepted).collect()
    }
}

pub(crate) fn verify(r: &Received) {
    let mut mac = <Hmac<Sha256>>::new_from_slice(&SECRET_BYTES).unwrap();
    mac.update(format!("{}.{}.{}", r.id, r.timestamp, r.body).as_bytes());
    let expected = format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()));
    assert_eq!(r.signature, expected, "{r:?}");
}

pub(crate) fn position(r: &Received) -> u64 {
    let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(r.id, format!("evt_{}", body["position"]));
    body["position"].as_u64().unwrap()
}

pub(crate) fn webhooks(endpoints: Vec<String>) -> impl FnOnce(&mut authd::config::Config) {
    move |c| {
        c.events.webhooks = endpoints.iter().map(|e| e.parse().unwrap()).collect();
        c.events.webhook_secret = Some(secret().parse().unwrap());
        c.events.webhook_retry_max = Duration::from_millis(50);
        c.events.events_poll = Duration::from_millis(20);
    }
}

/// A Python with the `standardwebhooks` package: `AUTHD_TEST_PYTHON` (the venv
/// `.ci/run` makes), else `python3` when it has it.
fn python_with_standardwebhooks() -> Option<std::ffi::OsString> {
    let python = std::env::var_os("AUTHD_TEST_PYTHON").unwrap_or_else(|| "python3".into());
    let ok = std::process::Command::new(&python)
        .args(["-c", "import standardwebhooks"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(python)
}

/// Each delivery verified by the reference library (`Webhook(secret).verify`),
/// which also checks the timestamp against the machine's time.
const PYTHON_VERIFY: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
secret, deliveries = sys.argv[1], json.load(sys.stdin)
hook = Webhook(secret)
for d in deliveries:
    headers = {"webhook-id": d["id"], "webhook-timestamp": d["timestamp"], "webhook-signature": d["signature"]}
    payload = hook.verify(d["body"], headers)
    assert payload["position"] > 0, payload
print(len(deliveries))
"#;

/// Verifies `delivered` with the reference library; `test` names the caller when
/// there is no Python with it.
pub(crate) fn verify_in_python(test: &str, delivered: &[Received]) {
    let Some(python) = python_with_standardwebhooks() else {
        crate::helpers::skipped(
            &format!("{test} (Python part)"),
            "no Python with standardwebhooks (AUTHD_TEST_PYTHON)",
        );
        return;
    };
    let input: Vec<serde_json::Value> = delivered
        .iter()
        .map(|r| {
            serde_json::json!({
                "id": r.id, "timestamp": r.timestamp, "signature": r.signature, "body": r.body,
            })
        })
        .collect();
    let mut child = std::process::Command::new(python)
        .args(["-c", PYTHON_VERIFY, &secret()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(serde_json::to_string(&input).unwrap().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        delivered.len().to_string()
    );
}

async fn deliveries_are_signed_in_order_and_retried_after_failures(db: TestDb) {
    let failing = Endpoint::start(2).await;
    // Wants one type only: skips the rest.
    let picky = Endpoint::start(0).await;
    let endpoints = vec![
        failing.url(),
        format!("user.password_changed={}", picky.url()),
    ];
    let mut app = spawn_app_on(&db, webhooks(endpoints)).await;
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            app.register(&format!("hooked{i}"), "a fine password")
                .await
                .unwrap(),
        );
    }
    // The endpoint keeps a request before authd counts its answer: both awaited.
    let delivered_count = || {
        metric(
            &app.handle.render_metrics(),
            "authd_webhook_deliveries_total{outcome=\"delivered\"}",
        )
    };
    wait_until("five deliveries, counted", || {
        failing.delivered().len() == 5 && delivered_count() >= Some(5.0)
    })
    .await;
    let received = failing.received();
    // The first event failed twice, and was retried before anything else was sent.
    assert_eq!(received.len(), 7);
    assert!(!received[0].accepted && !received[1].accepted && received[2].accepted);
    assert_eq!(position(&received[0]), position(&received[2]));
    let delivered = failing.delivered();
    let positions: Vec<u64> = delivered.iter().map(position).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    for (r, id) in delivered.iter().zip(&ids) {
        verify(r);
        let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(body["type"], "user.registered");
        assert_eq!(&body["user_id"], id);
        assert!(!r.body.contains("a fine password"));
    }
    assert!(picky.received().is_empty());
    let text = app.handle.render_metrics();
    assert_eq!(
        metric(&text, "authd_webhook_deliveries_total{outcome=\"failed\"}"),
        Some(2.0)
    );
    assert_eq!(
        metric(
            &text,
            "authd_webhook_deliveries_total{outcome=\"delivered\"}"
        ),
        Some(5.0)
    );
    // Stopped first: a run without the Python package ends the test here, with no
    // server left running.
    app.stop().await.unwrap();
    verify_in_python(
        "deliveries_are_signed_in_order_and_retried_after_failures",
        &delivered,
    );
}

async fn a_restart_in_the_middle_of_retries_loses_nothing(db: TestDb) {
    let endpoint = Endpoint::start(usize::MAX).await;
    let mut app = spawn_app_on(&db, webhooks(vec![endpoint.url()])).await;
    for i in 0..3 {
        app.register(&format!("restart{i}"), "a fine password")
            .await
            .unwrap();
    }
    wait_until("three failed attempts", || endpoint.received().len() >= 3).await;
    app.stop().await.unwrap();
    // The endpoint recovers while authd is down; the next start resumes.
    endpoint.failures.store(0, Ordering::SeqCst);
    let mut app = spawn_app_on(&db, webhooks(vec![endpoint.url()])).await;
    app.register("restart3", "a fine password").await.unwrap();
    wait_until("four deliveries", || endpoint.delivered().len() == 4).await;
    let delivered = endpoint.delivered();
    let positions: Vec<u64> = delivered.iter().map(position).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    // The first delivered is the event retried before the restart.
    assert_eq!(positions[0], position(&endpoint.received()[0]));
    app.stop().await.unwrap();
}

async fn a_hanging_endpoint_delays_no_other(db: TestDb) {
    let hanging = Endpoint::start(0).await;
    hanging.hang.store(true, Ordering::SeqCst);
    let healthy = Endpoint::start(0).await;
    let urls = vec![hanging.url(), healthy.url()];
    let mut app = spawn_app_on(&db, move |c| {
        webhooks(urls)(c);
        c.events.webhook_timeout = Duration::from_secs(600);
    })
    .await;
    for i in 0..3 {
        app.register(&format!("hang{i}"), "a fine password")
            .await
            .unwrap();
    }
    wait_until("the healthy endpoint has all three", || {
        healthy.delivered().len() == 3
    })
    .await;
    assert!(
        hanging.received().is_empty(),
        "the hanging endpoint never answered"
    );
    app.stop().await.unwrap();
}
