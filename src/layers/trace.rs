//! The outermost tower layer: every request gets an id, is counted, timed and
//! logged once, when it ends.
//!
//! - The request id is the client's `x-request-id` metadata when it is a sane
//!   value (1 to 128 visible ASCII characters), otherwise a new UUIDv7. It is put in
//!   the request's extensions ([`RequestId`], for the handlers' own logs) and sent
//!   back in the response's `x-request-id`, which HPACK sends unindexed like the
//!   other values that differ in every answer (see `never_indexed`).
//! - The event carries the method, the protocol the request arrived in (`grpc`,
//!   `grpc-web` or `json`: `rpc::Protocol`, which also labels the metrics), the peer, the gRPC code, the latency, the request
//!   id, under mutual TLS the client certificate's identity (`client`), the end user
//!   a trusted caller forwarded when it is not the peer (`forwarded_for`, the client
//!   every per-client bound counts) and, when a handler put a [`UserId`] in the
//!   response, the user. Never a
//!   request or response body: passwords and tokens cannot reach the log from here.
//!   Health and reflection are logged at debug level only (probes every few seconds
//!   would bury everything else) but counted like the rest.
//! - The code is the response's `grpc-status` header when there is one (an error is
//!   answered trailers-only, so its status is in the headers), else OK: a unary
//!   success sends its status in the trailers, after the message this layer has
//!   already seen produced. A request whose future is dropped (the client went away
//!   or the connection closed) ends as CANCELLED.
//!
//! It sits outside the rate limit and admission layers, so their refusals are
//! counted and logged too: the refusals (RESOURCE_EXHAUSTED) within the budget of
//! [`RefusalLog`], the rest summarised once a second. Every line's target is
//! `authd::trace`, whatever the module's path, as the docs name it for filters. It must stay cheap: the label handles are resolved once
//! (see `metrics::GrpcMetrics`), and nothing here allocates for a request that
//! comes with its own id.

use super::refusal_log::RefusalLog;
use crate::{
    metrics::{CODE_NAMES, Metrics},
    middleware::{BoxFuture, Middleware, MiddlewareLayer, Request, Response},
    otel::{self, Traces},
    rpc::{
        self, AuthzDecision, ClientIdentity, Protocol, REQUEST_ID_HEADER, RequestId, Rpc, UserId,
    },
};
use http::HeaderValue;
use opentelemetry::{
    Context,
    context::{FutureExt as _, WithContext},
};
use std::{
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::Arc,
    task::Poll,
    time::Instant,
};
use tonic::transport::server::TcpConnectInfo;
use tower::Service;

/// Unknown paths are logged with at most this much of the path.
const MAX_LOGGED_PATH: usize = 128;

const CODE_OK: usize = 0;
const CODE_CANCELLED: usize = 1;
const CODE_UNKNOWN: usize = 2;
const CODE_RESOURCE_EXHAUSTED: usize = 8;

/// The outermost layer's policy: id, count, time and log every request.
pub struct Trace {
    metrics: Arc<Metrics>,
    traces: Option<Arc<Traces>>,
    refusals: Arc<RefusalLog>,
}

/// The trace layer; with `traces`, every request also gets a server span. Its
/// refusals' lines count against `refusals`, which every port shares.
pub(crate) fn layer(
    metrics: Arc<Metrics>,
    traces: Option<Arc<Traces>>,
    refusals: Arc<RefusalLog>,
) -> MiddlewareLayer<Trace> {
    MiddlewareLayer::new(Arc::new(Trace {
        metrics,
        traces,
        refusals,
    }))
}

