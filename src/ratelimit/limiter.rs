//! The [`RateLimiter`]: decides whether a request may pass, on Redis while it
//! answers and in process otherwise, with each switch logged once (the flag and its
//! prober, which brings Redis back after an outage, are the connection's:
//! `crate::redis`); and its counters.
//!
//! It must not queue or delay a request: a decision is one Redis call bounded by
//! `AUTHD_REDIS_TIMEOUT`, or a few in-memory operations. Time for the in-process
//! logs comes from a `crate::clock::Clock`, so their window logic is tested with one
//! the test controls; Redis keeps its own (`TIME`).

use super::{
    Check, FailureMode, KeyKind, Outcome, Quota, RateLimits, Settings, keys::Keys, local, redis,
    rules::GRANT_METHODS,
};
use crate::{
    clock::{Clock, SystemClock},
    error::{Error, QuotaViolation},
    metrics::Metrics,
    redis::{CONNECT_TIMEOUT, Health, RedisFailure},
};
use prometheus::{Histogram, IntCounter};
use std::{
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Instant,
};

/// Which backend decides right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// No rules are configured: nothing is limited.
    Off,
    /// No Redis is configured: the in-process limiter, per replica.
    Local,
    /// Redis: limits are global across replicas.
    Redis,
    /// Redis is configured but fails: the local limiter (fail-open) or refusals
    /// (fail-closed) until it answers again.
    Degraded,
}

/// Counters of the limiter, for tests and tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimitStats {
    pub backend: Backend,
    /// Decisions taken by Redis.
    pub redis_decisions: u64,
    /// Decisions taken by the in-process limiter.
    pub local_decisions: u64,
    /// Requests refused with RESOURCE_EXHAUSTED.
    pub refused: u64,
    /// Requests refused with UNAVAILABLE because Redis failed (fail-closed).
    pub unavailable: u64,
    /// Redis calls that failed or timed out.
    pub redis_failures: u64,
}

#[derive(Default)]
struct Counters {
    redis_decisions: AtomicU64,
    local_decisions: AtomicU64,
    refused: AtomicU64,
    unavailable: AtomicU64,
    redis_failures: AtomicU64,
}

/// The Redis backend and whether it currently decides.
pub(crate) struct RedisTier {
    limiter: redis::RedisLimiter,
    /// The connection's flag, down from a failed call (of any user of the connection)
    /// until a probe succeeds: requests meanwhile do not call Redis at all, so an
    /// outage costs at most one timeout, not one per request.
    health: Arc<Health>,
}

/// The decision counters of one rule (`authd_ratelimit_decisions_total`).
struct RuleCounters {
    /// The rule had room (whether or not another rule refused the request).
    allowed: IntCounter,
    /// The rule refused the request.
    refused: IntCounter,
    /// Redis failed in fail-closed mode: no decision, the request was refused.
    unavailable: IntCounter,
    /// The rule refused the request (`authd_ratelimit_refusals_total`).
    refusals: IntCounter,
}

/// authd's own RPC rules in force and what is built from them, replaced whole when
/// the rules file's `authd:` section changes (`super::reload`).
struct RuleSet {
    rules: RateLimits,
    keys: Keys,
    /// One per rule, in the order of [`RateLimits::rules`].
    counters: Vec<RuleCounters>,
}

/// The checks of one request, with the rules they were planned on: a reload between
/// planning and deciding cannot mix two sets of rules.
pub(crate) struct Planned {
    set: Arc<RuleSet>,
    checks: Vec<Check>,
}

impl Planned {
    pub(crate) fn is_empty(&self) -> bool {
        self.checks.is_empty()
    }
}

/// The limiter's metric handles, resolved when it is built.
struct LimiterMetrics {
    /// The per-rule families, resolved for each set of rules.
    decisions: prometheus::IntCounterVec,
    refusals: prometheus::IntCounterVec,
    /// Requests, by what they were told (`authd_ratelimit_requests_total`).
    admitted: IntCounter,
    refused: IntCounter,
    unavailable: IntCounter,
    redis_duration: Histogram,
    redis_timeout: IntCounter,
    redis_error: IntCounter,
    redis_not_connected: IntCounter,
    redis_bad_reply: IntCounter,
}

