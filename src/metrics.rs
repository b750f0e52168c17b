//! Prometheus metrics: what authd counts, and the `GET /metrics` endpoint that shows it.
//!
//! [`Metrics`] owns a registry of its own (never the process-wide default), created
//! by `Application::build` and handed to the components that record: the trace
//! layer (requests), the hash pool, the store, the rate limiter and the token
//! issuer. Each component resolves the labels it needs once, when it is built, and
//! keeps the handles: recording on the request path is an atomic add, never a
//! label lookup. The components know nothing of HTTP; [`serve`] is the only code
//! here that does.
//!
//! Labels only ever take values from a fixed set (RPC names, status codes, the
//! configured rules): nothing a client sends can create a new series.

use crate::rpc::Rpc;
use prometheus::{
    Encoder as _, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder, core::Collector,
};
use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

/// Whole requests: 50 µs (a health check or a token validation answers in about
/// 100 µs) to 30 s.
const REQUEST_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
];
/// One PBKDF2 hash: 1 ms (a low test cost) to 10 s (600,000 rounds on a slow core
/// is a few hundred milliseconds).
const HASH_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0,
    10.0,
];
/// Waiting (in the hash queue, for a connection) and database operations: from
/// 50 µs (a SQLite read) to 30 s.
const WAIT_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
];
/// One Redis round trip: 50 µs to 1 s (calls time out after `AUTHD_REDIS_TIMEOUT`).
const REDIS_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];
/// Writes in one SQLite transaction: 1 to `AUTHD_SQLITE_MAX_BATCH` (at most 10,000).
const BATCH_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0, 10000.0,
];

/// The canonical names of the gRPC status codes, indexed by code.
pub(crate) const CODE_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// Requests, as the outermost layer sees them.
pub(crate) struct GrpcMetrics {
    pub in_flight: IntGauge,
    /// The handles of every (RPC, code) pair, resolved when the registry is built:
    /// every series exists at 0 from the start, so the first request of each pair is
    /// an increase a `rate()` sees (a series born at 1 is not).
    resolved: [[(IntCounter, Histogram); CODE_NAMES.len()]; Rpc::ALL.len()],
}

impl GrpcMetrics {
    fn new(requests: IntCounterVec, duration: HistogramVec, in_flight: IntGauge) -> Self {
        let resolved = std::array::from_fn(|rpc| {
            let rpc = Rpc::ALL[rpc];
            std::array::from_fn(|code| {
                let labels = [rpc.service(), rpc.method(), CODE_NAMES[code]];
                (
                    requests.with_label_values(&labels),
                    duration.with_label_values(&labels),
                )
            })
        });
        Self {
            in_flight,
            resolved,
        }
    }

    /// Counts a finished request. `code` is a gRPC status code (0..=16).
    pub fn record(&self, rpc: Rpc, code: usize, elapsed: Duration) {
        let (count, latency) = &self.resolved[rpc.index()][code];
        count.inc();
        latency.observe(elapsed.as_secs_f64());
    }
}

/// The `cause` values of `authd_hash_refused_total`: why the hash queue refused a
/// place. Indexed by the queue's refusal (`password::Refusal`, which names its
/// causes in this order), so the series exist from the first scrape.
pub(crate) const HASH_REFUSAL_CAUSES: [&str; 4] = ["full", "wait", "share", "deadline"];

/// The password hashing pool.
#[derive(Clone)]
pub(crate) struct HashMetrics {
    pub queue_depth: IntGauge,
    pub running: IntGauge,
    pub threads: IntGauge,
    pub queue_capacity: IntGauge,
    pub queue_limit: IntGauge,
    pub queue_wait: Histogram,
    pub duration: Histogram,
    pub rounds: IntCounter,
    pub batch_size: Histogram,
    pub refused: IntCounterVec,
    pub dropped_deadline: IntCounter,
    pub dropped_cancelled: IntCounter,
}

