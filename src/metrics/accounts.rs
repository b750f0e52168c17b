//! The account metrics: logins by outcome and the login throttle, sessions
//! (started, refreshed, ended) and the revocation set that ValidateToken reads,
//! and tokens (issued, checked) with the keys that sign them.
//!
//! The outcomes and scopes of logins are resolved here once; the other labels
//! come from fixed sets in `accounts`, `throttle`, `revocation` and `token`,
//! which this file must not import.

use super::Families;
use prometheus::{Gauge, IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

/// Tokens issued and checked.
pub(crate) struct TokenMetrics {
    pub issued: IntCounter,
    pub validated: IntCounterVec,
    /// 1 for the key that signs now, by `kid` and `alg`.
    pub signing_key: IntGaugeVec,
    /// Re-reads of the token key file that found it changed, by outcome.
    pub key_reloads: IntCounterVec,
}

impl TokenMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            issued: f.counter("authd_tokens_issued_total", "Access tokens issued."),
            validated: f.counter_vec(
                "authd_tokens_validated_total",
                "Access tokens checked, by outcome (ok, or why it was refused).",
                &["outcome"],
            ),
            signing_key: f.gauge_vec(
                "authd_token_signing_key",
                "1 for the key that signs new tokens now, by kid and alg (HS256 or EdDSA).",
                &["kid", "alg"],
            ),
            key_reloads: f.counter_vec(
                "authd_token_keys_reloads_total",
                "Changes of AUTHD_TOKEN_KEYS_FILE seen while serving, by outcome (ok: the new \
                 ring is in use; error: the file was refused and the previous ring kept).",
                &["outcome"],
            ),
        }
    }
}

/// Sessions: started, refreshed, ended; the revocation set and its poller.
pub(crate) struct SessionMetrics {
    pub started: IntCounter,
    pub refreshed: IntCounter,
    pub ended: IntCounterVec,
    pub revoked: IntGauge,
    pub revocations_evicted: IntCounter,
    pub poll_errors: IntCounter,
    pub sync_age: Gauge,
}

impl SessionMetrics {
    pub(super) fn new(f: &Families) -> Self {
        Self {
            started: f.counter(
                "authd_sessions_started_total",
                "Sessions started (one per successful Login).",
            ),
            refreshed: f.counter(
                "authd_sessions_refreshed_total",
                "Refresh tokens rotated (a retried Refresh answered with the same token is not \
                 a second rotation).",
            ),
            ended: f.counter_vec(
                "authd_sessions_ended_total",
                "Sessions ended, by reason (logout, reuse: a rotated refresh token was presented \
                 again, password_change, expired: purged at their end without being ended, \
                 disabled: an administrator disabled the account, admin: an administrator \
                 ended it).",
                &["reason"],
            ),
            revoked: f.gauge(
                "authd_revoked_sessions",
                "Ended sessions this replica refuses access tokens of (kept until their last \
                 token expires).",
            ),
            revocations_evicted: f.counter(
                "authd_revocations_evicted_total",
                "Revoked sessions evicted because the set was full; tokens issued before the \
                 evicted end are refused from then on.",
            ),
            poll_errors: f.counter(
                "authd_revocation_poll_errors_total",
                "Polls for sessions ended on other replicas that failed (database unreachable).",
            ),
            sync_age: f.registered(
                Gauge::with_opts(prometheus::Opts::new(
                    "authd_revocation_sync_age_seconds",
                    "Seconds since this replica last read the sessions ended on every replica \
                     (read at scrape time; grows while the database is unreachable).",
                ))
                .expect("valid"),
            ),
        }
    }
}

/// Logins by outcome, and the login throttle (`throttle`).
#[derive(Clone)]
pub(crate) struct ThrottleMetrics {
    /// ok, failed, throttled.
    pub logins: [IntCounter; 3],
    /// Refusals by scope: client, account.
    pub refusals: [IntCounter; 2],
    pub redis_errors: IntCounter,
    pub fallback_active: IntGauge,
    pub local_entries: IntGauge,
    /// Attempts that waited for attempts in flight before their decision.
    pub waits: IntCounter,
}

impl ThrottleMetrics {
    pub(super) fn new(f: &Families) -> Self {
        let logins = f.counter_vec(
            "authd_logins_total",
            "Login attempts by outcome: ok, failed (wrong password or unknown username), \
             throttled (refused by the login throttle before any hashing).",
            &["outcome"],
        );
        let refusals = f.counter_vec(
            "authd_login_throttle_refusals_total",
            "Attempts the login throttle refused, by the count that refused them: client \
             (this client's failures for the username) or account (the username's failures \
             across clients).",
            &["scope"],
        );
        Self {
            logins: ["ok", "failed", "throttled"].map(|o| logins.with_label_values(&[o])),
            refusals: ["client", "account"].map(|s| refusals.with_label_values(&[s])),
            redis_errors: f.counter(
                "authd_login_throttle_redis_errors_total",
                "Login throttle calls to Redis that failed or timed out (the counts then \
                 fall back to this replica's, or refuse under AUTHD_RATE_LIMIT_FAILURE=closed).",
            ),
            fallback_active: f.gauge(
                "authd_login_throttle_fallback_active",
                "1 while the login throttle counts in process because Redis fails.",
            ),
            local_entries: f.gauge(
                "authd_login_throttle_local_entries",
                "Entries of the in-process login throttle (at most \
                 AUTHD_LOGIN_THROTTLE_MAX_ENTRIES).",
            ),
            waits: f.counter(
                "authd_login_throttle_waits_total",
                "Login attempts that waited for attempts in flight for the same username \
                 (which fill what the counts allow) to settle before being decided.",
            ),
        }
    }
}

/// The outcomes of a login attempt, as `authd_logins_total` labels them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoginOutcome {
    Ok = 0,
    Failed = 1,
    Throttled = 2,
}