impl LimiterMetrics {
    fn new(metrics: &Metrics) -> Self {
        let m = &metrics.rate_limit;
        let error = |kind| m.redis_errors.with_label_values(&[kind]);
        Self {
            decisions: m.decisions.clone(),
            refusals: m.refusals.clone(),
            admitted: m.admitted.clone(),
            refused: m.refused.clone(),
            unavailable: m.unavailable.clone(),
            redis_duration: m.redis_duration.clone(),
            redis_timeout: error("timeout"),
            redis_error: error("error"),
            redis_not_connected: error("not_connected"),
            redis_bad_reply: error("bad_reply"),
        }
    }

    fn rule_counters(&self, rules: &RateLimits) -> Vec<RuleCounters> {
        (rules.rules().iter())
            .map(|rule| {
                let rule = rule.to_string();
                let counter =
                    |outcome| (self.decisions).with_label_values(&[rule.as_str(), outcome]);
                RuleCounters {
                    allowed: counter("allowed"),
                    refused: counter("refused"),
                    unavailable: counter("unavailable"),
                    refusals: self.refusals.with_label_values(&[rule.as_str()]),
                }
            })
            .collect()
    }

    fn redis_failed(&self, why: &RedisFailure) {
        match why {
            RedisFailure::NotConnected | RedisFailure::Down => &self.redis_not_connected,
            RedisFailure::ConnectTimeout(_) | RedisFailure::Timeout(_) => &self.redis_timeout,
            RedisFailure::Redis(_) => &self.redis_error,
            RedisFailure::BadReply(_) => &self.redis_bad_reply,
        }
        .inc();
    }
}

/// Decides whether a request may pass. Shared (in an `Arc`) by every clone of the
/// layer.
pub struct RateLimiter {
    set: arc_swap::ArcSwap<RuleSet>,
    prefix: String,
    /// Envoy's rate limit service decides on this limiter too (`super::service`).
    descriptors: bool,
    failure: FailureMode,
    clock: Arc<dyn Clock>,
    local: local::LocalLimiter,
    redis: Option<RedisTier>,
    counters: Counters,
    metrics: LimiterMetrics,
}

impl RateLimiter {
    pub(crate) fn new(
        settings: Settings,
        redis: Option<RedisTier>,
        clock: Arc<dyn Clock>,
        metrics: &Metrics,
    ) -> Self {
        if let Some(tier) = &redis {
            // Read when scraped, so the gauge always says what the flag says.
            let (health, gauge) = (
                tier.health.clone(),
                metrics.rate_limit.fallback_active.clone(),
            );
            metrics.on_scrape(move || gauge.set(i64::from(!health.is_up())));
        }
        let local = local::LocalLimiter::new(
            settings.max_local_keys,
            local::LocalMetrics {
                keys: metrics.rate_limit.local_keys.clone(),
                overflowed: metrics.rate_limit.local_overflowed.clone(),
            },
        );
        let metrics = LimiterMetrics::new(metrics);
        let set = RuleSet {
            keys: Keys::new(&settings.rules, &settings.prefix),
            counters: metrics.rule_counters(&settings.rules),
            rules: settings.rules,
        };
        RateLimiter {
            set: arc_swap::ArcSwap::from_pointee(set),
            prefix: settings.prefix,
            descriptors: settings.descriptors,
            failure: settings.failure,
            clock,
            local,
            redis,
            counters: Counters::default(),
            metrics,
        }
    }