impl Middleware for Trace {
    fn call<S>(
        self: Arc<Self>,
        mut inner: S,
        mut req: Request,
    ) -> BoxFuture<Result<Response, S::Error>>
    where
        S: Service<Request, Response = Response> + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Send + 'static,
    {
        // Real time: the request's latency, for logs and metrics.
        let started = Instant::now();
        let path = req.uri().path();
        let rpc = Rpc::of_path(path);
        let protocol = Protocol::of(req.extensions());
        let unknown_path = (rpc == Rpc::Unknown).then(|| truncated(path).to_owned());
        let request_id = RequestId::of(req.headers()).0;
        let peer = req
            .extensions()
            .get::<TcpConnectInfo>()
            .and_then(|info| info.remote_addr());
        let client = rpc::client_identity(req.extensions()).cloned();
        let forwarded_for = rpc::client_ip(req.extensions())
            .filter(|ip| peer.is_none_or(|peer| peer.ip().to_canonical() != *ip));
        req.extensions_mut().insert(RequestId(request_id.clone()));
        // Health and reflection only when a caller traces them: probes every few
        // seconds would bury the traces of real requests.
        let span = (self.traces.as_ref())
            .filter(|_| !rpc.is_exempt() || req.headers().contains_key("traceparent"))
            .and_then(|traces| traces.server_span(req.headers(), rpc.service(), rpc.method()));
        let trace_id = match &span {
            // A trace sampled out here is still the caller's, when it sent one.
            Some(cx) => otel::trace_id(cx).or_else(|| otel::caller_trace_id(req.headers())),
            None => otel::caller_trace_id(req.headers()),
        };
        let mut pending =
            Pending::start(&self, rpc, request_id, peer, client, unknown_path, started);
        pending.trace_id = trace_id;
        pending.forwarded_for = forwarded_for;
        pending.protocol = protocol;
        let response = match &span {
            // The layers below and the handler run inside the span's context.
            Some(cx) => {
                let _current = cx.clone().attach();
                InContext::Traced {
                    future: inner.call(req).with_context(cx.clone()),
                }
            }
            None => InContext::Plain {
                future: inner.call(req),
            },
        };
        pending.span = span;
        Box::pin(async move {
            match response.await {
                Ok(mut response) => {
                    let code = grpc_code(response.headers());
                    let user = response.extensions_mut().remove::<UserId>();
                    pending.decision = response.extensions_mut().remove::<AuthzDecision>();
                    let id = pending.request_id.clone();
                    response.headers_mut().insert(REQUEST_ID_HEADER, id);
                    never_indexed(response.headers_mut());
                    pending.finish(code, user.as_ref());
                    Ok(response)
                }
                Err(err) => {
                    // The server could not produce a response at all.
                    pending.finish(CODE_UNKNOWN, None);
                    Err(err)
                }
            }
        })
    }
}

