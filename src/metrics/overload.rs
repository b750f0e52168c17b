//! The overload metrics: requests admission control refused (their deadline, the
//! room kept for other clients, the in-flight cap, per-client share, draining), the
//! measured answer rates and predicted waits its decisions come from, and how
//! pushback answered refusals with a retry hint (held on a timer, or at once) and
//! what refusing cost.
//!
//! The causes are resolved here once; the layers (`layers::admission`,
//! `layers::pushback`) keep the handles and this file must not import them.

use super::Families;
use prometheus::{Gauge, IntCounter, IntGauge};

/// The `kind` values of the admission gauges: requests that hash a password, and
/// the others (indexed by `layers::admission::Kind`, which names them in this order).
pub(crate) const ADMISSION_KINDS: [&str; 2] = ["hash", "other"];

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
    pub admission_deadline: IntCounter,
    pub admission_share: IntCounter,
    /// Per kind of request: the measured answer rate, and the predicted time of a
    /// request admitted now.
    pub answer_rate: [Gauge; 2],
    pub predicted_wait: [Gauge; 2],
}

impl OverloadMetrics {
    pub(super) fn new(f: &Families) -> Self {
        let refusals = f.counter_vec(
            "authd_admission_refused_total",
            "AuthService requests admission control refused, by cause: deadline (it would not \
             be answered before its deadline, RESOURCE_EXHAUSTED), share (it would, but its \
             client holds its share of the requests in flight and the room left is kept for \
             others, RESOURCE_EXHAUSTED), in_flight (the in-flight cap, AUTHD_MAX_IN_FLIGHT, \
             RESOURCE_EXHAUSTED), client (the client had its share open, RESOURCE_EXHAUSTED), \
             draining (shutting down, UNAVAILABLE).",
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
            admission_deadline: refusals.with_label_values(&["deadline"]),
            admission_share: refusals.with_label_values(&["share"]),
            answer_rate: {
                let rates = f.float_gauge_vec(
                    "authd_admission_answer_rate",
                    "AuthService requests answered per busy second (time with a request of the \
                     kind in flight), smoothed, by kind: hash (Register, Login, ChangePassword) \
                     or other; what admission predicts waits from; 0 before a measurement.",
                    &["kind"],
                );
                ADMISSION_KINDS.map(|kind| rates.with_label_values(&[kind]))
            },
            predicted_wait: {
                let waits = f.float_gauge_vec(
                    "authd_admission_predicted_wait_seconds",
                    "How long a request of the kind admitted now is predicted to take, from \
                     the requests of that kind in flight and their answer rate, as of the last \
                     rate measurement; a request is admitted when this fits before its \
                     deadline.",
                    &["kind"],
                );
                ADMISSION_KINDS.map(|kind| waits.with_label_values(&[kind]))
            },
        }
    }
}
