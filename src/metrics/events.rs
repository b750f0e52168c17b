//! The account events' metrics: open WatchEvents streams and what they sent,
//! retention's deletions, and webhook deliveries by outcome.

use super::Families;
use prometheus::{IntCounter, IntCounterVec, IntGauge};

/// The account events' handles.
#[derive(Clone)]
pub(crate) struct EventMetrics {
    /// WatchEvents streams open now.
    pub watchers: IntGauge,
    /// Events sent on WatchEvents streams.
    pub streamed: IntCounter,
    /// Events deleted by retention.
    pub pruned: IntCounter,
    /// Webhook deliveries by outcome.
    webhooks: IntCounterVec,
}

impl EventMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            watchers: f.gauge(
                "authd_events_watchers",
                "WatchEvents streams open now (at most AUTHD_EVENTS_MAX_WATCHERS).",
            ),
            streamed: f.counter(
                "authd_events_streamed_total",
                "Account events sent on WatchEvents streams.",
            ),
            pruned: f.counter(
                "authd_events_pruned_total",
                "Account events deleted by retention (AUTHD_EVENTS_RETENTION, AUTHD_EVENTS_MAX).",
            ),
            webhooks: f.counter_vec(
                "authd_webhook_deliveries_total",
                "Webhook deliveries by outcome: delivered (a 2xx answer), failed (any other \
                 answer, or none; retried), skipped (an event the endpoint does not want).",
                &["outcome"],
            ),
        }
    }

    /// Counts `n` webhook deliveries that came to `outcome`.
    pub fn webhook(&self, outcome: &'static str, n: u64) {
        self.webhooks.with_label_values(&[outcome]).inc_by(n);
    }
}
