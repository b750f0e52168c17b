//! Serving connections: the accept loop, and what bounds each connection.
//!
//! authd serves its listeners (gRPC, health, metrics) with hyper directly rather than
//! with tonic's `serve_with_incoming`, which retries a failing `accept` at once (a full
//! file-descriptor table makes it spin at a full core) and has no handshake or idle
//! timeout. Here:
//! - at most `max_connections` are open, and at most `max_connections_per_client` from
//!   one address; beyond either, a new connection is closed at once, so a client (or a
//!   balancer) tries elsewhere instead of waiting in the kernel's backlog;
//! - an `accept` that fails for want of resources (EMFILE, ENFILE, ENOBUFS, ENOMEM)
//!   backs off, doubling from 1 ms up to 1 s, instead of spinning;
//! - the gRPC and admin ports speak HTTP/2 and HTTP/1.1 on one listener (told apart
//!   by the HTTP/2 preface; under TLS ALPN offers `h2`, then `http/1.1`), the health
//!   port HTTP/2 only, the metrics and forward-auth ports HTTP/1.1 only;
//! - a connection must send its first bytes (the HTTP/2 preface, or an HTTP/1 request)
//!   within the handshake timeout, and HTTP/1 request headers must be complete by then;
//!   with TLS ([`tls`]), the TLS handshake and then the preface within that one timeout,
//!   on a connection that already holds its place under the caps;
//! - HTTP/2: a bounded number of concurrent streams per connection, keepalive pings
//!   (a peer that stops answering them is closed), and a bound on the stream resets a
//!   peer may provoke before the connection is closed;
//! - a connection with no open request for the idle timeout is closed gracefully
//!   (GOAWAY for HTTP/2);
//! - on shutdown the listening socket closes at once and every connection closes
//!   gracefully: requests in flight finish, new ones go elsewhere.
//!
//! Each request carries tonic's `TcpConnectInfo` in its extensions, as under tonic's
//! own server, under mutual TLS the client's `rpc::ClientIdentity`, and the
//! `rpc::Client` it is counted for: the connection's peer, or, when the connection's
//! caller is one of the `rpc::TrustedCallers` (decided once per connection), the end
//! user its `x-forwarded-for` names. This module knows nothing of gRPC or of what
//! the services do.
//!
//! The accept loop and the caps are here; one connection (its handshake, HTTP
//! settings, idle timeout and graceful close) is `connection`'s; the reading of its
//! first bytes and how its answers are written `io`'s; TLS and its live reload
//! [`tls`]'s.

mod connection;
mod io;
pub(crate) mod tls;

use prometheus::IntCounter;
use std::{
    collections::HashMap,
    convert::Infallible,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    task::JoinSet,
};

use crate::{metrics::ListenerMetrics, rpc::TrustedCallers};
use tokio_util::sync::CancellationToken;

/// The boxed error of a response body.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What the connections of one listener may do.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Connections open at once.
    pub max_connections: usize,
    /// Connections open at once from one IP address.
    pub max_connections_per_client: usize,
    /// From accepting a connection to its first bytes (HTTP/2 preface) or, for
    /// HTTP/1, to the end of a request's headers.
    pub handshake_timeout: Duration,
    /// A connection with no open request for this long is closed.
    pub idle_timeout: Duration,
    /// HTTP/2 keepalive: how often to ping, and how long to wait for the answer.
    pub keepalive_interval: Option<Duration>,
    pub keepalive_timeout: Duration,
    /// HTTP/2 streams open at once on one connection.
    pub max_concurrent_streams: u32,
}

impl Limits {
    /// Limits for a listener only operators and probes use (health, metrics): a
    /// small connection cap, the timeouts of the main listener.
    pub(crate) fn auxiliary(main: &Limits) -> Limits {
        Limits {
            max_connections: AUXILIARY_MAX_CONNECTIONS,
            max_connections_per_client: AUXILIARY_MAX_CONNECTIONS,
            max_concurrent_streams: main.max_concurrent_streams.min(16),
            ..main.clone()
        }
    }
}

/// Connections the health and metrics listeners accept at once.
pub(crate) const AUXILIARY_MAX_CONNECTIONS: usize = 128;

/// The HTTP version a listener speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Protocol {
    /// gRPC only: HTTP/2 with prior knowledge (no upgrade, no HTTP/1).
    Http2,
    /// HTTP/2 with prior knowledge (or by ALPN under TLS) and HTTP/1.1 on one
    /// listener, told apart by the first bytes (the HTTP/2 preface): the gRPC and
    /// admin ports, whose browser and JSON clients may speak either.
    Auto,
    /// Plain HTTP/1.1 (the metrics endpoint).
    Http1,
}

/// The longest and shortest pause after a failed `accept`.
const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(1);
const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The pauses of an accept loop that keeps failing for want of resources: the
/// first [`ACCEPT_BACKOFF_MIN`], each next one twice the last, up to
/// [`ACCEPT_BACKOFF_MAX`]; an accepted connection starts it over. A loop that
/// fails for as long as descriptors stay out tries about once a second, never
/// spins.
#[derive(Debug)]
struct AcceptBackoff {
    next: Duration,
}

