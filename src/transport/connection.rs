//! One connection: its TLS handshake when the listener has TLS, the HTTP settings
//! that bound it, the requests open on it (for the idle timeout), and its graceful
//! close on idleness or shutdown.

use super::{
    BoxError, HttpService, Limits, Protocol, ResponseBody, Shared, Slot,
    io::{FirstBytes, HTTP2_PREFACE_LEN},
};
use crate::{
    metrics::ListenerMetrics,
    rpc::{Client, ClientIdentity, TrustedCallers},
};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use std::{
    convert::Infallible,
    future::Future,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{
        Arc,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
    time::Instant,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpConnectInfo;

/// Stream resets a peer may make the server send (malformed requests and the
/// like) before the connection is closed with GOAWAY: hyper's own default, which
/// tonic turns off.
const MAX_LOCAL_ERROR_RESETS: usize = 1024;
/// Streams a peer may open and reset before the server accepted them (the HTTP/2
/// "rapid reset" attack): h2's default.
const MAX_PENDING_ACCEPT_RESETS: usize = 20;
/// Largest header block accepted (names, values and HPACK overhead).
const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// Serves one accepted connection, holding its `_slot` under the caps until it closes.
pub(super) async fn serve<S, B>(
    stream: TcpStream,
    peer: SocketAddr,
    _slot: Slot,
    service: S,
    shared: Arc<Shared>,
) where
    S: HttpService<B>,
    B: ResponseBody,
{
    super::tune(&stream);
    let (limits, metrics) = (&shared.limits, &shared.metrics);
    metrics.open.inc();
    let _open = scopeguard(metrics.open.clone());
    let info = TcpConnectInfo {
        local_addr: shared.local,
        remote_addr: Some(peer),
    };
    let Some(tls) = shared.tls.clone() else {
        let within = limits.handshake_timeout;
        let caller = Caller::new(peer, None, &shared.callers);
        return serve_http(stream, within, info, caller, service, &shared).await;
    };
    // The TLS handshake, then the HTTP/2 preface, within one handshake timeout: a
    // client that connects and sends no ClientHello (or stalls in the middle) is
    // closed when it passes, as a plaintext one that sends no preface is.
    // Real time: a connection's I/O timeouts.
    let started = Instant::now();
    let handshake = tokio::select! {
        handshake = tokio::time::timeout(limits.handshake_timeout, tls.acceptor().accept(stream)) => handshake,
        () = shared.shutdown.cancelled() => return,
    };
    let stream = match handshake {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => {
            tls.handshake_failed();
            tracing::debug!(peer = %peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            metrics.handshake_timeouts.inc();
            tracing::debug!(peer = %peer, "TLS handshake timed out");
            return;
        }
    };
    let identity = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|chain| chain.first())
        .and_then(|cert| super::tls::identity(cert));
    let within = limits.handshake_timeout.saturating_sub(started.elapsed());
    let caller = Caller::new(peer, identity, &shared.callers);
    serve_http(stream, within, info, caller, service, &shared).await;
}

/// Who is at the other end of a connection: its client certificate's identity,
/// and whether it may name the client of its requests.
#[derive(Clone)]
struct Caller {
    identity: Option<ClientIdentity>,
    /// The connection's peer (canonical): the client of its requests, unless
    /// `trusted` says otherwise.
    peer: IpAddr,
    /// The trusted callers, when this connection's caller is one of them.
    trusted: Option<Arc<TrustedCallers>>,
}

impl Caller {
    fn new(
        peer: SocketAddr,
        identity: Option<ClientIdentity>,
        callers: &Arc<TrustedCallers>,
    ) -> Self {
        let peer = peer.ip().to_canonical();
        let trusted = callers
            .trusts(peer, identity.as_ref())
            .then(|| callers.clone());
        Self {
            identity,
            peer,
            trusted,
        }
    }

    /// The client of a request on this connection.
    fn client(&self, headers: &http::HeaderMap) -> Client {
        Client(match &self.trusted {
            Some(callers) => callers.forwarded_client(headers, self.peer),
            None => self.peer,
        })
    }
}

/// Serves HTTP on an established byte stream (plain TCP, or TLS once its handshake
/// is done), whose first bytes must arrive `within`.
async fn serve_http<IO, S, B>(
    stream: IO,
    within: Duration,
    info: TcpConnectInfo,
    caller: Caller,
    service: S,
    shared: &Shared,
) where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: HttpService<B>,
    B: ResponseBody,
{
    let (protocol, limits, metrics) = (shared.protocol, &shared.limits, &shared.metrics);
    let peer = info.remote_addr;
    let activity = Arc::new(Activity::new());
    // An HTTP/1.1 request with its Host header is longer than the HTTP/2 preface.
    let needed = match protocol {
        Protocol::Http2 | Protocol::Auto => HTTP2_PREFACE_LEN,
        Protocol::Http1 => 1,
    };
    let io = TokioIo::new(FirstBytes::new(
        stream,
        needed,
        within,
        metrics.handshake_timeouts.clone(),
    ));
    let service = TowerToHyperService::new(Tracked {
        inner: service,
        info,
        caller,
        activity: activity.clone(),
    });
    let closed = match protocol {
        Protocol::Http2 => {
            let mut builder = hyper::server::conn::http2::Builder::new(TokioExecutor::new());
            http2_settings(&mut builder, limits);
            let connection = builder.serve_connection(io, service);
            drive(connection, &activity, limits, &shared.shutdown, metrics).await
        }
        Protocol::Http1 => {
            let mut builder = hyper::server::conn::http1::Builder::new();
            http1_settings(&mut builder, limits);
            let connection = builder.serve_connection(io, service);
            drive(connection, &activity, limits, &shared.shutdown, metrics).await
        }
        Protocol::Auto => {
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            http2_settings(&mut builder.http2(), limits);
            http1_settings(&mut builder.http1(), limits);
            let connection = builder.serve_connection(io, service);
            drive(connection, &activity, limits, &shared.shutdown, metrics).await
        }
    };
    if let Err(e) = closed {
        tracing::debug!(peer = ?peer, error = %e, "connection closed with an error");
    }
}

/// The HTTP/2 settings of every listener that speaks it.
fn http2_settings<B: Http2Settings>(builder: &mut B, limits: &Limits) {
    builder.apply(limits);
}

/// The HTTP/1.1 settings of every listener that speaks it: its request headers
/// within the handshake timeout, a bounded read buffer, keep-alive.
fn http1_settings<B: Http1Settings>(builder: &mut B, limits: &Limits) {
    builder.apply(limits);
}

/// hyper's HTTP/2 builder and hyper-util's (within its auto builder) take the same
/// settings through different types.
trait Http2Settings {
    fn apply(&mut self, limits: &Limits);
}

macro_rules! http2_settings {
    ($builder:ty) => {
        impl Http2Settings for $builder {
            fn apply(&mut self, limits: &Limits) {
                self.timer(TokioTimer::new())
                    .max_concurrent_streams(limits.max_concurrent_streams)
                    .keep_alive_interval(limits.keepalive_interval)
                    .keep_alive_timeout(limits.keepalive_timeout)
                    .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESETS)
                    .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESETS)
                    .max_header_list_size(MAX_HEADER_LIST_BYTES);
            }
        }
    };
}