pin_project_lite::pin_project! {
    /// The inner future, run inside the server span's context when traced (and
    /// untouched, at no cost, when not).
    #[project = InContextProjection]
    enum InContext<F> {
        Traced { #[pin] future: WithContext<F> },
        Plain { #[pin] future: F },
    }
}

impl<F: Future> Future for InContext<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<F::Output> {
        match self.project() {
            InContextProjection::Traced { future } => future.poll(cx),
            InContextProjection::Plain { future } => future.poll(cx),
        }
    }
}

/// A request not yet finished. Finishing it records and logs it; dropping it
/// unfinished (the response future was dropped) records it as CANCELLED.
struct Pending {
    metrics: Arc<Metrics>,
    refusals: Arc<RefusalLog>,
    rpc: Rpc,
    /// The protocol it arrived in (gRPC, or translated from gRPC-Web or JSON).
    protocol: Protocol,
    request_id: HeaderValue,
    peer: Option<SocketAddr>,
    /// The client certificate's identity, under mutual TLS.
    client: Option<ClientIdentity>,
    /// The client a trusted caller named, when it is not the peer.
    forwarded_for: Option<IpAddr>,
    unknown_path: Option<String>,
    started: Instant,
    finished: bool,
    /// The server span's context, when traced.
    span: Option<Context>,
    /// Logged with the request: its trace, or the caller's.
    trace_id: Option<String>,
    /// What an external authorization check decided, logged with it.
    decision: Option<AuthzDecision>,
}

impl Pending {
    fn start(
        trace: &Trace,
        rpc: Rpc,
        request_id: HeaderValue,
        peer: Option<SocketAddr>,
        client: Option<ClientIdentity>,
        unknown_path: Option<String>,
        started: Instant,
    ) -> Self {
        trace.metrics.grpc.in_flight.inc();
        Self {
            metrics: trace.metrics.clone(),
            refusals: trace.refusals.clone(),
            rpc,
            protocol: Protocol::Grpc,
            request_id,
            peer,
            client,
            forwarded_for: None,
            unknown_path,
            started,
            finished: false,
            span: None,
            trace_id: None,
            decision: None,
        }
    }

    fn finish(&mut self, code: usize, user: Option<&UserId>) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let elapsed = self.started.elapsed();
        self.metrics.grpc.in_flight.dec();
        self.metrics
            .grpc
            .record(self.protocol, self.rpc, code, elapsed);
        if let Some(cx) = self.span.take() {
            otel::end_server_span(&cx, code, CODE_NAMES[code]);
        }
        // tokio's time: the budget's windows, driven by tests (start_paused).
        if code == CODE_RESOURCE_EXHAUSTED
            && !self.rpc.is_exempt()
            && !self.refusals.admits(self.rpc, tokio::time::Instant::now())
        {
            return;
        }

        let rpc = self.rpc;
        let protocol = self.protocol.label();
        let request_id = self.request_id.to_str().unwrap_or_default();
        let latency_ms = elapsed.as_secs_f64() * 1e3;
        let code = CODE_NAMES[code];
        let peer = self.peer.map(tracing::field::display);
        let user_id = user.map(|u| u.0.as_str());
        let client = self.client.as_ref().map(ClientIdentity::as_str);
        let forwarded_for = self.forwarded_for.map(tracing::field::display);
        let path = self.unknown_path.as_deref();
        let trace_id = self.trace_id.as_deref();
        let decision = self.decision.map(|d| d.outcome);
        let reason = self.decision.map(|d| d.reason);
        if rpc.is_exempt() {
            tracing::debug!(
                target: "authd::trace",
                request_id,
                service = rpc.service(),
                method = rpc.method(),
                protocol,
                peer,
                client,
                forwarded_for,
                code,
                latency_ms,
                trace_id,
                "request"
            );
        } else {
            tracing::info!(
                target: "authd::trace",
                request_id,
                service = rpc.service(),
                method = rpc.method(),
                protocol,
                path,
                peer,
                client,
                forwarded_for,
                code,
                latency_ms,
                user_id,
                decision,
                reason,
                trace_id,
                "request"
            );
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.finish(CODE_CANCELLED, None);
    }
}

/// Marks the response headers whose values differ from one response to the next
/// (the request id; an error's `grpc-status-details-bin`, whose RetryInfo counts
/// down in nanoseconds) to be sent as HPACK literals that are never indexed (RFC
/// 7541 section 6.2.3). Indexed, each would be added to the connection's dynamic
/// table, used never again and push out the entries that do repeat, so that every
/// answer would send `content-type`, `grpc-status` and the rest in full again, and
/// a storm of refusals would keep both ends rewriting their tables. Nothing here is
/// secret: the mark only keeps the values out of the tables.
fn never_indexed(headers: &mut http::HeaderMap) {
    for name in [REQUEST_ID_HEADER, "grpc-status-details-bin"] {
        if let Some(value) = headers.get_mut(name) {
            value.set_sensitive(true);
        }
    }
}

/// The status code of a response: `grpc-status` when present (trailers-only
/// errors), else OK (the status follows in the trailers).
fn grpc_code(headers: &http::HeaderMap) -> usize {
    match headers.get("grpc-status") {
        None => CODE_OK,
        Some(value) => std::str::from_utf8(value.as_bytes())
            .ok()
            .and_then(|s| s.parse::<usize>().ok())
            .filter(|code| *code < CODE_NAMES.len())
            .unwrap_or(CODE_UNKNOWN),
    }
}

/// At most [`MAX_LOGGED_PATH`] bytes of `path`, cut at a character boundary.
fn truncated(path: &str) -> &str {
    if path.len() <= MAX_LOGGED_PATH {
        return path;
    }
    let mut end = MAX_LOGGED_PATH;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    &path[..end]
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::{convert::Infallible, time::Duration};
    use tower::{Layer as _, ServiceExt as _};

    fn service(
        metrics: Arc<Metrics>,
        status: Option<&'static str>,
    ) -> impl Service<Request, Response = Response, Error = Infallible> + Clone {
        let inner = tower::service_fn(move |req: Request| async move {
            assert!(req.extensions().get::<RequestId>().is_some());
            let mut response = Response::new(tonic::body::Body::empty());
            if let Some(code) = status {
                response
                    .headers_mut()
                    .insert("grpc-status", HeaderValue::from_static(code));
            } else {
                response.extensions_mut().insert(UserId("u-1".into()));
            }
            Ok::<_, Infallible>(response)
        });
        layer(metrics, None, budget(100)).layer(inner)
    }

    fn budget(per_second: u32) -> Arc<RefusalLog> {
        Arc::new(RefusalLog::new(per_second))
    }

    fn request(path: &str, id: Option<&str>) -> Request {
        let mut builder = http::Request::builder().uri(path);
        if let Some(id) = id {
            builder = builder.header(REQUEST_ID_HEADER, id);
        }
        builder.body(tonic::body::Body::empty()).unwrap()
    }

    /// A writer into a shared buffer, for the log lines of one test.
    #[derive(Clone, Default)]
    pub(crate) struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);

    impl Captured {
        /// What was logged so far.
        pub(crate) fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    /// The log lines of this thread, as text without colours, until the guard drops.
    pub(crate) fn capture_logs() -> (Captured, tracing::subscriber::DefaultGuard) {
        // tracing caches, process-wide, whether each call site is wanted, and while at
        // most one subscriber exists it asks only the thread that reaches the site
        // first: a test on another thread, with none, would mark the request line
        // unwanted for this one too. With a global subscriber beside this test's own,
        // every thread's answer counts both.
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .finish();
        (captured, tracing::subscriber::set_default(subscriber))
    }

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[tokio::test]
    async fn the_request_line_names_an_authorization_decision() {
        let (captured, _guard) = capture_logs();
        let inner = tower::service_fn(|_req: Request| async {
            let mut response = Response::new(tonic::body::Body::empty());
            response.extensions_mut().insert(AuthzDecision {
                outcome: "deny",
                reason: "revoked",
            });
            Ok::<_, Infallible>(response)
        });
        let svc = layer(Arc::new(Metrics::new()), None, budget(100)).layer(inner);
        let path = "/envoy.service.auth.v3.Authorization/Check";
        let response = svc.oneshot(request(path, None)).await.unwrap();
        assert!(response.extensions().get::<AuthzDecision>().is_none());
        let text = captured.text();
        assert!(text.contains(r#"method="Check""#), "{text}");
        assert!(text.contains(r#"decision="deny""#), "{text}");
        assert!(text.contains(r#"reason="revoked""#), "{text}");
    }

    #[tokio::test]
    async fn the_request_line_names_a_forwarded_client_that_is_not_the_peer() {
        let (captured, _guard) = capture_logs();
        let svc = service(Arc::new(Metrics::new()), None);
        for (id, client) in [("named", "203.0.113.9"), ("itself", "10.0.0.1")] {
            let mut req = request("/auth.v1.AuthService/Login", Some(id));
            req.extensions_mut().insert(TcpConnectInfo {
                local_addr: None,
                remote_addr: Some("[::ffff:10.0.0.1]:5000".parse().unwrap()),
            });
            req.extensions_mut()
                .insert(rpc::Client(client.parse().unwrap()));
            svc.clone().oneshot(req).await.unwrap();
        }
        let text = captured.text();
        let line = |id: &str| {
            (text.lines())
                .find(|l| l.contains(&format!("request_id=\"{id}\"")))
                .unwrap_or_else(|| panic!("no line for {id}: {text}"))
                .to_owned()
        };
        assert!(
            line("named").contains("forwarded_for=203.0.113.9"),
            "{text}"
        );
        assert!(!line("itself").contains("forwarded_for"), "{text}");
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_past_the_budget_are_counted_but_not_logged_one_by_one() {
        let (captured, _guard) = capture_logs();
        let metrics = Arc::new(Metrics::new());
        let refusals = budget(2);
        let answering = |code: &'static str| {
            let inner = tower::service_fn(move |_req: Request| async move {
                let mut response = Response::new(tonic::body::Body::empty());
                (response.headers_mut()).insert("grpc-status", HeaderValue::from_static(code));
                Ok::<_, Infallible>(response)
            });
            layer(metrics.clone(), None, refusals.clone()).layer(inner)
        };
        for (code, n) in [("8", 5), ("16", 3), ("8", 1)] {
            for _ in 0..n {
                let req = request("/auth.v1.AuthService/Login", None);
                answering(code).oneshot(req).await.unwrap();
            }
        }
        let lines = |text: &str, code: &str| {
            (text.lines())
                .filter(|l| l.contains(" authd::trace: request ") && l.contains(code))
                .count()
        };
        let text = captured.text();
        // Two refusals of six logged; every other answer logged.
        assert_eq!(lines(&text, r#"code="RESOURCE_EXHAUSTED""#), 2, "{text}");
        assert_eq!(lines(&text, r#"code="UNAUTHENTICATED""#), 3, "{text}");
        let counted = metrics.render();
        assert!(counted.contains(
            r#"authd_grpc_requests_total{code="RESOURCE_EXHAUSTED",method="Login",protocol="grpc",service="auth.v1.AuthService"} 6"#
        ), "{counted}");
        // The next second logs what the last one left out.
        tokio::time::advance(Duration::from_secs(1)).await;
        answering("8")
            .oneshot(request("/auth.v1.AuthService/Login", None))
            .await
            .unwrap();
        let text = captured.text();
        assert!(
            text.contains(r#"refusals not logged one by one unlogged=4 methods="Login 4""#),
            "{text}"
        );
        assert_eq!(lines(&text, r#"code="RESOURCE_EXHAUSTED""#), 3, "{text}");
    }

    #[tokio::test]
    async fn the_request_id_is_kept_or_made() {
        let metrics = Arc::new(Metrics::new());
        let svc = service(metrics.clone(), None);
        let kept = svc
            .clone()
            .oneshot(request("/auth.v1.AuthService/Login", Some("abc-123")))
            .await
            .unwrap();
        assert_eq!(kept.headers()[REQUEST_ID_HEADER], "abc-123");
        for bad in [None, Some(""), Some("has space"), Some(&*"x".repeat(129))] {
            let made = svc
                .clone()
                .oneshot(request("/auth.v1.AuthService/Login", bad))
                .await
                .unwrap();
            let id = made.headers()[REQUEST_ID_HEADER].to_str().unwrap();
            let uuid = uuid::Uuid::parse_str(id).unwrap();
            assert_eq!(uuid.get_version_num(), 7, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn codes_come_from_grpc_status_and_every_request_is_counted() {
        let metrics = Arc::new(Metrics::new());
        service(metrics.clone(), Some("16"))
            .oneshot(request("/auth.v1.AuthService/Login", None))
            .await
            .unwrap();
        service(metrics.clone(), Some("garbage"))
            .oneshot(request("/auth.v1.AuthService/Login", None))
            .await
            .unwrap();
        service(metrics.clone(), None)
            .oneshot(request("/grpc.health.v1.Health/Check", None))
            .await
            .unwrap();
        service(metrics.clone(), None)
            .oneshot(request("/no.Such/Thing", None))
            .await
            .unwrap();
        let text = metrics.render();
        for line in [
            r#"authd_grpc_requests_total{code="UNAUTHENTICATED",method="Login",protocol="grpc",service="auth.v1.AuthService"} 1"#,
            r#"authd_grpc_requests_total{code="UNKNOWN",method="Login",protocol="grpc",service="auth.v1.AuthService"} 1"#,
            r#"authd_grpc_requests_total{code="OK",method="Check",protocol="grpc",service="grpc.health.v1.Health"} 1"#,
            r#"authd_grpc_requests_total{code="OK",method="unknown",protocol="grpc",service="unknown"} 1"#,
            "authd_grpc_requests_in_flight 0",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
    }

    #[tokio::test]
    async fn a_dropped_request_is_counted_as_cancelled() {
        let metrics = Arc::new(Metrics::new());
        let inner = tower::service_fn(|_req: Request| async {
            std::future::pending::<Result<Response, Infallible>>().await
        });
        let mut svc = layer(metrics.clone(), None, budget(100)).layer(inner);
        let future = svc.call(request("/auth.v1.AuthService/Register", None));
        assert!(metrics.render().contains("authd_grpc_requests_in_flight 1"));
        drop(future);
        let text = metrics.render();
        assert!(text.contains(
            r#"authd_grpc_requests_total{code="CANCELLED",method="Register",protocol="grpc",service="auth.v1.AuthService"} 1"#
        ), "{text}");
        assert!(text.contains("authd_grpc_requests_in_flight 0"));
    }
}