/// The store; components resolve their `backend` and `operation` labels when built.
pub(crate) struct StoreMetrics {
    pub operation_duration: HistogramVec,
    pub operation_errors: IntCounterVec,
    pub pool_acquire: HistogramVec,
    pub pool_connections: IntGaugeVec,
    pub pool_max: IntGaugeVec,
    pub sqlite_batch_size: Histogram,
    pub sqlite_commit: Histogram,
}

/// The rate limiter.
pub(crate) struct RateLimitMetrics {
    /// Requests the tier decided, by what they were told (one per request).
    pub admitted: IntCounter,
    pub refused: IntCounter,
    pub unavailable: IntCounter,
    /// Refused requests, by each rule that refused them (resolved per rule).
    pub refusals: IntCounterVec,
    pub decisions: IntCounterVec,
    pub redis_duration: Histogram,
    pub redis_errors: IntCounterVec,
    pub fallback_active: IntGauge,
    pub local_keys: IntGauge,
    pub local_overflowed: IntCounter,
}

/// Tokens issued and checked.
pub(crate) struct TokenMetrics {
    pub issued: IntCounter,
    pub validated: IntCounterVec,
    /// 1 for the key that signs now, by `kid` and `alg`.
    pub signing_key: IntGaugeVec,
    /// Re-reads of the token key file that found it changed, by outcome.
    pub key_reloads: IntCounterVec,
}

/// Sessions: started, refreshed, ended; the revocation set and its poller.
pub(crate) struct SessionMetrics {
    pub started: IntCounter,
    pub refreshed: IntCounter,
    pub ended: IntCounterVec,
    pub revoked: IntGauge,
    pub revocations_evicted: IntCounter,
    pub poll_errors: IntCounter,
    pub sync_age: Gauge,
}

/// Spans of the OpenTelemetry exporter (see `otel`).
pub(crate) struct TraceMetrics {
    pub exported: IntCounter,
    pub dropped: IntCounter,
    /// 1 while the export is paused (the collector failed or could not keep up).
    pub paused: IntGauge,
    /// Requests not traced because the export was paused.
    pub untraced: IntCounter,
}

/// New passwords the blocklist refused, by reason.
pub(crate) struct BlocklistMetrics {
    pub refusals: IntCounterVec,
}

/// Logins by outcome, and the login throttle (`throttle`).
#[derive(Clone)]
pub(crate) struct ThrottleMetrics {
    /// ok, failed, throttled.
    pub logins: [IntCounter; 3],
    /// Refusals by scope: client, account.
    pub refusals: [IntCounter; 2],
    pub redis_errors: IntCounter,
    pub fallback_active: IntGauge,
    pub local_entries: IntGauge,
    /// Attempts that waited for attempts in flight before their decision.
    pub waits: IntCounter,
}

/// The outcomes of a login attempt, as `authd_logins_total` labels them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoginOutcome {
    Ok = 0,
    Failed = 1,
    Throttled = 2,
}

/// TLS on the gRPC port: the certificates in force and their reloads.
#[derive(Clone)]
pub(crate) struct TlsMetrics {
    pub expiry: IntGaugeVec,
    pub reloads: IntCounterVec,
    pub handshake_errors: IntCounter,
}

impl TlsMetrics {
    /// The expiry gauge of one certificate (`server` or `client_ca`).
    pub(crate) fn expiry(&self, certificate: &str) -> IntGauge {
        self.expiry.with_label_values(&[certificate])
    }
}

/// The connections of the listeners (gRPC, health, metrics), by `listener`.
pub(crate) struct ConnectionMetrics {
    pub open: IntGaugeVec,
    pub max: IntGaugeVec,
    pub refused: IntCounterVec,
    pub accept_errors: IntCounterVec,
    pub handshake_timeouts: IntCounterVec,
    pub idle_closed: IntCounterVec,
}

/// The connection metric handles of one listener.
#[derive(Clone)]
pub(crate) struct ListenerMetrics {
    pub open: IntGauge,
    pub max_connections: IntGauge,
    pub refused: IntCounter,
    pub accept_errors: IntCounter,
    pub handshake_timeouts: IntCounter,
    pub idle_closed: IntCounter,
}

