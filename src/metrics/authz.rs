//! External authorization's metrics: the decisions of Envoy's Check (`grpc`) and of
//! the HTTP forward-auth endpoint (`http`), by outcome and reason.
//!
//! The labels take only fixed values: the two APIs, `allow` or `deny`, and the
//! reasons external authorization names (`valid`, `anonymous`, a token error's
//! label, `missing_token`, `second_factor_required`, `bad_policy`).

use super::Families;
use prometheus::IntCounterVec;

/// External authorization's handles.
#[derive(Clone)]
pub(crate) struct AuthzMetrics {
    decisions: IntCounterVec,
}

impl AuthzMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            decisions: f.counter_vec(
                "authd_authz_decisions_total",
                "External authorization decisions, by API (grpc: Envoy's Check; http: \
                 forward-auth), outcome (allow, deny) and reason.",
                &["api", "outcome", "reason"],
            ),
        }
    }

    /// Counts one decision.
    pub fn decision(&self, api: &'static str, outcome: &'static str, reason: &'static str) {
        self.decisions
            .with_label_values(&[api, outcome, reason])
            .inc();
    }
}
