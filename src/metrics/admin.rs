//! The admin API's metrics: its calls by RPC and status code, the accounts it
//! disabled and deleted, the records it imported by outcome, and the pauses of
//! imports giving way to logins.
//!
//! The RPC label takes only the admin service's method names (resolved by the
//! service, never from what a client sends) and the code label the 17 codes.

use super::{CODE_NAMES, Families};
use prometheus::{IntCounter, IntCounterVec};

/// The admin API's handles.
#[derive(Clone)]
pub(crate) struct AdminMetrics {
    requests: IntCounterVec,
    /// Accounts disabled (a DisableUser that changed one).
    pub disabled: IntCounter,
    /// Accounts deleted.
    pub deleted: IntCounter,
    imported: IntCounterVec,
    /// Pauses of ImportUsers after a batch, giving way to logins.
    pub import_paused: IntCounter,
    /// Service accounts created, disabled and deleted.
    pub service_accounts_created: IntCounter,
    pub service_accounts_disabled: IntCounter,
    pub service_accounts_deleted: IntCounter,
}

impl AdminMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            requests: f.counter_vec(
                "authd_admin_requests_total",
                "Admin API calls answered (on AUTHD_ADMIN_LISTEN), by RPC and status code.",
                &["rpc", "code"],
            ),
            disabled: f.counter(
                "authd_admin_users_disabled_total",
                "Accounts an administrator disabled.",
            ),
            deleted: f.counter(
                "authd_admin_users_deleted_total",
                "Accounts an administrator deleted.",
            ),
            imported: f.counter_vec(
                "authd_admin_imported_records_total",
                "Records of ImportUsers answered, by outcome (created, unchanged, skipped, \
                 refused).",
                &["outcome"],
            ),
            import_paused: f.counter(
                "authd_admin_import_pauses_total",
                "Pauses of ImportUsers after a batch while the hash pool had work: the \
                 import giving way to logins.",
            ),
            service_accounts_created: f.counter(
                "authd_admin_service_accounts_created_total",
                "Service accounts an administrator created.",
            ),
            service_accounts_disabled: f.counter(
                "authd_admin_service_accounts_disabled_total",
                "Service accounts an administrator disabled.",
            ),
            service_accounts_deleted: f.counter(
                "authd_admin_service_accounts_deleted_total",
                "Service accounts an administrator deleted.",
            ),
        }
    }

    /// Counts `n` imported records answered `outcome` (created, unchanged, skipped,
    /// refused).
    pub fn imported(&self, outcome: &'static str, n: u64) {
        self.imported.with_label_values(&[outcome]).inc_by(n);
    }

    /// Counts one call of `rpc` (a method name of the admin service) answered `code`.
    pub fn request(&self, rpc: &'static str, code: tonic::Code) {
        let name = CODE_NAMES.get(code as usize).copied().unwrap_or("UNKNOWN");
        self.requests.with_label_values(&[rpc, name]).inc();
    }
}
