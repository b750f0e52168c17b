//! Prometheus metrics: what authd counts, and the `GET /metrics` endpoint that shows it.
//!
//! [`Metrics`] owns a registry of its own (never the process-wide default), created
//! by `Application::build` and handed to the components that record: the trace
//! layer (requests), the hash pool, the store, the rate limiter and the token
//! issuer. Each component resolves the labels it needs once, when it is built, and
//! keeps the handles: recording on the request path is an atomic add, never a
//! label lookup. The components know nothing of HTTP; [`router`] is the only code
//! here that does.
//!
//! Labels only ever take values from a fixed set (RPC names, status codes, the
//! configured rules): nothing a client sends can create a new series.
//!
//! This file keeps the registry of one application, the families that describe
//! the process as a whole (`authd_build_info`, `authd_serving`, the process
//! collector), the rendering and the router. Each group of families is
//! registered by a file of its own, grouped by what it measures:
//! - `requests`: gRPC requests as the outermost layer sees them (by RPC and status
//!   code), and the spans of the OpenTelemetry exporter;
//! - `passwords`: the password blocklist, the hash queue and the hashing pool;
//! - `store`: store operations, the connection pools and the SQLite writer;
//! - `accounts`: logins and the login throttle, sessions and their revocation,
//!   tokens and their signing keys;
//! - `ratelimit`: the rate-limit tier, its Redis calls and its in-process fallback;
//! - `sentinel`: the Redis master the sentinels named, by address;
//! - `overload`: admission control and pushback, what was refused for load;
//! - `transport`: the connections of every listener, and TLS on the gRPC port;
//! - `admin`: the admin API's calls and what they did to accounts;
//! - `events`: WatchEvents streams, retention's deletions, webhook deliveries;
//! - `authz`: external authorization's decisions (Envoy's Check, forward-auth);
//! - `oidc`: the standard endpoints' introspections and revocations;
//! - `second_factor`: TOTP enrollments, second-factor codes by outcome, recovery
//!   codes used;
//! - `service`: the tokens service accounts were granted and refused.
//!
//! Like the rest of the bottom floor, none of these files imports anything above
//! it: the components take their handles from here, never the other way round.

mod accounts;
mod admin;
mod authz;
mod events;
mod oidc;
mod overload;
mod passwords;
mod ratelimit;
mod requests;
mod second_factor;
mod sentinel;
mod service;
mod store;
mod transport;

pub(crate) use accounts::{LoginOutcome, SessionMetrics, ThrottleMetrics, TokenMetrics};
pub(crate) use admin::AdminMetrics;
pub(crate) use authz::AuthzMetrics;
pub(crate) use events::EventMetrics;
pub(crate) use oidc::OidcMetrics;
pub(crate) use overload::OverloadMetrics;
pub(crate) use passwords::{BlocklistMetrics, HashMetrics, RehashMetrics};
pub(crate) use ratelimit::RateLimitMetrics;
pub(crate) use requests::{CODE_NAMES, GrpcMetrics, TraceMetrics};
pub(crate) use second_factor::{CodeOutcome, FactorChange, SecondFactorMetrics};
pub(crate) use sentinel::SentinelMetrics;
pub(crate) use service::{GRANTS, GrantOutcome, ServiceMetrics};
pub(crate) use store::StoreMetrics;
pub(crate) use transport::{ConnectionMetrics, ListenerMetrics, TlsMetrics};

use prometheus::{
    Encoder as _, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder, core::Collector,
};
use std::sync::{Arc, Mutex};

/// Waiting (in the hash queue, for a connection) and database operations: from
/// 50 µs (a SQLite read) to 30 s.
const WAIT_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
];

/// The metrics of one application, in a registry of its own.
pub struct Metrics {
    registry: Registry,
    pub(crate) grpc: GrpcMetrics,
    pub(crate) hash: HashMetrics,
    pub(crate) rehash: RehashMetrics,
    pub(crate) store: StoreMetrics,
    pub(crate) rate_limit: RateLimitMetrics,
    pub(crate) sentinel: SentinelMetrics,
    pub(crate) tokens: TokenMetrics,
    pub(crate) connections: ConnectionMetrics,
    pub(crate) blocklist: BlocklistMetrics,
    pub(crate) throttle: ThrottleMetrics,
    pub(crate) tls: TlsMetrics,
    pub(crate) sessions: SessionMetrics,
    pub(crate) traces: TraceMetrics,
    pub(crate) overload: OverloadMetrics,
    pub(crate) admin: AdminMetrics,
    pub(crate) authz: AuthzMetrics,
    pub(crate) oidc: OidcMetrics,
    pub(crate) second_factor: SecondFactorMetrics,
    pub(crate) service: ServiceMetrics,
    pub(crate) events: EventMetrics,
    /// 1 while readiness is SERVING, 0 while NOT_SERVING (the health checker sets it).
    pub(crate) serving: IntGauge,
    /// Run before each scrape, for values read from elsewhere (connection pools).
    refreshers: Mutex<Vec<Box<dyn Fn() + Send + Sync>>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Registers new families in one registry and returns their handles. The names
/// are constants, unique in a new registry, so a failure is a bug caught by any
/// test (every test builds a [`Metrics`]).
struct Families<'r> {
    registry: &'r Registry,
}

