//! The standard endpoints' metrics: introspections and revocations by outcome.
//!
//! The labels take only fixed values: for introspection `active`, `inactive`,
//! `unauthorized` (no or a wrong client credential) and `bad_request`; for
//! revocation `ended` (a session ended), `nothing` (the token named no live
//! session: unknown, malformed, expired, or a session already ended) and `failed`
//! (the store did not answer).

use super::Families;
use prometheus::IntCounterVec;

/// The standard endpoints' handles.
#[derive(Clone)]
pub(crate) struct OidcMetrics {
    introspections: IntCounterVec,
    revocations: IntCounterVec,
}

impl OidcMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            introspections: f.counter_vec(
                "authd_introspections_total",
                "Token introspection requests (RFC 7662), by outcome (active, inactive, \
                 unauthorized, bad_request).",
                &["outcome"],
            ),
            revocations: f.counter_vec(
                "authd_token_revocations_total",
                "Token revocation requests (RFC 7009), by outcome (ended, nothing, failed).",
                &["outcome"],
            ),
        }
    }

    /// Counts one introspection.
    pub fn introspection(&self, outcome: &'static str) {
        self.introspections.with_label_values(&[outcome]).inc();
    }

    /// Counts one revocation.
    pub fn revocation(&self, outcome: &'static str) {
        self.revocations.with_label_values(&[outcome]).inc();
    }
}