    /// Builds the limiter. With Redis configured it tries to connect once (at most
    /// `CONNECT_TIMEOUT`); if that fails it starts degraded and the connection's
    /// prober keeps trying, so a Redis outage never stops authd from starting.
    pub async fn start(settings: Settings, metrics: &Metrics) -> anyhow::Result<Arc<Self>> {
        let redis = match &settings.redis {
            Some(shared) if !settings.rules.is_empty() || settings.descriptors => Some(RedisTier {
                limiter: redis::RedisLimiter::new(shared.clone(), settings.redis_timeout),
                health: shared.health().clone(),
            }),
            _ => None,
        };
        let limiter = Arc::new(RateLimiter::new(
            settings.clone(),
            redis,
            settings
                .clock
                .clone()
                .unwrap_or_else(|| Arc::new(SystemClock)),
            metrics,
        ));
        match &limiter.redis {
            None if limiter.rules().is_empty() && !settings.descriptors => {
                if settings.redis.is_some() {
                    tracing::info!(
                        "AUTHD_REDIS_URL is set but there are no rate limits: only the login \
                         throttle uses it"
                    );
                }
            }
            None => tracing::info!(
                rules = %limiter.rules(),
                "rate limits enforced per replica by the in-process limiter (no AUTHD_REDIS_URL)"
            ),
            Some(tier) => {
                match tier.limiter.redis().start(CONNECT_TIMEOUT).await {
                    Ok(()) => {
                        tracing::info!(
                            rules = %limiter.rules(),
                            redis = %tier.limiter.url(),
                            "rate limits enforced globally through Redis"
                        );
                    }
                    Err(why) => tracing::warn!(
                        rules = %limiter.rules(),
                        redis = %tier.limiter.url(),
                        error = %why,
                        "Redis does not answer at start: {} until it does",
                        limiter.degraded_behaviour()
                    ),
                }
                let url = tier.limiter.url().clone();
                tier.health.on_recovery(move || {
                    tracing::info!(
                        redis = %url,
                        "Redis answers again: rate limits are global across replicas again"
                    );
                });
            }
        }
        Ok(limiter)
    }

    pub fn stats(&self) -> RateLimitStats {
        let c = &self.counters;
        RateLimitStats {
            backend: self.backend(),
            redis_decisions: c.redis_decisions.load(Ordering::Relaxed),
            local_decisions: c.local_decisions.load(Ordering::Relaxed),
            refused: c.refused.load(Ordering::Relaxed),
            unavailable: c.unavailable.load(Ordering::Relaxed),
            redis_failures: c.redis_failures.load(Ordering::Relaxed),
        }
    }

    pub fn backend(&self) -> Backend {
        match &self.redis {
            _ if self.rules().is_empty() && !self.descriptors => Backend::Off,
            None => Backend::Local,
            Some(tier) if tier.health.is_up() => Backend::Redis,
            Some(_) => Backend::Degraded,
        }
    }