impl AcceptBackoff {
    fn new() -> Self {
        Self {
            next: ACCEPT_BACKOFF_MIN,
        }
    }

    /// The pause after one more failure.
    fn failed(&mut self) -> Duration {
        let pause = self.next;
        self.next = (pause * 2).min(ACCEPT_BACKOFF_MAX);
        pause
    }

    /// A connection was accepted: the next failure pauses the least again.
    fn accepted(&mut self) {
        self.next = ACCEPT_BACKOFF_MIN;
    }
}

/// What a listener serves: an HTTP service that never fails (tonic's router with
/// its layers, or the plain-HTTP router), cloned for each connection.
pub(crate) trait HttpService<B>:
    tower::Service<
        http::Request<hyper::body::Incoming>,
        Response = http::Response<B>,
        Error = Infallible,
        Future: Send + 'static,
    > + Clone
    + Send
    + 'static
{
}

impl<S, B> HttpService<B> for S where
    S: tower::Service<
            http::Request<hyper::body::Incoming>,
            Response = http::Response<B>,
            Error = Infallible,
            Future: Send + 'static,
        > + Clone
        + Send
        + 'static
{
}

/// A response body a connection can send.
pub(crate) trait ResponseBody:
    http_body::Body<Data = bytes::Bytes, Error: Into<BoxError>> + Send + 'static
{
}

impl<B> ResponseBody for B where
    B: http_body::Body<Data = bytes::Bytes, Error: Into<BoxError>> + Send + 'static
{
}

/// A bound listener and how it serves: the HTTP version it speaks, its TLS, the
/// bounds of its connections and who may name the client of their requests.
pub(crate) struct Listener {
    /// Its name in logs and in the metrics' `listener` label.
    pub name: &'static str,
    pub socket: TcpListener,
    pub protocol: Protocol,
    /// With TLS, every connection speaks TLS (HTTP/2 only).
    pub tls: Option<Arc<tls::ServerTls>>,
    pub limits: Limits,
    /// Callers that may name the client of their requests in `x-forwarded-for`.
    pub callers: Arc<TrustedCallers>,
    pub metrics: ListenerMetrics,
}

/// What every connection of one listener shares.
pub(super) struct Shared {
    local: Option<SocketAddr>,
    protocol: Protocol,
    tls: Option<Arc<tls::ServerTls>>,
    limits: Limits,
    callers: Arc<TrustedCallers>,
    metrics: ListenerMetrics,
    shutdown: CancellationToken,
}

impl Listener {
    /// Serves `service` on every connection the socket accepts, within the limits,
    /// until `shutdown` is cancelled; then stops accepting and waits for the
    /// connections to close gracefully. Dropping the returned future closes them all
    /// at once.
    pub(crate) async fn serve<S, B>(self, service: S, shutdown: CancellationToken)
    where
        S: HttpService<B>,
        B: ResponseBody,
    {
        let Self {
            name,
            socket: listener,
            protocol,
            tls,
            limits,
            callers,
            metrics,
        } = self;
        let shared = Arc::new(Shared {
            local: listener.local_addr().ok(),
            protocol,
            tls,
            limits,
            callers,
            metrics,
            shutdown,
        });
        accept(name, listener, service, shared).await
    }
}

/// The accept loop of one listener, then its graceful close.
async fn accept<S, B>(name: &'static str, listener: TcpListener, service: S, shared: Arc<Shared>)
where
    S: HttpService<B>,
    B: ResponseBody,
{
    let (limits, metrics, shutdown) = (&shared.limits, &shared.metrics, &shared.shutdown);
    metrics.max_connections.set(limits.max_connections as i64);
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let clients = Arc::new(Clients::default());
    let mut connections = JoinSet::new();
    let mut backoff = AcceptBackoff::new();
    let mut failing = false;
    loop {
        let accepted = tokio::select! {
            biased;
            () = shutdown.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => {
                if std::mem::take(&mut failing) {
                    tracing::info!(listener = name, "accepting connections again");
                }
                backoff.accepted();
                accepted
            }
            // The peer gave up between its SYN and our accept: nothing to wait for.
            Err(e) if is_per_connection(&e) => continue,
            Err(e) => {
                metrics.accept_errors.inc();
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(
                        listener = name,
                        error = %e,
                        "cannot accept connections (out of file descriptors?); backing off"
                    );
                }
                tokio::select! {
                    () = shutdown.cancelled() => break,
                    () = tokio::time::sleep(backoff.failed()) => {}
                }
                continue;
            }
        };
        let Some(slot) = admit(&permits, &clients, limits, peer.ip(), &metrics.refused) else {
            // Dropping the stream closes it: the client learns at once.
            drop(stream);
            continue;
        };
        connections.spawn(connection::serve(
            stream,
            peer,
            slot,
            service.clone(),
            shared.clone(),
        ));
    }
    // Closes the listening socket: new clients are refused by the kernel at once.
    drop(listener);
    // Connections close gracefully on their own; one that does not (a stream that
    // never ends, such as a health Watch) is closed when the grace has passed.
    let drained = async { while connections.join_next().await.is_some() {} };
    if tokio::time::timeout(CLOSE_GRACE, drained).await.is_err() {
        tracing::debug!(
            listener = name,
            open = connections.len(),
            "closing the connections still open"
        );
    }
}

