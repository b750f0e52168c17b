//! The rate-limit metrics: what the tier decided per request and per rule, its
//! Redis calls, and the in-process limiter that decides while Redis fails.
//!
//! The outcomes are resolved here once; the rules' labels are resolved by the
//! limiter when it is built. This file must not import `ratelimit`.

use super::Families;
use prometheus::{Histogram, IntCounter, IntCounterVec, IntGauge};

/// One Redis round trip: 50 µs to 1 s (calls time out after `AUTHD_REDIS_TIMEOUT`).
const REDIS_BUCKETS: &[f64] = &[
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// The rate limiter.
pub(crate) struct RateLimitMetrics {
    /// Requests the tier decided, by what they were told (one per request).
    pub admitted: IntCounter,
    pub refused: IntCounter,
    pub unavailable: IntCounter,
    /// Refused requests, by each rule that refused them (resolved per rule).
    pub refusals: IntCounterVec,
    pub decisions: IntCounterVec,
    pub redis_duration: Histogram,
    pub redis_errors: IntCounterVec,
    pub fallback_active: IntGauge,
    pub local_keys: IntGauge,
    pub local_overflowed: IntCounter,
    /// Envoy's rate limit service: descriptors decided, by domain, rule and outcome
    /// (resolved per rule of the file when it is loaded).
    pub descriptor_decisions: IntCounterVec,
    /// ShouldRateLimit answers, by overall code.
    pub service_answers: IntCounterVec,
    /// Reads of the rules file that found a new content, by outcome.
    pub rules_reloads: IntCounterVec,
    pub rules_loaded_at: IntGauge,
    pub rules_digest: IntGauge,
    pub rules_file_refused: IntGauge,
}

impl RateLimitMetrics {
    pub(super) fn new(f: &Families) -> Self {
        let requests = f.counter_vec(
            "authd_ratelimit_requests_total",
            "Requests the rate-limit tier decided (those at least one rule applies to), by \
             outcome: admitted (every rule had room), refused (RESOURCE_EXHAUSTED), unavailable \
             (UNAVAILABLE: Redis failed in fail-closed mode).",
            &["outcome"],
        );
        Self {
            admitted: requests.with_label_values(&["admitted"]),
            refused: requests.with_label_values(&["refused"]),
            unavailable: requests.with_label_values(&["unavailable"]),
            refusals: f.counter_vec(
                "authd_ratelimit_refusals_total",
                "Requests refused by the rate-limit tier, by rule: a request two rules refused \
                 counts once under each (so the sum over rules can exceed the refused requests).",
                &["rule"],
            ),
            decisions: f.counter_vec(
                "authd_ratelimit_decisions_total",
                "Rule evaluations, by rule and outcome: each request counts once under every rule \
                 that applies to it (allowed: that rule had room, even if another rule refused the \
                 request; refused: that rule refused it; unavailable: Redis failed in fail-closed \
                 mode). Requests admitted or refused: authd_ratelimit_requests_total.",
                &["rule", "outcome"],
            ),
            redis_duration: f.histogram(
                "authd_ratelimit_redis_duration_seconds",
                "Time of one Redis rate-limit decision (one script call), failures included.",
                REDIS_BUCKETS,
            ),
            redis_errors: f.counter_vec(
                "authd_ratelimit_redis_errors_total",
                "Redis rate-limit calls that failed, by kind (timeout, error, not_connected, \
                 bad_reply).",
                &["kind"],
            ),
            local_keys: f.gauge(
                "authd_ratelimit_local_keys",
                "Keys the in-process limiter tracks now (at most AUTHD_RATE_LIMIT_MAX_KEYS, plus one \
                 overflow log per rule).",
            ),
            local_overflowed: f.counter(
                "authd_ratelimit_local_overflow_total",
                "Requests the in-process limiter counted in a rule's shared overflow log because \
                 AUTHD_RATE_LIMIT_MAX_KEYS keys were tracked already.",
            ),
            descriptor_decisions: f.counter_vec(
                "authd_ratelimit_descriptor_decisions_total",
                "Descriptors of ShouldRateLimit requests that met a limited rule of the rules \
                 file, by domain, rule (its name in the file, never a value from a request) and \
                 outcome: ok (the rule had room), over_limit (the rule refused), \
                 shadow_over_limit (the rule would have refused; in shadow mode it did not), \
                 unavailable (Redis failed in fail-closed mode).",
                &["domain", "rule", "outcome"],
            ),
            service_answers: f.counter_vec(
                "authd_ratelimit_service_answers_total",
                "ShouldRateLimit answers, by code: ok, over_limit, invalid (INVALID_ARGUMENT: \
                 too many descriptors or entries, values too long), unavailable.",
                &["code"],
            ),
            rules_reloads: f.counter_vec(
                "authd_ratelimit_rules_reloads_total",
                "Reads of AUTHD_RATE_LIMIT_RULES_FILE that found a new content, by outcome: ok \
                 (now in force) or error (refused: the rules in force stay; the log says why).",
                &["outcome"],
            ),
            rules_loaded_at: f.gauge(
                "authd_ratelimit_rules_loaded_timestamp_seconds",
                "When the rules in force were read from AUTHD_RATE_LIMIT_RULES_FILE (Unix time).",
            ),
            rules_digest: f.gauge(
                "authd_ratelimit_rules_digest",
                "The first 48 bits of the SHA-256 of the rules file in force, as an integer: \
                 replicas showing different values enforce different rules.",
            ),
            rules_file_refused: f.gauge(
                "authd_ratelimit_rules_file_refused",
                "1 while the rules file's current content is refused (the previous rules stay \
                 in force), else 0.",
            ),
            fallback_active: f.gauge(
                "authd_ratelimit_fallback_active",
                "1 while Redis is configured but failing and the fallback decides (local \
                 limiter, or refusals in fail-closed mode); else 0.",
            ),
        }
    }
}
