//! The overload metrics: requests admission control refused (in-flight cap, its
//! bound by time, per-client share, draining), that bound and the rate it comes
//! from, and how pushback answered refusals with a retry
//! hint (held on a timer, or at once) and what refusing cost.
//!
//! The causes are resolved here once; the layers (`layers::admission`,
//! `layers::pushback`) keep the handles and this file must not import them.

use super::Families;
use prometheus::{IntCounter, IntGauge};

/// Admission control and pushback: what was refused for load, and how.
#[derive(Clone)]
pub(crate) struct OverloadMetrics {
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
    pub admission_wait: IntCounter,
    pub admission_share: IntCounter,
    /// The bound by time on requests in flight, and the measured rate it is from.
    pub in_flight_limit: IntGauge,
    pub answer_rate: prometheus::Gauge,
}

impl OverloadMetrics {
    pub(super) fn new(f: &Families) -> Self {
        let refusals = f.counter_vec(
            "authd_admission_refused_total",
            "AuthService requests admission control refused, by cause: in_flight (the in-flight \
             cap, RESOURCE_EXHAUSTED), wait (the requests in flight at their bound by time, \
             AUTHD_IN_FLIGHT_WAIT, RESOURCE_EXHAUSTED), share (at that bound, and the client \
             holds its fair share of it, RESOURCE_EXHAUSTED), client (the client had its share \
             open, RESOURCE_EXHAUSTED), draining (shutting down, UNAVAILABLE).",
            &["cause"],
        );
        Self {
            held: f.gauge(
                "authd_refusals_held",
                "Refused requests (RESOURCE_EXHAUSTED with a retry hint) held on a timer now, \
                 before their answer (AUTHD_REFUSAL_HOLD).",
            ),
            held_total: f.counter(
                "authd_refusals_held_total",
                "Refused requests whose answer was held on a timer before it was sent.",
            ),
            at_once: f.counter(
                "authd_refusals_unheld_total",
                "Refused requests answered at once: no hold configured, the client's deadline \
                 too near, shutting down, or AUTHD_REFUSAL_HOLD_MAX(_PER_CLIENT) reached.",
            ),
            refusal_seconds: f.registered(
                prometheus::Counter::with_opts(prometheus::Opts::new(
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
            admission_wait: refusals.with_label_values(&["wait"]),
            admission_share: refusals.with_label_values(&["share"]),
            in_flight_limit: f.gauge(
                "authd_admission_in_flight_limit",
                "The most AuthService requests that may be in flight now: the measured answer \
                 rate times AUTHD_IN_FLIGHT_WAIT, at least its floor, at most \
                 AUTHD_MAX_IN_FLIGHT (which it is with the bound off or before a measurement).",
            ),
            answer_rate: f.registered(
                prometheus::Gauge::with_opts(prometheus::Opts::new(
                    "authd_admission_answer_rate",
                    "AuthService requests answered per busy second (time with a request in \
                     flight), smoothed: the rate the bound on requests in flight is from; 0 \
                     before a measurement.",
                ))
                .expect("valid"),
            ),
        }
    }
}
