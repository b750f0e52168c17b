//! Traces, from outside: an OTLP collector started here (a tonic server of the
//! OpenTelemetry trace service on 127.0.0.1) receives what authd exports. A Login
//! that carries a W3C `traceparent` continues the caller's trace with a server span
//! and children for the hash queue, the hash and the store; with the collector down,
//! requests still succeed, the spans given up are counted and tracing pauses until
//! the collector is back.

use crate::{
    cli::spawn_authd,
    helpers::{login, register, spawn_app_with},
};
use authd::pb::LoginRequest;
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::any_value,
    trace::v1::{Span, span::SpanKind},
};
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status};

/// Every span the collector received, with the service name of its resource.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<(String, Span)>>>,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| string(a.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

fn string(value: &any_value::Value) -> Option<String> {
    match value {
        any_value::Value::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

impl Collector {
    /// Starts the collector on 127.0.0.1:0.
    async fn start() -> (Self, SocketAddr) {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    /// Starts the collector on `addr`.
    async fn start_on(addr: SocketAddr) -> (Self, SocketAddr) {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let collector = Collector::default();
        let service = TraceServiceServer::new(collector.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
        (collector, addr)
    }

    /// The spans of `trace_id` once `done` holds for them (polled; at most 30 s).
    async fn wait_for(&self, trace_id: &[u8], done: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        crate::helpers::wait_for("the collector receives the spans of the trace", || {
            let spans: Vec<Span> = (self.spans.lock().unwrap().iter())
                .filter(|(_, s)| s.trace_id == trace_id)
                .map(|(_, s)| s.clone())
                .collect();
            std::future::ready(done(&spans).then_some(spans))
        })
        .await
    }
}

fn attribute(span: &Span, key: &str) -> Option<any_value::Value> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.clone())
}

const TRACE_ID: [u8; 16] = [
    0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36,
];
const CALLER_SPAN: [u8; 8] = [0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7];

fn traceparent() -> String {
    format!(
        "00-{}-{}-01",
        hex::encode(TRACE_ID),
        hex::encode(CALLER_SPAN)
    )
}

fn login_with_traceparent(username: &str, password: &str) -> Request<LoginRequest> {
    let mut request = Request::new(LoginRequest {
        username: username.into(),
        password: password.into(),
    });
    request
        .metadata_mut()
        .insert("traceparent", traceparent().parse().unwrap());
    request
}

#[tokio::test]
async fn a_login_continues_the_callers_trace_with_spans_for_each_wait() {
    let (collector, addr) = Collector::start().await;
    let mut app = spawn_app_with(|c| {
        c.telemetry.otlp_endpoint = Some(format!("http://{addr}"));
        c.telemetry.otel_service_name = "authd-under-test".into();
    })
    .await;
    app.register("erin", "correct horse").await.unwrap();
    // A probe, before the login: not traced (it brings no traceparent).
    app.health_status("").await;
    app.client
        .login(login_with_traceparent("erin", "correct horse"))
        .await
        .unwrap();

    let is_child = |s: &Span, parent: &Span| s.parent_span_id == parent.span_id;
    let spans = collector
        .wait_for(&TRACE_ID, |spans| {
            let Some(server) = spans.iter().find(|s| s.kind == SpanKind::Server as i32) else {
                return false;
            };
            ["hash.queue_wait", "hash", "find_user", "token.sign"]
                .iter()
                .all(|name| spans.iter().any(|s| s.name == *name && is_child(s, server)))
        })
        .await;
    let server = spans
        .iter()
        .find(|s| s.kind == SpanKind::Server as i32)
        .unwrap();
    // The server span continues the caller's trace, under the caller's span.
    assert_eq!(server.name, "auth.v1.AuthService/Login");
    assert_eq!(server.parent_span_id, CALLER_SPAN);
    let text = |key| attribute(server, key).and_then(|v| string(&v));
    assert_eq!(text("rpc.system").as_deref(), Some("grpc"));
    assert_eq!(text("rpc.service").as_deref(), Some("auth.v1.AuthService"));
    assert_eq!(text("rpc.method").as_deref(), Some("Login"));
    assert_eq!(
        attribute(server, "rpc.grpc.status_code"),
        Some(any_value::Value::IntValue(0))
    );
    // The store span names its backend; the waits and work lie within the request.
    let store = spans.iter().find(|s| s.name == "find_user").unwrap();
    assert_eq!(
        attribute(store, "db.system")
            .and_then(|v| string(&v))
            .as_deref(),
        Some("sqlite")
    );
    let queue = spans.iter().find(|s| s.name == "hash.queue_wait").unwrap();
    let hash = spans.iter().find(|s| s.name == "hash").unwrap();
    for child in [store, queue, hash] {
        assert!(
            server.start_time_unix_nano <= child.start_time_unix_nano
                && child.start_time_unix_nano <= child.end_time_unix_nano
                && child.end_time_unix_nano <= server.end_time_unix_nano,
            "{} lies within the request",
            child.name
        );
    }
    assert!(queue.end_time_unix_nano <= hash.start_time_unix_nano + 1_000_000);
    // The resource names the service; the registration, with no traceparent, is a
    // trace of its own.
    let all = collector.spans.lock().unwrap().clone();
    assert!(all.iter().all(|(service, _)| service == "authd-under-test"));
    assert!(
        all.iter()
            .any(|(_, s)| s.name == "auth.v1.AuthService/Register"
                && s.trace_id != TRACE_ID
                && s.parent_span_id.is_empty())
    );
    assert!(
        all.iter().all(|(_, s)| !s.name.starts_with("grpc.health")),
        "health checks are traced only when the caller traces them"
    );
    let m = app.handle.render_metrics();
    assert!(m.contains("authd_trace_spans_dropped_total 0"), "{m}");
    app.stop().await.unwrap();
}

use crate::helpers::metric_of as metric;

#[tokio::test]
async fn with_the_collector_down_tracing_pauses_and_resumes_once_it_is_back() {
    // A port nothing listens on (yet): the collector starts there later.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let mut app = spawn_app_with(|c| {
        c.telemetry.otlp_endpoint = Some(format!("http://{port}"));
        c.telemetry.trace_queue = 4;
    })
    .await;
    app.register("frank", "correct horse").await.unwrap();
    // The first export fails: its spans are given up and counted, and tracing
    // pauses; the logins that follow succeed without being traced at all.
    let (client, handle) = (app.client.clone(), app.handle.clone());
    // Logs in with a trace context until `done` holds of the app's metrics.
    let login_until = async |what: &str, done: &dyn Fn(&str) -> bool| {
        crate::helpers::wait_for(what, || {
            let (mut client, handle) = (client.clone(), handle.clone());
            async move {
                let login = login_with_traceparent("frank", "correct horse");
                client.login(login).await.unwrap();
                done(&handle.render_metrics()).then_some(())
            }
        })
        .await
    };
    login_until("a login goes untraced", &|text| {
        metric(text, "authd_trace_requests_untraced_total") >= 1.0
    })
    .await;
    let text = app.handle.render_metrics();
    // A server span and its children, at least.
    assert!(
        metric(&text, "authd_trace_spans_dropped_total") >= 2.0,
        "{text}"
    );
    assert_eq!(metric(&text, "authd_trace_spans_exported_total"), 0.0);

    // The collector comes back: after a pause of at most 10 s a probe reaches it,
    // and the logins are traced again.
    let (collector, _) = Collector::start_on(port).await;
    login_until("the logins are traced again", &|text| {
        let received = (collector.spans.lock().unwrap().iter())
            .any(|(_, s)| s.trace_id == TRACE_ID && s.kind == SpanKind::Server as i32);
        received && metric(text, "authd_trace_export_paused") == 0.0
    })
    .await;
    assert!(
        metric(
            &app.handle.render_metrics(),
            "authd_trace_spans_exported_total"
        ) >= 1.0
    );
    app.stop().await.unwrap();
}

