//! The request metrics: gRPC requests as the outermost layer (`layers::trace`)
//! sees them, by service, method, status code and the protocol they arrived in
//! (gRPC, gRPC-Web or JSON, all translated to gRPC before the layers), and the spans the OpenTelemetry
//! exporter (`otel`) sends or gives up.
//!
//! Every (RPC, code) series is resolved here once, when the registry is built; the
//! layer records with an index, never a label lookup. This file must not learn of
//! any layer: it only hands out handles.

use super::Families;
use crate::rpc::{Protocol, Rpc};
use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge};
use std::{sync::OnceLock, time::Duration};

/// Whole requests: 50 µs (a health check or a token validation answers in about
/// 100 µs) to 30 s.
const REQUEST_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0,
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

/// The handles of one (protocol, RPC, code) series.
type Series = (IntCounter, Histogram);

/// Requests, as the outermost layer sees them.
pub(crate) struct GrpcMetrics {
    pub in_flight: IntGauge,
    requests: IntCounterVec,
    duration: HistogramVec,
    /// The handles of every (RPC, code) pair of gRPC calls, resolved when the
    /// registry is built: every series exists at 0 from the start, so the first
    /// request of each pair is an increase a `rate()` sees (a series born at 1 is not).
    resolved: [[Series; CODE_NAMES.len()]; Rpc::ALL.len()],
    /// The series of calls translated from gRPC-Web and JSON, resolved at their first
    /// request: resolved up front they would triple every scrape (each histogram is
    /// 20 lines) for ports that only ever see gRPC.
    translated: [[[OnceLock<Series>; CODE_NAMES.len()]; Rpc::ALL.len()]; 2],
}

impl GrpcMetrics {
    pub(super) fn new(f: &Families) -> Self {
        let requests = f.counter_vec(
            "authd_grpc_requests_total",
            "gRPC requests answered, by service, method, status code and protocol (grpc, \
             grpc-web or json).",
            &["service", "method", "code", "protocol"],
        );
        let duration = f.histogram_vec(
            "authd_grpc_request_duration_seconds",
            "Time from a request's arrival to its response headers (the whole unary call), \
             by service, method, status code and protocol.",
            REQUEST_BUCKETS,
            &["service", "method", "code", "protocol"],
        );
        let in_flight = f.gauge(
            "authd_grpc_requests_in_flight",
            "gRPC requests being handled now (every service).",
        );
        let resolved = std::array::from_fn(|rpc| {
            std::array::from_fn(|code| {
                series(&requests, &duration, Protocol::Grpc, Rpc::ALL[rpc], code)
            })
        });
        let translated = std::array::from_fn(|_| {
            std::array::from_fn(|_| std::array::from_fn(|_| OnceLock::new()))
        });
        Self {
            in_flight,
            requests,
            duration,
            resolved,
            translated,
        }
    }

    /// Counts a finished request. `code` is a gRPC status code (0..=16).
    pub fn record(&self, protocol: Protocol, rpc: Rpc, code: usize, elapsed: Duration) {
        let (count, latency) = match protocol {
            Protocol::Grpc => &self.resolved[rpc.index()][code],
            translated => self.translated[translated.index() - 1][rpc.index()][code]
                .get_or_init(|| series(&self.requests, &self.duration, protocol, rpc, code)),
        };
        count.inc();
        latency.observe(elapsed.as_secs_f64());
    }
}

/// The handles of one series.
fn series(
    requests: &IntCounterVec,
    duration: &HistogramVec,
    protocol: Protocol,
    rpc: Rpc,
    code: usize,
) -> Series {
    let labels = [
        rpc.service(),
        rpc.method(),
        CODE_NAMES[code],
        protocol.label(),
    ];
    (
        requests.with_label_values(&labels),
        duration.with_label_values(&labels),
    )
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

impl TraceMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            exported: f.counter(
                "authd_trace_spans_exported_total",
                "Spans the OTLP collector accepted (0 while tracing is off).",
            ),
            dropped: f.counter(
                "authd_trace_spans_dropped_total",
                "Spans given up: the export queue was full (the collector is slow or down) or \
                 their export failed or timed out.",
            ),
            paused: f.gauge(
                "authd_trace_export_paused",
                "1 while tracing is paused because an export failed (for a back-off of 1 to \
                 10 s, then a probe) or the export queue was full (until the export in \
                 progress succeeds): new requests are not traced.",
            ),
            untraced: f.counter(
                "authd_trace_requests_untraced_total",
                "Requests not traced because tracing was paused (the collector is down or \
                 slow).",
            ),
        }
    }
}