    fn degraded_behaviour(&self) -> &'static str {
        match self.failure {
            FailureMode::Open => "enforcing the rate limits per replica with the local limiter",
            FailureMode::Closed => {
                "refusing rate-limited requests with UNAVAILABLE (AUTHD_RATE_LIMIT_FAILURE=closed)"
            }
        }
    }

    /// The checks a request must pass: one per matching rule that yields a key.
    /// Empty when no rule applies (the request is not counted at all).
    pub(crate) fn plan(
        &self,
        method: &str,
        headers: &http::HeaderMap,
        client: Option<IpAddr>,
        identity: Option<&crate::rpc::ClientIdentity>,
    ) -> Planned {
        self.plan_grant(method, headers, client, identity, None)
    }

    /// As [`plan`](Self::plan), for a grant that names `client_id` (which a
    /// `client-id` rule counts).
    pub(crate) fn plan_grant(
        &self,
        method: &str,
        headers: &http::HeaderMap,
        client: Option<IpAddr>,
        identity: Option<&crate::rpc::ClientIdentity>,
        client_id: Option<&str>,
    ) -> Planned {
        let set = self.set.load_full();
        let checks = (set.keys).plan(&set.rules, method, headers, client, identity, client_id);
        Planned { set, checks }
    }

    /// Whether a request of `method` is decided by its handler rather than before
    /// it (`super::deferred`): it is a grant, and a rule in force counts the client
    /// id it names.
    pub(crate) fn defers(&self, method: &str) -> bool {
        GRANT_METHODS.contains(&method)
            && (self.set.load().rules.rules().iter())
                .any(|rule| rule.key == KeyKind::ClientId && rule.matches(method))
    }

    /// authd's own RPC rules in force now.
    pub(crate) fn rules(&self) -> RateLimits {
        self.set.load().rules.clone()
    }

    /// Puts `rules` in force for authd's own RPCs (the rules file's `authd:` section
    /// changed). Counts live under keys made of a rule's method, key kind and window
    /// (`keys`), so a rule that did not change keeps them.
    pub(crate) fn replace_rules(&self, rules: RateLimits) {
        let counters = self.metrics.rule_counters(&rules);
        let keys = Keys::new(&rules, &self.prefix);
        tracing::info!(rules = %rules, "authd's own rate limits replaced");
        self.set.store(Arc::new(RuleSet {
            rules,
            keys,
            counters,
        }));
    }

    /// Decides `checks` (from [`plan`](Self::plan), not empty): the quota left, or
    /// RESOURCE_EXHAUSTED (or UNAVAILABLE when Redis fails in fail-closed mode).
    pub(crate) async fn decide(&self, planned: &Planned) -> Result<Quota, Error> {
        let mut span = crate::otel::child("ratelimit");
        span.set("ratelimit.rules", planned.checks.len() as i64);
        let verdict = self.decide_in(planned, &mut span).await;
        span.set(
            "ratelimit.outcome",
            match &verdict {
                Ok(_) => "admitted",
                Err(Error::RateLimited { .. }) => "refused",
                Err(_) => "unavailable",
            },
        );
        verdict
    }

    async fn decide_in(
        &self,
        planned: &Planned,
        span: &mut crate::otel::Child,
    ) -> Result<Quota, Error> {
        let outcome = match self.outcome(&planned.checks, span).await {
            Ok(outcome) => outcome,
            Err(err) => {
                self.metrics.unavailable.inc();
                for check in &planned.checks {
                    planned.set.counters[check.rule].unavailable.inc();
                }
                return Err(err);
            }
        };
        self.verdict(planned, &outcome)
    }

    /// What the backend in use decides for `checks` (not empty), all or nothing;
    /// UNAVAILABLE when Redis fails in fail-closed mode. The caller says what the
    /// outcome means: authd's own RPCs ([`decide`](Self::decide)) or Envoy's
    /// descriptors (`super::service`).
    pub(crate) async fn outcome(
        &self,
        checks: &[Check],
        span: &mut crate::otel::Child,
    ) -> Result<Outcome, Error> {
        Ok(match &self.redis {
            None => {
                span.set("ratelimit.backend", "local");
                self.decide_locally(checks)
            }
            Some(tier) if tier.health.is_up() => {
                span.set("ratelimit.backend", "redis");
                // Real time: the Redis call's latency, a metric.
                let started = Instant::now();
                let decided = tier.limiter.decide(checks).await;
                (self.metrics.redis_duration).observe(started.elapsed().as_secs_f64());
                match decided {
                    Ok(outcome) => {
                        self.counters
                            .redis_decisions
                            .fetch_add(1, Ordering::Relaxed);
                        outcome
                    }
                    Err(why) => {
                        self.counters.redis_failures.fetch_add(1, Ordering::Relaxed);
                        self.metrics.redis_failed(&why);
                        if tier.health.mark_down() {
                            tracing::warn!(
                                redis = %tier.limiter.url(),
                                error = %why,
                                "Redis rate limiting failed: {} until Redis answers again",
                                self.degraded_behaviour()
                            );
                        }
                        span.fail("redis failed");
                        span.set("ratelimit.fallback", true);
                        self.decide_degraded(checks)?
                    }
                }
            }
            Some(_) => {
                span.set("ratelimit.backend", "fallback");
                self.decide_degraded(checks)?
            }
        })
    }

    fn decide_locally(&self, checks: &[Check]) -> Outcome {
        self.counters
            .local_decisions
            .fetch_add(1, Ordering::Relaxed);
        self.local.decide(checks, self.clock.now())
    }

    fn decide_degraded(&self, checks: &[Check]) -> Result<Outcome, Error> {
        match self.failure {
            FailureMode::Open => Ok(self.decide_locally(checks)),
            FailureMode::Closed => {
                // The caller counts the refusal in its metrics (per rule, per request).
                self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
                Err(Error::Unavailable(
                    "rate limits cannot be checked while Redis does not answer".into(),
                ))
            }
        }
    }

    /// Turns a backend's outcome into what the client is told.
    fn verdict(&self, planned: &Planned, outcome: &Outcome) -> Result<Quota, Error> {
        let pairs = planned.checks.iter().zip(&outcome.states);
        for (check, state) in pairs.clone() {
            let counters = &planned.set.counters[check.rule];
            // A refused request leaves at 0 remaining exactly the rules that refused it.
            if outcome.allowed || state.remaining > 0 {
                counters.allowed.inc();
            } else {
                counters.refused.inc();
                counters.refusals.inc();
            }
        }
        if outcome.allowed {
            self.metrics.admitted.inc();
            // Report the rule closest to refusing; on a tie, the one that frees last.
            let (check, state) = pairs
                .min_by_key(|(_, s)| (s.remaining, std::cmp::Reverse(s.reset)))
                .expect("a decision covers at least one rule");
            return Ok(Quota {
                limit: check.limit,
                remaining: state.remaining,
                reset: state.reset,
            });
        }
        self.counters.refused.fetch_add(1, Ordering::Relaxed);
        self.metrics.refused.inc();
        let refusing: Vec<_> = pairs.filter(|(_, s)| s.remaining == 0).collect();
        // Every refusing rule must have a free slot before a retry can pass.
        let (check, state) = refusing
            .iter()
            .max_by_key(|(_, s)| s.reset)
            .copied()
            .expect("a refusal names at least one rule");
        Err(Error::RateLimited {
            violations: refusing
                .iter()
                .map(|(c, _)| {
                    let rule = &planned.set.rules.rules()[c.rule];
                    QuotaViolation {
                        subject: rule.to_string(),
                        description: rule.describe(),
                    }
                })
                .collect(),
            limit: check.limit,
            retry_after: state.reset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use std::time::Duration;

    fn limiter(rules: &str, clock: Arc<dyn Clock>) -> RateLimiter {
        let settings = Settings {
            rules: rules.parse().unwrap(),
            redis: None,
            prefix: "p".into(),
            redis_timeout: Duration::from_millis(50),
            failure: FailureMode::Open,
            max_local_keys: 1000,
            descriptors: false,
            clock: None,
        };
        RateLimiter::new(settings, None, clock, &Metrics::new())
    }

    #[tokio::test]
    async fn a_refusal_names_every_refusing_rule_and_waits_for_the_last() {
        let l = limiter(
            "Login:peer=1/1s,Login:global=1/1m,Login:header:x-client-id=5/1s",
            Arc::new(SystemClock),
        );
        let map = http::HeaderMap::new();
        let checks = l.plan("Login", &map, Some("10.0.0.7".parse().unwrap()), None);
        let quota = l.decide(&checks).await.unwrap();
        assert_eq!(quota.remaining, 0);
        assert_eq!(quota.limit, 1);
        match l.decide(&checks).await {
            Err(Error::RateLimited {
                violations,
                limit,
                retry_after,
            }) => {
                let subjects: Vec<_> = violations.iter().map(|v| v.subject.as_str()).collect();
                assert_eq!(subjects, ["Login:peer=1/1s", "Login:global=1/1m"]);
                assert_eq!(limit, 1);
                assert!(retry_after > Duration::from_secs(59), "{retry_after:?}");
                assert_eq!(
                    violations[1].description,
                    "at most 1 Login requests per 1m in total"
                );
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        assert_eq!(l.stats().refused, 1);
        assert_eq!(l.stats().local_decisions, 2);
    }

    #[tokio::test]
    async fn the_window_slides_with_the_clock() {
        // 50 at t=0; none at 1.5 s (a fixed window might have reset by then); 50 again
        // once the first burst has left the 2 s window. The clock moves only when told.
        let clock = Arc::new(ManualClock::new());
        let l = limiter("Login:global=50/2s", clock.clone());
        let checks = l.plan("Login", &http::HeaderMap::new(), None, None);
        let passed = |n: usize| {
            let l = &l;
            let checks = &checks;
            async move {
                let mut ok = 0;
                for _ in 0..n {
                    ok += usize::from(l.decide(checks).await.is_ok());
                }
                ok
            }
        };
        assert_eq!(passed(60).await, 50);
        clock.advance(Duration::from_millis(1500));
        assert_eq!(passed(5).await, 0, "no new slot 1.5 s into a 2 s window");
        clock.advance(Duration::from_millis(499));
        assert_eq!(passed(1).await, 0, "the first burst is 1.999 s old");
        clock.advance(Duration::from_millis(1));
        assert_eq!(
            passed(60).await,
            50,
            "the whole first burst has left the window"
        );
        match l.decide(&checks).await {
            Err(Error::RateLimited { retry_after, .. }) => {
                assert_eq!(retry_after, Duration::from_secs(2))
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
