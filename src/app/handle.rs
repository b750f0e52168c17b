//! [`AppHandle`]: a cheap handle on a running application's internals, for the
//! integration tests and tools: its addresses, its counters, reloads on demand.

use super::{core::Core, ports::Addresses};
use crate::{
    accounts::Accounts,
    layers::{admission::Admission, pushback::Pushback},
    metrics::Metrics,
    password::PoolSnapshot,
    ratelimit::{self, RateLimitStats, RateLimiter},
    store::WriterSnapshot,
    token::keyfile::KeyFile,
};
use std::{net::SocketAddr, sync::Arc};

/// A cheap handle on a running application's internals, for tests and tools.
#[derive(Clone)]
pub struct AppHandle {
    accounts: Arc<Accounts>,
    admission: Arc<Admission>,
    pushback: Arc<Pushback>,
    rate_limiter: Arc<RateLimiter>,
    rate_limit_rules: Option<Arc<ratelimit::LiveRules>>,
    metrics: Arc<Metrics>,
    key_file: Option<Arc<KeyFile>>,
    addresses: Addresses,
}

impl AppHandle {
    pub(super) fn new(core: &Core, addresses: Addresses) -> Self {
        Self {
            accounts: core.accounts.clone(),
            admission: core.admission.clone(),
            pushback: core.pushback.clone(),
            rate_limiter: core.rate_limiter.clone(),
            rate_limit_rules: core.rate_limit_rules.clone(),
            metrics: core.metrics.clone(),
            key_file: core.key_file.clone(),
            addresses,
        }
    }
}

impl AppHandle {
    /// Where `/forward-auth` answers (`None` while `AUTHD_FORWARD_AUTH_LISTEN` is off).
    pub fn forward_auth_addr(&self) -> Option<SocketAddr> {
        self.addresses.forward_auth
    }

    /// Where the admin API answers (`None` while `AUTHD_ADMIN_LISTEN` is off).
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.addresses.admin
    }

    /// Re-reads `AUTHD_TOKEN_KEYS_FILE` now, as the periodic reload does: `Ok(true)` when
    /// a new ring is in use, `Ok(false)` when the file is unchanged (or no file is
    /// configured), the reason when the file was refused and the old ring kept.
    pub async fn reload_token_keys(&self) -> Result<bool, String> {
        match self.key_file.clone() {
            Some(file) => file.check_now().await,
            None => Ok(false),
        }
    }

    /// Re-reads `AUTHD_RATE_LIMIT_RULES_FILE` now, as the periodic reload does:
    /// `Ok(true)` when new rules are in force, `Ok(false)` when the file is unchanged
    /// (or none is configured), the reason when it was refused and the rules kept.
    pub async fn reload_rate_limit_rules(&self) -> Result<bool, String> {
        match self.rate_limit_rules.clone() {
            Some(rules) => rules.check_now().await,
            None => Ok(false),
        }
    }

    /// Where `GET /metrics` answers (`None` when the endpoint is off).
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.addresses.metrics
    }

    /// Where the health-only port answers (`None` when it is off).
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.addresses.health
    }

    /// The application's metrics, as the endpoint would show them now.
    pub fn render_metrics(&self) -> String {
        self.metrics.render()
    }

    /// Counters of the password hashing pool.
    pub fn hash_stats(&self) -> PoolSnapshot {
        self.accounts.hasher().pool().stats()
    }

    /// The memory Argon2 work holds now (reserved in the memory budget), in KiB.
    pub fn hash_memory_in_use_kib(&self) -> u32 {
        self.accounts.hasher().pool().memory_budget().in_use_kib()
    }

    /// Hash jobs waiting for a hashing thread now.
    pub fn hash_queued(&self) -> usize {
        self.accounts.hasher().pool().queued()
    }

    /// Counters of the SQLite writer (`None` on other backends).
    pub fn writer_stats(&self) -> Option<WriterSnapshot> {
        self.accounts.store().writer_stats()
    }

    /// AuthService requests admitted and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.admission.in_flight()
    }

    /// AuthService requests open (being received or in flight) for one client.
    pub fn open_for(&self, client: std::net::IpAddr) -> u32 {
        self.admission.open_for(client)
    }

    /// Refused requests held on a timer before their answer, now.
    pub fn refusals_held(&self) -> u32 {
        self.pushback.held()
    }

    /// Counters of the rate limiter, and which backend decides now.
    pub fn rate_limit_stats(&self) -> RateLimitStats {
        self.rate_limiter.stats()
    }
}