impl Families<'_> {
    /// Registers `metric` and returns it.
    fn registered<C: Collector + Clone + 'static>(&self, metric: C) -> C {
        self.registry
            .register(Box::new(metric.clone()))
            .expect("metric names are valid and unique");
        metric
    }

    fn counter(&self, name: &str, help: &str) -> IntCounter {
        self.registered(IntCounter::with_opts(Opts::new(name, help)).expect("valid"))
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
        self.registered(IntCounterVec::new(Opts::new(name, help), labels).expect("valid"))
    }

    fn gauge(&self, name: &str, help: &str) -> IntGauge {
        self.registered(IntGauge::with_opts(Opts::new(name, help)).expect("valid"))
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
        self.registered(IntGaugeVec::new(Opts::new(name, help), labels).expect("valid"))
    }

    /// A gauge of fractional values, by label.
    fn float_gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> prometheus::GaugeVec {
        self.registered(prometheus::GaugeVec::new(Opts::new(name, help), labels).expect("valid"))
    }

    fn histogram(&self, name: &str, help: &str, buckets: &[f64]) -> Histogram {
        self.registered(
            Histogram::with_opts(HistogramOpts::new(name, help).buckets(buckets.to_vec()))
                .expect("valid"),
        )
    }

    fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        buckets: &[f64],
        labels: &[&str],
    ) -> HistogramVec {
        self.registered(
            HistogramVec::new(
                HistogramOpts::new(name, help).buckets(buckets.to_vec()),
                labels,
            )
            .expect("valid"),
        )
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let f = Families {
            registry: &registry,
        };
        let serving = f.gauge(
            "authd_serving",
            "1 while readiness (grpc.health.v1 for \"\" and auth.v1.AuthService) is SERVING; 0 \
             while NOT_SERVING: the database does not answer, or the server is draining.",
        );
        f.gauge_vec(
            "authd_build_info",
            "Always 1; the version of authd as a label.",
            &["version"],
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
        // RSS, CPU time, open and maximum fds, start time (read from /proc at scrape).
        #[cfg(target_os = "linux")]
        registered_process_collector(&registry);

        Self {
            grpc: GrpcMetrics::new(&f),
            hash: HashMetrics::new(&f),
            rehash: RehashMetrics::new(&f),
            store: StoreMetrics::new(&f),
            rate_limit: RateLimitMetrics::new(&f),
            sentinel: SentinelMetrics::new(&f),
            tokens: TokenMetrics::new(&f),
            connections: ConnectionMetrics::new(&f),
            blocklist: BlocklistMetrics::new(&f),
            throttle: ThrottleMetrics::new(&f),
            tls: TlsMetrics::new(&f),
            sessions: SessionMetrics::new(&f),
            traces: TraceMetrics::new(&f),
            overload: OverloadMetrics::new(&f),
            admin: AdminMetrics::new(&f),
            authz: AuthzMetrics::new(&f),
            oidc: OidcMetrics::new(&f),
            second_factor: SecondFactorMetrics::new(&f),
            service: ServiceMetrics::new(&f),
            events: EventMetrics::new(&f),
            serving,
            refreshers: Mutex::new(Vec::new()),
            // Last: every family above is registered in it through `f`.
            registry,
        }
    }

    /// The connection metrics of the listener called `name`.
    pub(crate) fn listener(&self, name: &str) -> ListenerMetrics {
        self.connections.listener(name)
    }

    /// Runs `refresh` before every scrape: for gauges whose value lives elsewhere.
    pub(crate) fn on_scrape(&self, refresh: impl Fn() + Send + Sync + 'static) {
        self.refreshers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(refresh));
    }

    /// Everything, in the Prometheus text format (0.0.4).
    pub fn render(&self) -> String {
        for refresh in self
            .refreshers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            refresh();
        }
        let mut out = Vec::with_capacity(16 * 1024);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "encoding the metrics failed");
        }
        // The text encoder writes only UTF-8 (names, labels and numbers).
        String::from_utf8(out).unwrap_or_default()
    }
}

#[cfg(target_os = "linux")]
fn registered_process_collector(registry: &Registry) {
    let collector = prometheus::process_collector::ProcessCollector::for_self();
    registry
        .register(Box::new(collector))
        .expect("process metric names are unique");
}

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The router of the plain-HTTP port: `GET /metrics`. Served by
/// `transport::Listener`, which bounds its connections like every listener's.
pub(crate) fn router(metrics: Arc<Metrics>) -> axum::Router {
    use axum::{http::header, routing::get};
    axum::Router::new().route(
        "/metrics",
        get(move || {
            let metrics = metrics.clone();
            async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], metrics.render()) }
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::{Protocol, Rpc};
    use std::time::Duration;

    #[test]
    fn every_metric_has_help_and_renders() {
        let m = Metrics::new();
        m.grpc
            .record(Protocol::Json, Rpc::Login, 16, Duration::from_millis(3));
        let text = m.render();
        assert!(text.contains(
            "authd_grpc_requests_total{code=\"UNAUTHENTICATED\",method=\"Login\",protocol=\"json\",service=\"auth.v1.AuthService\"} 1"
        ), "{text}");
        for family in m.registry.gather() {
            assert!(!family.help().is_empty(), "{} has no help", family.name());
        }
    }

    #[test]
    fn registries_are_independent() {
        let (a, b) = (Metrics::new(), Metrics::new());
        a.tokens.issued.inc();
        assert!(a.render().contains("authd_tokens_issued_total 1"));
        assert!(b.render().contains("authd_tokens_issued_total 0"));
    }
}