http2_settings!(hyper::server::conn::http2::Builder<TokioExecutor>);
http2_settings!(hyper_util::server::conn::auto::Http2Builder<'_, TokioExecutor>);

trait Http1Settings {
    fn apply(&mut self, limits: &Limits);
}

macro_rules! http1_settings {
    ($builder:ty) => {
        impl Http1Settings for $builder {
            fn apply(&mut self, limits: &Limits) {
                self.timer(TokioTimer::new())
                    .header_read_timeout(limits.handshake_timeout)
                    .max_buf_size(64 * 1024)
                    .keep_alive(true);
            }
        }
    };
}

http1_settings!(hyper::server::conn::http1::Builder);
http1_settings!(hyper_util::server::conn::auto::Http1Builder<'_, TokioExecutor>);

/// A hyper connection that can be asked to close gracefully.
trait Graceful: Future {
    fn graceful_shutdown(self: Pin<&mut Self>);
}

impl<I, S, E, B> Graceful for hyper::server::conn::http2::Connection<I, S, E>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: http_body::Body + 'static,
    B::Error: Into<BoxError>,
    E: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http2::Connection::graceful_shutdown(self)
    }
}

impl<I, S, B> Graceful for hyper::server::conn::http1::Connection<I, S>
where
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<BoxError>,
    I: hyper::rt::Read + hyper::rt::Write + Unpin,
    B: http_body::Body + 'static,
    B::Error: Into<BoxError>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper::server::conn::http1::Connection::graceful_shutdown(self)
    }
}

impl<I, S, B> Graceful for hyper_util::server::conn::auto::Connection<'_, I, S, TokioExecutor>
where
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    S::Future: 'static,
    I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
    B: http_body::Body + 'static,
    B::Error: Into<BoxError>,
    TokioExecutor: hyper::rt::bounds::Http2ServerConnExec<S::Future, B>,
{
    fn graceful_shutdown(self: Pin<&mut Self>) {
        hyper_util::server::conn::auto::Connection::graceful_shutdown(self)
    }
}