/// Admission control and pushback: what was refused for load, and how.
#[derive(Clone)]
pub(crate) struct PushbackMetrics {
    /// Refusals being held now.
    pub held: IntGauge,
    /// Refusals held before their answer, and answered at once.
    pub held_total: IntCounter,
    pub at_once: IntCounter,
    /// Time the layers below pushback spent on requests that ended refused.
    pub refusal_seconds: prometheus::Counter,
    /// Refusals by admission control, by cause (resolved per cause).
    pub admission_in_flight: IntCounter,
    pub admission_client: IntCounter,
    pub admission_draining: IntCounter,
}

/// The metrics of one application, in a registry of its own.
pub struct Metrics {
    registry: Registry,
    pub(crate) grpc: GrpcMetrics,
    pub(crate) hash: HashMetrics,
    pub(crate) store: StoreMetrics,
    pub(crate) rate_limit: RateLimitMetrics,
    pub(crate) tokens: TokenMetrics,
    pub(crate) connections: ConnectionMetrics,
    pub(crate) blocklist: BlocklistMetrics,
    pub(crate) throttle: ThrottleMetrics,
    pub(crate) tls: TlsMetrics,
    pub(crate) sessions: SessionMetrics,
    pub(crate) traces: TraceMetrics,
    pub(crate) pushback: PushbackMetrics,
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

/// Registers `metric` and returns it. The names are constants, unique in a new
/// registry, so a failure is a bug caught by any test.
fn registered<C: Collector + Clone + 'static>(registry: &Registry, metric: C) -> C {
    registry
        .register(Box::new(metric.clone()))
        .expect("metric names are valid and unique");
    metric
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help)
}

fn histogram_opts(name: &str, help: &str, buckets: &[f64]) -> HistogramOpts {
    HistogramOpts::new(name, help).buckets(buckets.to_vec())
}

