//! The transport metrics: the connections of every listener (gRPC, health,
//! metrics), by `listener`, and TLS on the gRPC port (the certificates in force,
//! their reloads, failed handshakes).
//!
//! Each listener takes its handles once, through [`ConnectionMetrics::listener`];
//! this file must not import `transport`.

use super::Families;
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

/// TLS on the gRPC port: the certificates in force and their reloads.
#[derive(Clone)]
pub(crate) struct TlsMetrics {
    pub expiry: IntGaugeVec,
    pub reloads: IntCounterVec,
    pub handshake_errors: IntCounter,
}

impl TlsMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            expiry: f.gauge_vec(
                "authd_tls_certificate_expiry_timestamp_seconds",
                "When the certificate in force expires (notAfter, Unix seconds): server is the \
                 certificate of AUTHD_TLS_CERT, client_ca the first of AUTHD_TLS_CLIENT_CA to expire.",
                &["certificate"],
            ),
            reloads: f.counter_vec(
                "authd_tls_reloads_total",
                "Changes of the TLS files read, by outcome: ok (in force for new connections) or \
                 error (refused; the configuration before stays in force).",
                &["outcome"],
            ),
            handshake_errors: f.counter(
                "authd_tls_handshake_errors_total",
                "TLS handshakes that failed (no client certificate, an untrusted one, a protocol \
                 error); their connections are closed.",
            ),
        }
    }

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

impl ConnectionMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            open: f.gauge_vec(
                "authd_connections_open",
                "Connections open now, by listener (grpc, health, metrics).",
                &["listener"],
            ),
            max: f.gauge_vec(
                "authd_connections_max",
                "Most connections a listener keeps open (AUTHD_MAX_CONNECTIONS for grpc).",
                &["listener"],
            ),
            refused: f.counter_vec(
                "authd_connections_refused_total",
                "Connections closed at once because the listener, or the client's share of it, \
                 was full.",
                &["listener"],
            ),
            accept_errors: f.counter_vec(
                "authd_connections_accept_errors_total",
                "Failed accepts (out of file descriptors, memory or buffers), each followed by a \
                 back-off.",
                &["listener"],
            ),
            handshake_timeouts: f.counter_vec(
                "authd_connections_handshake_timeouts_total",
                "Connections closed because they sent no request within AUTHD_HANDSHAKE_TIMEOUT.",
                &["listener"],
            ),
            idle_closed: f.counter_vec(
                "authd_connections_idle_closed_total",
                "Connections closed because no request was open on them for AUTHD_IDLE_TIMEOUT.",
                &["listener"],
            ),
        }
    }

    /// The connection metric handles of the listener called `name`.
    pub(crate) fn listener(&self, name: &str) -> ListenerMetrics {
        ListenerMetrics {
            open: self.open.with_label_values(&[name]),
            max_connections: self.max.with_label_values(&[name]),
            refused: self.refused.with_label_values(&[name]),
            accept_errors: self.accept_errors.with_label_values(&[name]),
            handshake_timeouts: self.handshake_timeouts.with_label_values(&[name]),
            idle_closed: self.idle_closed.with_label_values(&[name]),
        }
    }
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