/// Runs a connection until it ends, closing it gracefully once it has been idle
/// for the idle timeout or when the server shuts down.
async fn drive<C, E>(
    connection: C,
    activity: &Activity,
    limits: &Limits,
    shutdown: &CancellationToken,
    metrics: &ListenerMetrics,
) -> Result<(), BoxError>
where
    C: Graceful + Future<Output = Result<(), E>>,
    E: Into<BoxError>,
{
    let mut connection = std::pin::pin!(connection);
    let mut closing = false;
    loop {
        tokio::select! {
            result = connection.as_mut() => return result.map_err(Into::into),
            () = activity.idle_for(limits.idle_timeout), if !closing => {
                metrics.idle_closed.inc();
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            () = shutdown.cancelled(), if !closing => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
        }
    }
}

/// Requests open on a connection, and since when none has been.
struct Activity {
    origin: Instant,
    open: AtomicUsize,
    /// Milliseconds after `origin` when the last request ended.
    idle_since_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            // Real time: a connection's I/O timeouts.
            origin: Instant::now(),
            open: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
        }
    }

    fn begin(self: &Arc<Self>) -> OpenRequest {
        self.open.fetch_add(1, Ordering::SeqCst);
        OpenRequest {
            activity: self.clone(),
        }
    }

    /// Resolves once no request has been open for `idle`.
    async fn idle_for(&self, idle: Duration) {
        loop {
            if self.open.load(Ordering::SeqCst) == 0 {
                let since = Duration::from_millis(self.idle_since_ms.load(Ordering::SeqCst));
                let deadline = self.origin + since + idle;
                // Real time: a connection's I/O timeouts.
                if Instant::now() >= deadline {
                    // Check again: a request may have begun meanwhile.
                    if self.open.load(Ordering::SeqCst) == 0 {
                        return;
                    }
                    continue;
                }
                tokio::time::sleep_until(deadline).await;
            } else {
                tokio::time::sleep(idle).await;
            }
        }
    }
}

/// A request in progress, from its headers until its response body is done.
struct OpenRequest {
    activity: Arc<Activity>,
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        let now = self.activity.origin.elapsed().as_millis();
        self.activity
            .idle_since_ms
            .store(u64::try_from(now).unwrap_or(u64::MAX), Ordering::SeqCst);
        self.activity.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Decrements a gauge when dropped.
struct GaugeGuard(prometheus::IntGauge);

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        self.0.dec();
    }
}

fn scopeguard(gauge: prometheus::IntGauge) -> GaugeGuard {
    GaugeGuard(gauge)
}

/// Adds the connection's addresses (and its client's identity, under mutual TLS)
/// and the request's client to every request, and counts it open until its
/// response body has been sent (or dropped).
#[derive(Clone)]
struct Tracked<S> {
    inner: S,
    info: TcpConnectInfo,
    caller: Caller,
    activity: Arc<Activity>,
}

impl<S, B> tower::Service<http::Request<Incoming>> for Tracked<S>
where
    S: tower::Service<http::Request<Incoming>, Response = http::Response<B>, Error = Infallible>,
    S::Future: Send + 'static,
    B: http_body::Body,
{
    type Response = http::Response<TrackedBody<B>>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Incoming>) -> Self::Future {
        // hyper calls a fresh clone for each request (`oneshot`), so no swap is needed.
        let open = self.activity.begin();
        request.extensions_mut().insert(self.info.clone());
        if let Some(identity) = &self.caller.identity {
            request.extensions_mut().insert(identity.clone());
        }
        let client = self.caller.client(request.headers());
        request.extensions_mut().insert(client);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| TrackedBody {
                inner: body,
                _open: open,
            }))
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that keeps its request counted open until it is done.
    struct TrackedBody<B> {
        #[pin]
        inner: B,
        _open: OpenRequest,
    }
}

impl<B: http_body::Body> http_body::Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn idle_means_no_open_request_for_the_whole_timeout() {
        let activity = Arc::new(Activity::new());
        let idle = Duration::from_secs(10);
        tokio::time::sleep(Duration::from_secs(4)).await;
        let open = activity.begin();
        // Open for 20 s: never idle meanwhile.
        let waited = tokio::time::timeout(Duration::from_secs(20), activity.idle_for(idle)).await;
        assert!(waited.is_err());
        drop(open);
        // tokio's time: the runtime's timers, paused and driven by tests (start_paused).
        let started = tokio::time::Instant::now();
        activity.idle_for(idle).await;
        // Ten seconds after the request ended, not after the connection began.
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(9) && took <= Duration::from_secs(11),
            "{took:?}"
        );
    }
}