/// How long connections may take to close gracefully after a shutdown.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// Errors of `accept` that concern one connection only, not the listener.
fn is_per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionReset | ConnectionRefused | Interrupted | WouldBlock
    )
}

/// Open connections per client address; an entry lives while its count is above 0,
/// so the map holds at most `max_connections` entries.
#[derive(Default)]
struct Clients {
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// A connection's place: its permit under the global cap and its count for its client.
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    clients: Arc<Clients>,
    ip: IpAddr,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.clients.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

fn admit(
    permits: &Arc<Semaphore>,
    clients: &Arc<Clients>,
    limits: &Limits,
    ip: IpAddr,
    refused: &IntCounter,
) -> Option<Slot> {
    let Ok(permit) = permits.clone().try_acquire_owned() else {
        refused.inc();
        tracing::debug!(peer = %ip, "connection refused: too many connections");
        return None;
    };
    let ip = ip.to_canonical();
    let mut open = clients.open.lock().unwrap_or_else(|p| p.into_inner());
    let count = open.entry(ip).or_insert(0);
    if *count >= limits.max_connections_per_client.max(1) {
        drop(open);
        refused.inc();
        tracing::debug!(peer = %ip, "connection refused: too many connections from this client");
        return None;
    }
    *count += 1;
    drop(open);
    Some(Slot {
        _permit: permit,
        clients: clients.clone(),
        ip,
    })
}

/// Binds a listener for `what`, with an error naming the address and the setting.
pub(crate) async fn bind(addr: SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for {what} on {addr}: {e}"))
}

/// Sets TCP_NODELAY: gRPC answers are small and must not wait for Nagle.
fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
}

/// Raises this process's open-file limit to its hard limit (the usual soft limit,
/// 1024, is far below what a server with thousands of connections needs), and
/// returns the limit in force. `None` where it cannot be read.
pub(crate) fn raise_fd_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        use rustix::process::{Resource, getrlimit, setrlimit};
        let mut limit = getrlimit(Resource::Nofile);
        if let (Some(current), Some(hard)) = (limit.current, limit.maximum)
            && current < hard
        {
            limit.current = Some(hard);
            if setrlimit(Resource::Nofile, limit).is_err() {
                limit.current = Some(current);
            }
        }
        limit.current
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counted, not timed: the failures a loop following the back-off makes while
    /// descriptors stay out for a given time.
    fn failures_within(out_for: Duration) -> u32 {
        let (mut backoff, mut waited, mut failures) = (AcceptBackoff::new(), Duration::ZERO, 0);
        while waited < out_for {
            failures += 1;
            waited += backoff.failed();
        }
        failures
    }

    #[test]
    fn a_failing_accept_backs_off_doubling_to_a_second_and_starts_over_once_it_accepts() {
        let mut backoff = AcceptBackoff::new();
        let pauses: Vec<u128> = (0..13).map(|_| backoff.failed().as_millis()).collect();
        assert_eq!(
            pauses,
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 1000, 1000]
        );
        backoff.accepted();
        assert_eq!(backoff.failed(), ACCEPT_BACKOFF_MIN);
        // Out of descriptors for 2 s: 11 tries, not millions; for a minute, about
        // one a second once the pauses reach their longest.
        assert_eq!(failures_within(Duration::from_secs(2)), 11);
        assert_eq!(failures_within(Duration::from_secs(60)), 69);
    }

    #[test]
    fn per_client_counts_free_their_entry() {
        let permits = Arc::new(Semaphore::new(10));
        let clients = Arc::new(Clients::default());
        let limits = Limits {
            max_connections: 10,
            max_connections_per_client: 2,
            handshake_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            keepalive_interval: None,
            keepalive_timeout: Duration::from_secs(1),
            max_concurrent_streams: 10,
        };
        let refused = IntCounter::new("r", "r").unwrap();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.1".parse().unwrap();
        let first = admit(&permits, &clients, &limits, a, &refused).unwrap();
        let second = admit(&permits, &clients, &limits, mapped, &refused).unwrap();
        // The IPv4-mapped form is the same client.
        assert!(admit(&permits, &clients, &limits, a, &refused).is_none());
        assert_eq!(refused.get(), 1);
        let other = admit(
            &permits,
            &clients,
            &limits,
            "10.0.0.2".parse().unwrap(),
            &refused,
        );
        assert!(other.is_some());
        drop((first, second, other));
        assert!(clients.open.lock().unwrap().is_empty());
        assert_eq!(permits.available_permits(), 10);
    }
}
