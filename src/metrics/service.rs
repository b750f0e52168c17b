//! The service accounts' metrics: the tokens they were granted and refused, by
//! grant and outcome (docs/service-accounts.md).
//!
//! Both labels take values from fixed sets resolved here once.

use super::Families;
use prometheus::{IntCounter, IntCounterVec};

/// The grants a service may ask for, as the `grant` label names them.
pub(crate) const GRANTS: [&str; 2] = ["client_credentials", "token_exchange"];
/// A grant's outcomes, as the `outcome` label names them.
pub(crate) const GRANT_OUTCOMES: [&str; 5] =
    ["ok", "invalid_client", "throttled", "not_allowed", "error"];

impl GrantOutcome {
    /// Its label, as the metric and the audit trail name it.
    pub(crate) fn label(self) -> &'static str {
        GRANT_OUTCOMES[self as usize]
    }
}

/// The outcome of one grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantOutcome {
    Ok = 0,
    InvalidClient = 1,
    Throttled = 2,
    NotAllowed = 3,
    Error = 4,
}

/// The service accounts' handles.
#[derive(Clone)]
pub(crate) struct ServiceMetrics {
    /// By grant (the order of [`GRANTS`]), then outcome (of [`GRANT_OUTCOMES`]).
    grants: [[IntCounter; GRANT_OUTCOMES.len()]; GRANTS.len()],
    /// Fetches of external issuers' keys, by outcome (ok, error).
    pub issuer_fetches: IntCounterVec,
    /// Grants' reads of their account: from the replica's copy, from the database.
    reads: [IntCounter; 2],
}

impl ServiceMetrics {
    pub(super) fn new(f: &Families) -> Self {
        let family = f.counter_vec(
            "authd_service_grants_total",
            "Tokens service accounts asked for (grant: client_credentials, token_exchange), \
             by outcome (ok, invalid_client, throttled, not_allowed, error).",
            &["grant", "outcome"],
        );
        Self {
            grants: GRANTS.map(|g| GRANT_OUTCOMES.map(|o| family.with_label_values(&[g, o]))),
            issuer_fetches: f.counter_vec(
                "authd_jwt_issuer_fetches_total",
                "Fetches of an external JWT issuer's discovery document and keys, by outcome \
                 (ok, error).",
                &["outcome"],
            ),
            reads: {
                let family = f.counter_vec(
                    "authd_service_account_reads_total",
                    "Service accounts read by grants, by source: cache (the replica's copy, \
                     read less than 10 s before and changed by no cutoff since) or database.",
                    &["source"],
                );
                ["cache", "database"].map(|s| family.with_label_values(&[s]))
            },
        }
    }

    /// Counts a grant's read of its account, from the cache or not.
    pub fn read(&self, cached: bool) {
        self.reads[usize::from(!cached)].inc();
    }

    /// Counts one grant of `grant` (an index of [`GRANTS`]) answered `outcome`.
    pub fn grant(&self, grant: usize, outcome: GrantOutcome) {
        if let Some(row) = self.grants.get(grant) {
            row[outcome as usize].inc();
        }
    }
}