impl Metrics {
    pub fn new() -> Self {
        let r = Registry::new();
        let counter = |name: &str, help: &str| {
            registered(&r, IntCounter::with_opts(opts(name, help)).expect("valid"))
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            registered(
                &r,
                IntCounterVec::new(opts(name, help), labels).expect("valid"),
            )
        };
        let gauge = |name: &str, help: &str| {
            registered(&r, IntGauge::with_opts(opts(name, help)).expect("valid"))
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            registered(
                &r,
                IntGaugeVec::new(opts(name, help), labels).expect("valid"),
            )
        };
        let histogram = |name: &str, help: &str, buckets: &[f64]| {
            registered(
                &r,
                Histogram::with_opts(histogram_opts(name, help, buckets)).expect("valid"),
            )
        };
        let histogram_vec = |name: &str, help: &str, buckets: &[f64], labels: &[&str]| {
            registered(
                &r,
                HistogramVec::new(histogram_opts(name, help, buckets), labels).expect("valid"),
            )
        };

        let grpc = GrpcMetrics::new(
            counter_vec(
                "authd_grpc_requests_total",
                "gRPC requests answered, by service, method and status code.",
                &["service", "method", "code"],
            ),
            histogram_vec(
                "authd_grpc_request_duration_seconds",
                "Time from a request's arrival to its response headers (the whole unary call), \
                 by service, method and status code.",
                REQUEST_BUCKETS,
                &["service", "method", "code"],
            ),
            gauge(
                "authd_grpc_requests_in_flight",
                "gRPC requests being handled now (every service).",
            ),
        );
        let dropped = counter_vec(
            "authd_hash_dropped_total",
            "Hash jobs dropped unrun: their deadline passed while queued (deadline), or their \
             caller went away (cancelled).",
            &["reason"],
        );
        let hash = HashMetrics {
            queue_depth: gauge(
                "authd_hash_queue_depth",
                "Hash jobs waiting for a hashing thread.",
            ),
            running: gauge(
                "authd_hash_running",
                "Hash jobs running on a hashing thread now.",
            ),
            threads: gauge(
                "authd_hash_threads",
                "Hashing threads (AUTHD_HASH_THREADS).",
            ),
            queue_capacity: gauge(
                "authd_hash_queue_capacity",
                "Hash jobs that may wait before requests are refused (AUTHD_HASH_QUEUE).",
            ),
            queue_limit: gauge(
                "authd_hash_queue_limit",
                "Places (queued and running) the hash queue grants now: its wait target \
                 (AUTHD_HASH_QUEUE_WAIT) times the measured service rate, within the count \
                 bound (AUTHD_HASH_QUEUE plus the threads).",
            ),
            queue_wait: histogram(
                "authd_hash_queue_wait_seconds",
                "Time a hash job waited in the queue before a thread took it.",
                WAIT_BUCKETS,
            ),
            duration: histogram(
                "authd_hash_duration_seconds",
                "Time to compute one PBKDF2 hash or verification on a hashing thread.",
                HASH_BUCKETS,
            ),
            batch_size: histogram(
                "authd_hash_batch_size",
                "Derivations a hashing thread computed together in one batch (the lanes of the \
                 PBKDF2 engine; a request's verification and its padding count as two).",
                &[1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0],
            ),
            rounds: counter(
                "authd_hash_rounds_total",
                "PBKDF2 rounds computed: hashes, verifications, and the padding that makes \
                 every failed login cost as much as the most expensive stored hash.",
            ),
            refused: {
                let refused = counter_vec(
                    "authd_hash_refused_total",
                    "Requests the hash queue refused with RESOURCE_EXHAUSTED, by cause: full \
                     (its count bound), wait (its wait target), share (at its bound, the client \
                     held its fair share), deadline (the deadline would pass in the queue).",
                    &["cause"],
                );
                for cause in HASH_REFUSAL_CAUSES {
                    refused.with_label_values(&[cause]);
                }
                refused
            },
            dropped_deadline: dropped.with_label_values(&["deadline"]),
            dropped_cancelled: dropped.with_label_values(&["cancelled"]),
        };
        let store = StoreMetrics {
            operation_duration: histogram_vec(
                "authd_store_operation_duration_seconds",
                "Time of one store operation, waiting for a connection or the SQLite writer \
                 included, by backend and operation.",
                WAIT_BUCKETS,
                &["backend", "operation"],
            ),
            operation_errors: counter_vec(
                "authd_store_errors_total",
                "Store operations that failed, by backend, operation and kind (unavailable: the \
                 database could not be reached; other: unexpected).",
                &["backend", "operation", "kind"],
            ),
            pool_acquire: histogram_vec(
                "authd_store_pool_acquire_duration_seconds",
                "Time waiting for a connection from the pool (PostgreSQL; SQLite readers), by \
                 backend.",
                WAIT_BUCKETS,
                &["backend"],
            ),
            pool_connections: gauge_vec(
                "authd_store_pool_connections",
                "Connections of the pool by state (in_use, idle), read at scrape time.",
                &["backend", "state"],
            ),
            pool_max: gauge_vec(
                "authd_store_pool_max_connections",
                "Most connections the pool opens (AUTHD_DB_MAX_CONNECTIONS).",
                &["backend"],
            ),
            sqlite_batch_size: histogram(
                "authd_sqlite_batch_size",
                "Writes committed by the SQLite writer in one transaction (group commit).",
                BATCH_BUCKETS,
            ),
            sqlite_commit: histogram(
                "authd_sqlite_commit_duration_seconds",
                "Time of one SQLite write transaction, BEGIN to the end of COMMIT's fsync.",
                WAIT_BUCKETS,
            ),
        };
        let requests = counter_vec(
            "authd_ratelimit_requests_total",
            "Requests the rate-limit tier decided (those at least one rule applies to), by \
             outcome: admitted (every rule had room), refused (RESOURCE_EXHAUSTED), unavailable \
             (UNAVAILABLE: Redis failed in fail-closed mode).",
            &["outcome"],
        );
        let rate_limit = RateLimitMetrics {
            admitted: requests.with_label_values(&["admitted"]),
            refused: requests.with_label_values(&["refused"]),
            unavailable: requests.with_label_values(&["unavailable"]),
            refusals: counter_vec(
                "authd_ratelimit_refusals_total",
                "Requests refused by the rate-limit tier, by rule: a request two rules refused \
                 counts once under each (so the sum over rules can exceed the refused requests).",
                &["rule"],
            ),
            decisions: counter_vec(
                "authd_ratelimit_decisions_total",
                "Rule evaluations, by rule and outcome: each request counts once under every rule \
                 that applies to it (allowed: that rule had room, even if another rule refused the \
                 request; refused: that rule refused it; unavailable: Redis failed in fail-closed \
                 mode). Requests admitted or refused: authd_ratelimit_requests_total.",
                &["rule", "outcome"],
            ),
            redis_duration: histogram(
                "authd_ratelimit_redis_duration_seconds",
                "Time of one Redis rate-limit decision (one script call), failures included.",
                REDIS_BUCKETS,
            ),
            redis_errors: counter_vec(
                "authd_ratelimit_redis_errors_total",
                "Redis rate-limit calls that failed, by kind (timeout, error, not_connected, \
                 bad_reply).",
                &["kind"],
            ),
            local_keys: gauge(
                "authd_ratelimit_local_keys",
                "Keys the in-process limiter tracks now (at most AUTHD_RATE_LIMIT_MAX_KEYS, plus one \
                 overflow log per rule).",
            ),
            local_overflowed: counter(
                "authd_ratelimit_local_overflow_total",
                "Requests the in-process limiter counted in a rule's shared overflow log because \
                 AUTHD_RATE_LIMIT_MAX_KEYS keys were tracked already.",
            ),
            fallback_active: gauge(
                "authd_ratelimit_fallback_active",
                "1 while Redis is configured but failing and the fallback decides (local \
                 limiter, or refusals in fail-closed mode); else 0.",
            ),
        };
        let tokens = TokenMetrics {
            issued: counter("authd_tokens_issued_total", "Access tokens issued."),
            validated: counter_vec(
                "authd_tokens_validated_total",
                "Access tokens checked, by outcome (ok, or why it was refused).",
                &["outcome"],
            ),
            signing_key: gauge_vec(
                "authd_token_signing_key",
                "1 for the key that signs new tokens now, by kid and alg (HS256 or EdDSA).",
                &["kid", "alg"],
            ),
            key_reloads: counter_vec(
                "authd_token_keys_reloads_total",
                "Changes of AUTHD_TOKEN_KEYS_FILE seen while serving, by outcome (ok: the new \
                 ring is in use; error: the file was refused and the previous ring kept).",
                &["outcome"],
            ),
        };
        let connections = ConnectionMetrics {
            open: gauge_vec(
                "authd_connections_open",
                "Connections open now, by listener (grpc, health, metrics).",
                &["listener"],
            ),
            max: gauge_vec(
                "authd_connections_max",
                "Most connections a listener keeps open (AUTHD_MAX_CONNECTIONS for grpc).",
                &["listener"],
            ),
            refused: counter_vec(
                "authd_connections_refused_total",
                "Connections closed at once because the listener, or the client's share of it, \
                 was full.",
                &["listener"],
            ),
            accept_errors: counter_vec(
                "authd_connections_accept_errors_total",
                "Failed accepts (out of file descriptors, memory or buffers), each followed by a \
                 back-off.",
                &["listener"],
            ),
            handshake_timeouts: counter_vec(
                "authd_connections_handshake_timeouts_total",
                "Connections closed because they sent no request within AUTHD_HANDSHAKE_TIMEOUT.",
                &["listener"],
            ),
            idle_closed: counter_vec(
                "authd_connections_idle_closed_total",
                "Connections closed because no request was open on them for AUTHD_IDLE_TIMEOUT.",
                &["listener"],
            ),
        };
        let blocklist = BlocklistMetrics {
            refusals: counter_vec(
                "authd_password_blocklist_refusals_total",
                "New passwords refused before hashing, by reason (common: on the bundled list or \
                 AUTHD_PASSWORD_BLOCKLIST_FILE; username: the username itself).",
                &["reason"],
            ),
        };
        let logins = counter_vec(
            "authd_logins_total",
            "Login attempts by outcome: ok, failed (wrong password or unknown username), \
             throttled (refused by the login throttle before any hashing).",
            &["outcome"],
        );
        let refusals = counter_vec(
            "authd_login_throttle_refusals_total",
            "Attempts the login throttle refused, by the count that refused them: client \
             (this client's failures for the username) or account (the username's failures \
             across clients).",
            &["scope"],
        );
        let throttle = ThrottleMetrics {
            logins: ["ok", "failed", "throttled"].map(|o| logins.with_label_values(&[o])),
            refusals: ["client", "account"].map(|s| refusals.with_label_values(&[s])),
            redis_errors: registered(
                &r,
                IntCounter::new(
                    "authd_login_throttle_redis_errors_total",
                    "Login throttle calls to Redis that failed or timed out (the counts then \
                     fall back to this replica's, or refuse under AUTHD_RATE_LIMIT_FAILURE=closed).",
                )
                .expect("valid"),
            ),
            fallback_active: registered(
                &r,
                IntGauge::new(
                    "authd_login_throttle_fallback_active",
                    "1 while the login throttle counts in process because Redis fails.",
                )
                .expect("valid"),
            ),
            local_entries: registered(
                &r,
                IntGauge::new(
                    "authd_login_throttle_local_entries",
                    "Entries of the in-process login throttle (at most \
                     AUTHD_LOGIN_THROTTLE_MAX_ENTRIES).",
                )
                .expect("valid"),
            ),
            waits: registered(
                &r,
                IntCounter::new(
                    "authd_login_throttle_waits_total",
                    "Login attempts that waited for attempts in flight for the same username \
                     (which fill what the counts allow) to settle before being decided.",
                )
                .expect("valid"),
            ),
        };
        let refusals = counter_vec(
            "authd_admission_refused_total",
            "AuthService requests admission control refused, by cause: in_flight (the in-flight \
             cap, RESOURCE_EXHAUSTED), client (the client had its share open, \
             RESOURCE_EXHAUSTED), draining (shutting down, UNAVAILABLE).",
            &["cause"],
        );
        let pushback = PushbackMetrics {
            held: gauge(
                "authd_refusals_held",
                "Refused requests (RESOURCE_EXHAUSTED with a retry hint) held on a timer now, \
                 before their answer (AUTHD_REFUSAL_HOLD).",
            ),
            held_total: counter(
                "authd_refusals_held_total",
                "Refused requests whose answer was held on a timer before it was sent.",
            ),
            at_once: counter(
                "authd_refusals_unheld_total",
                "Refused requests answered at once: no hold configured, the client's deadline \
                 too near, shutting down, or AUTHD_REFUSAL_HOLD_MAX(_PER_CLIENT) reached.",
            ),
            refusal_seconds: registered(
                &r,
                prometheus::Counter::with_opts(opts(
                    "authd_refusal_work_seconds_total",
                    "Time the server's runtime spent on requests that ended refused with a retry \
                     hint (admission, rate limits, throttle, the handler up to the refusal), \
                     holds excluded: what refusing costs.",
                ))
                .expect("valid"),
            ),
            admission_in_flight: refusals.with_label_values(&["in_flight"]),
            admission_client: refusals.with_label_values(&["client"]),
            admission_draining: refusals.with_label_values(&["draining"]),
        };
        let tls = TlsMetrics {
            expiry: gauge_vec(
                "authd_tls_certificate_expiry_timestamp_seconds",
                "When the certificate in force expires (notAfter, Unix seconds): server is the \
                 certificate of AUTHD_TLS_CERT, client_ca the first of AUTHD_TLS_CLIENT_CA to expire.",
                &["certificate"],
            ),
            reloads: counter_vec(
                "authd_tls_reloads_total",
                "Changes of the TLS files read, by outcome: ok (in force for new connections) or \
                 error (refused; the configuration before stays in force).",
                &["outcome"],
            ),
            handshake_errors: counter(
                "authd_tls_handshake_errors_total",
                "TLS handshakes that failed (no client certificate, an untrusted one, a protocol \
                 error); their connections are closed.",
            ),
        };
        let sessions = SessionMetrics {
            started: counter(
                "authd_sessions_started_total",
                "Sessions started (one per successful Login).",
            ),
            refreshed: counter(
                "authd_sessions_refreshed_total",
                "Refresh tokens rotated (a retried Refresh answered with the same token is not \
                 a second rotation).",
            ),
            ended: counter_vec(
                "authd_sessions_ended_total",
                "Sessions ended, by reason (logout, reuse: a rotated refresh token was presented \
                 again, password_change, expired: purged at their end without being ended).",
                &["reason"],
            ),
            revoked: gauge(
                "authd_revoked_sessions",
                "Ended sessions this replica refuses access tokens of (kept until their last \
                 token expires).",
            ),
            revocations_evicted: counter(
                "authd_revocations_evicted_total",
                "Revoked sessions evicted because the set was full; tokens issued before the \
                 evicted end are refused from then on.",
            ),
            poll_errors: counter(
                "authd_revocation_poll_errors_total",
                "Polls for sessions ended on other replicas that failed (database unreachable).",
            ),
            sync_age: registered(
                &r,
                Gauge::with_opts(opts(
                    "authd_revocation_sync_age_seconds",
                    "Seconds since this replica last read the sessions ended on every replica \
                     (read at scrape time; grows while the database is unreachable).",
                ))
                .expect("valid"),
            ),
        };
        let serving = gauge(
            "authd_serving",
            "1 while readiness (grpc.health.v1 for \"\" and auth.v1.AuthService) is SERVING; 0 \
             while NOT_SERVING: the database does not answer, or the server is draining.",
        );
        let traces = TraceMetrics {
            exported: counter(
                "authd_trace_spans_exported_total",
                "Spans the OTLP collector accepted (0 while tracing is off).",
            ),
            dropped: counter(
                "authd_trace_spans_dropped_total",
                "Spans given up: the export queue was full (the collector is slow or down) or \
                 their export failed or timed out.",
            ),
            paused: gauge(
                "authd_trace_export_paused",
                "1 while tracing is paused because an export failed (for a back-off of 1 to \
                 10 s, then a probe) or the export queue was full (until the export in \
                 progress succeeds): new requests are not traced.",
            ),
            untraced: counter(
                "authd_trace_requests_untraced_total",
                "Requests not traced because tracing was paused (the collector is down or \
                 slow).",
            ),
        };
        registered(
            &r,
            IntGaugeVec::new(
                opts(
                    "authd_build_info",
                    "Always 1; the version of authd as a label.",
                ),
                &["version"],
            )
            .expect("valid"),
        )
        .with_label_values(&[env!("CARGO_PKG_VERSION")])
        .set(1);
        // RSS, CPU time, open and maximum fds, start time (read from /proc at scrape).
        #[cfg(target_os = "linux")]
        registered_process_collector(&r);

        Self {
            registry: r,
            grpc,
            hash,
            store,
            rate_limit,
            tokens,
            connections,
            blocklist,
            throttle,
            tls,
            sessions,
            traces,
            pushback,
            serving,
            refreshers: Mutex::new(Vec::new()),
        }
    }

    /// The connection metrics of the listener called `name`.
    pub(crate) fn listener(&self, name: &str) -> ListenerMetrics {
        let c = &self.connections;
        ListenerMetrics {
            open: c.open.with_label_values(&[name]),
            max_connections: c.max.with_label_values(&[name]),
            refused: c.refused.with_label_values(&[name]),
            accept_errors: c.accept_errors.with_label_values(&[name]),
            handshake_timeouts: c.handshake_timeouts.with_label_values(&[name]),
            idle_closed: c.idle_closed.with_label_values(&[name]),
        }
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
/// `transport::serve`, which bounds its connections like every listener's.
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

    #[test]
    fn every_metric_has_help_and_renders() {
        let m = Metrics::new();
        m.grpc.record(Rpc::Login, 16, Duration::from_millis(3));
        let text = m.render();
        assert!(text.contains(
            "authd_grpc_requests_total{code=\"UNAUTHENTICATED\",method=\"Login\",service=\"auth.v1.AuthService\"} 1"
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