/// A collector that accepts connections and requests but never answers.
struct Hung;

#[tonic::async_trait]
impl TraceService for Hung {
    async fn export(
        &self,
        _request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_collector_that_never_answers_fills_the_queue_and_pauses_tracing() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Hung))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let mut app = spawn_app_with(|c| {
        c.telemetry.otlp_endpoint = Some(format!("http://{addr}"));
        c.telemetry.trace_queue = 4;
    })
    .await;
    app.register("heidi", "correct horse").await.unwrap();
    // The first export hangs (until its 10 s timeout); the spans after it fill the
    // queue of 4, and tracing pauses: the logins go on, untraced, without waiting.
    let mut text = String::new();
    for _ in 0..50 {
        app.client
            .login(login_with_traceparent("heidi", "correct horse"))
            .await
            .unwrap();
        text = app.handle.render_metrics();
        if metric(&text, "authd_trace_requests_untraced_total") >= 1.0 {
            break;
        }
    }
    assert!(
        metric(&text, "authd_trace_requests_untraced_total") >= 1.0,
        "{text}"
    );
    assert_eq!(metric(&text, "authd_trace_export_paused"), 1.0, "{text}");
    assert!(
        metric(&text, "authd_trace_spans_dropped_total") >= 1.0,
        "{text}"
    );
    app.stop().await.unwrap();
}

#[tokio::test]
async fn request_log_lines_carry_the_trace_id() {
    let (_collector, addr) = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let running = spawn_authd(
        dir.path(),
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))],
    );
    let mut client = running.client().await;
    register(&mut client, "grace", "correct horse")
        .await
        .unwrap();
    client
        .login(login_with_traceparent("grace", "correct horse"))
        .await
        .unwrap();
    login(&mut client, "grace", "correct horse").await.unwrap();
    let (status, log) = running.terminate().await;
    assert!(status.success());
    let logins: Vec<serde_json::Value> = log
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["message"] == "request" && e["method"] == "Login")
        .collect();
    assert_eq!(logins.len(), 2, "{log:?}");
    // The caller's trace, and a trace of its own for the login that brought none.
    assert_eq!(logins[0]["trace_id"], hex::encode(TRACE_ID));
    let own = logins[1]["trace_id"].as_str().expect("a trace id");
    assert_eq!(own.len(), 32);
    assert_ne!(own, hex::encode(TRACE_ID));
}

#[tokio::test]
async fn log_lines_never_name_a_trace_the_sampler_left_out() {
    let (collector, addr) = Collector::start().await;
    let dir = tempfile::tempdir().unwrap();
    let running = spawn_authd(
        dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
            ("OTEL_TRACES_SAMPLER", "always_off".into()),
        ],
    );
    let mut client = running.client().await;
    register(&mut client, "ivan", "correct horse")
        .await
        .unwrap();
    client
        .login(login_with_traceparent("ivan", "correct horse"))
        .await
        .unwrap();
    let (status, log) = running.terminate().await;
    assert!(status.success());
    let lines: Vec<serde_json::Value> = log
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["message"] == "request")
        .collect();
    let of = |method: &str| {
        lines
            .iter()
            .find(|e| e["method"] == method)
            .unwrap_or_else(|| panic!("no {method} line in {log:?}"))
    };
    // Nothing recorded, so no id of authd's own; the caller's trace is still named.
    assert!(of("Register").get("trace_id").is_none(), "{log:?}");
    assert_eq!(of("Login")["trace_id"], hex::encode(TRACE_ID));
    assert!(collector.spans.lock().unwrap().is_empty());
}
