//! Rate limiting: the rules of `AUTHD_RATE_LIMITS`, the keys a request is counted
//! under, and the [`RateLimiter`] that decides, on Redis when one is configured and
//! in process otherwise.
//!
//! This module owns the rule syntax (`METHOD:KEY=LIMIT/WINDOW`, parsed once at the
//! edge so a bad rule stops the start), matching rules to a request, building the
//! keys, and choosing the backend: Redis while it answers, the local limiter (or a
//! refusal, in fail-closed mode) while it does not, with each switch logged once.
//! It must not queue or delay a request: a decision is one Redis call bounded by
//! `AUTHD_REDIS_TIMEOUT`, or a few in-memory operations. It knows nothing of health
//! or reflection: [`layer`] exempts them before asking.
//!
//! - [`layer`]: the tower Layer and Service that ask for a decision and answer.
//! - `redis`: the Lua script that decides for all matching rules in one round trip.
//! - `local`: the in-process sliding-window log, the same rules per replica.

pub mod layer;
mod local;
mod redis;

use crate::{
    error::{Error, QuotaViolation},
    metrics::Metrics,
};
use prometheus::{Histogram, IntCounter};
use std::{
    fmt,
    net::IpAddr,
    str::FromStr,
    sync::{
        Arc, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

pub use layer::RateLimitLayer;

/// The RPCs of `auth.v1.AuthService`: a rule naming anything else is a typo that
/// would silently never match, so it is refused (a unit test keeps this list in
/// step with the proto).
const RPCS: [&str; 3] = ["Register", "Login", "ValidateToken"];

/// The longest window a rule may have: the log of a window is kept in memory (or
/// in Redis) for that long.
const MAX_WINDOW: Duration = Duration::from_secs(24 * 3600);

/// How often, while Redis fails, a background task checks whether it answers again.
const PROBE_INTERVAL: Duration = Duration::from_millis(500);

/// How long connecting to Redis may take, at start and when probing. Off the
/// request path, so more generous than `AUTHD_REDIS_TIMEOUT`; a refused connection
/// fails at once, so only a black-holed Redis makes the start wait this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Header values longer than this, or with other characters than `[A-Za-z0-9._-]`,
/// are hashed into the key, so a client cannot make keys of arbitrary size or shape.
const MAX_RAW_HEADER_KEY: usize = 64;

/// What a rule counts requests by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// The client's IP address (or the first `x-forwarded-for` hop when trusted).
    Peer,
    /// Every request the rule matches, from anyone, on every replica sharing Redis.
    Global,
    /// The value of a request header, e.g. `x-client-id`; requests without the
    /// header are not counted by the rule.
    Header(http::HeaderName),
}

/// One rule: at most `limit` requests of `method` per `window` for each key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// The RPC name, or `None` for `*` (every method).
    method: Option<&'static str>,
    key: KeyKind,
    limit: u32,
    window: Duration,
}

impl Rule {
    pub fn limit(&self) -> u32 {
        self.limit
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    fn matches(&self, method: &str) -> bool {
        self.method.is_none_or(|m| m == method)
    }

    /// A sentence for `google.rpc.QuotaFailure`.
    fn describe(&self) -> String {
        let what = match self.method {
            Some(m) => format!("{m} requests"),
            None => "requests".to_owned(),
        };
        let per = match &self.key {
            KeyKind::Peer => " per client address".to_owned(),
            KeyKind::Global => " in total".to_owned(),
            KeyKind::Header(name) => format!(" per {name} value"),
        };
        format!(
            "at most {} {what} per {}{per}",
            self.limit,
            humantime::format_duration(self.window)
        )
    }

    /// The key part naming the rule: `Login:peer:1000`. The limit is left out so
    /// that raising or lowering it keeps the log already counted.
    fn key_stem(&self) -> String {
        let method = self.method.unwrap_or("*");
        let window_ms = self.window.as_millis();
        match &self.key {
            KeyKind::Peer => format!("{method}:peer:{window_ms}"),
            KeyKind::Global => format!("{method}:global:{window_ms}"),
            KeyKind::Header(name) => format!("{method}:header:{name}:{window_ms}"),
        }
    }
}

impl fmt::Display for Rule {
    /// The rule in the syntax it was written in, normalized: `Login:peer=20/1s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let method = self.method.unwrap_or("*");
        let window = humantime::format_duration(self.window).to_string();
        let window = window.replace(' ', "");
        match &self.key {
            KeyKind::Peer => write!(f, "{method}:peer={}/{window}", self.limit),
            KeyKind::Global => write!(f, "{method}:global={}/{window}", self.limit),
            KeyKind::Header(name) => write!(f, "{method}:header:{name}={}/{window}", self.limit),
        }
    }
}

impl FromStr for Rule {
    type Err = String;

    /// Parses `METHOD:KEY=LIMIT/WINDOW`; the error says what is wrong, not where
    /// (the caller names the rule).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        const SHAPE: &str = "expected METHOD:KEY=LIMIT/WINDOW, e.g. Login:peer=20/1s";
        let (lhs, rhs) = text.split_once('=').ok_or(SHAPE)?;
        let (method, key) = lhs.split_once(':').ok_or(SHAPE)?;
        let (limit, window) = rhs.split_once('/').ok_or(SHAPE)?;
        let (method, key, limit, window) = (method.trim(), key.trim(), limit.trim(), window.trim());

        let method = if method == "*" {
            None
        } else {
            let known = RPCS.iter().find(|m| m.eq_ignore_ascii_case(method));
            Some(*known.ok_or_else(|| {
                format!(
                    "unknown method {method:?} (expected one of {} or *)",
                    RPCS.join(", ")
                )
            })?)
        };

        let key = match key {
            "peer" => KeyKind::Peer,
            "global" => KeyKind::Global,
            _ => match key.strip_prefix("header:") {
                Some("") => {
                    return Err("header: needs a header name, e.g. header:x-client-id".into());
                }
                Some(name) => KeyKind::Header(
                    http::HeaderName::from_bytes(name.as_bytes())
                        .map_err(|_| format!("{name:?} is not a valid header name"))?,
                ),
                None => {
                    return Err(format!(
                        "unknown key {key:?} (expected peer, global or header:NAME)"
                    ));
                }
            },
        };

        let limit: u32 = limit
            .parse()
            .map_err(|_| format!("limit {limit:?} is not a whole number"))?;
        if limit == 0 {
            return Err("the limit must be at least 1".into());
        }

        let window = humantime::parse_duration(window)
            .map_err(|e| format!("window {window:?}: {e} (examples: 1s, 500ms, 1m)"))?;
        if window < Duration::from_millis(1) || window.subsec_nanos() % 1_000_000 != 0 {
            return Err("the window must be a whole number of milliseconds, at least 1ms".into());
        }
        if window > MAX_WINDOW {
            return Err("the window must be at most 1day".into());
        }

        Ok(Rule {
            method,
            key,
            limit,
            window,
        })
    }
}

/// The rules of `AUTHD_RATE_LIMITS`: comma separated, all that match a request
/// must allow it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateLimits(Vec<Rule>);

impl RateLimits {
    pub fn rules(&self) -> &[Rule] {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl FromStr for RateLimits {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let mut rules: Vec<Rule> = Vec::new();
        // Empty entries (a trailing comma, an empty variable) are no rule, not an error.
        for written in text.split(',').map(str::trim).filter(|r| !r.is_empty()) {
            let rule: Rule = written
                .parse()
                .map_err(|why| format!("rule {written:?}: {why}"))?;
            // Two rules on the same method, key and window would share one log and
            // the tighter would always win: almost certainly a mistake.
            if let Some(twin) = rules.iter().find(|r| r.key_stem() == rule.key_stem()) {
                return Err(format!(
                    "rule {written:?}: counts the same requests as {twin} (same method, key \
                     and window); keep one"
                ));
            }
            rules.push(rule);
        }
        Ok(RateLimits(rules))
    }
}

impl fmt::Display for RateLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, rule) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{rule}")?;
        }
        Ok(())
    }
}

/// What to do with a request a rule matches while Redis fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FailureMode {
    /// Enforce the same rules per replica with the in-process limiter.
    Open,
    /// Refuse with UNAVAILABLE until Redis answers again.
    Closed,
}

/// A Redis URL (`redis://[user:password@]host:port[/db]`). Its password is never
/// printed: `Display` and `Debug` redact it.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL with its password, for connecting only.
    fn expose(&self) -> &str {
        &self.0
    }
}

impl FromStr for RedisUrl {
    type Err = String;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        ::redis::Client::open(url)
            .map(|_| RedisUrl(url.to_owned()))
            .map_err(|e| {
                // Print the error's kind only: its text may quote the URL, secret included.
                let shown = RedisUrl(url.to_owned());
                format!("{shown} is not a usable Redis URL ({:?})", e.kind())
            })
    }
}

impl RedisUrl {
    /// The clap parser: like `FromStr`, but its error quotes the URL redacted (clap's
    /// own "invalid value '…'" would print the password).
    pub fn value_parser() -> RedisUrlParser {
        RedisUrlParser
    }
}

#[derive(Clone, Copy, Debug)]
pub struct RedisUrlParser;

impl clap::builder::TypedValueParser for RedisUrlParser {
    type Value = RedisUrl;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<RedisUrl, clap::Error> {
        let arg = arg.map_or_else(
            || "the Redis URL".to_owned(),
            |a| format!("'--{}'", a.get_long().unwrap_or(a.get_id().as_str())),
        );
        let fail = |why: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for {arg}: {why}\n"),
            )
            .with_cmd(cmd)
        };
        let text = value
            .to_str()
            .ok_or_else(|| fail("not valid UTF-8".into()))?;
        text.parse().map_err(fail)
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact(&self.0))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({:?})", redact(&self.0))
    }
}

/// Replaces the password of a URL (the userinfo after `:`, or the whole userinfo
/// when there is no `:`) and any `pass…` query value with `***`.
fn redact(url: &str) -> String {
    let (scheme, rest) = match url.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), url),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (rest, None),
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => format!("***@{host}"),
        },
        None => authority.to_owned(),
    };
    let mut out = format!("{scheme}{authority}{path}");
    if let Some(query) = query {
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((k, _)) if k.to_ascii_lowercase().contains("pass") => format!("{k}=***"),
                _ => pair.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&pairs.join("&"));
    }
    out
}

/// Everything the limiter needs from the configuration.
#[derive(Debug, Clone)]
pub struct Settings {
    pub rules: RateLimits,
    pub redis_url: Option<RedisUrl>,
    pub prefix: String,
    pub redis_timeout: Duration,
    pub failure: FailureMode,
    pub trust_forwarded_for: bool,
}

impl From<&crate::config::Config> for Settings {
    fn from(c: &crate::config::Config) -> Self {
        Settings {
            rules: c.rate_limits.clone().unwrap_or_default(),
            redis_url: c.redis_url.clone(),
            prefix: c.rate_limit_prefix.clone(),
            redis_timeout: c.redis_timeout,
            failure: c.rate_limit_failure,
            trust_forwarded_for: c.trust_forwarded_for,
        }
    }
}

/// One matching rule of one request: the key to count under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Check {
    /// Index of the rule in [`RateLimits::rules`].
    rule: usize,
    key: String,
    limit: u32,
    window: Duration,
}

/// The state of one rule's log after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RuleState {
    /// Requests the rule would still allow now (0 for a rule that refused).
    remaining: u32,
    /// Until the rule allows another request: zero while it has room, else until
    /// the entry that keeps the log full leaves the window.
    reset: Duration,
}

/// What a backend decided for all the checks of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Outcome {
    allowed: bool,
    /// One per check, in order.
    states: Vec<RuleState>,
}

/// What an allowed request is told: the rule closest to refusing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    pub limit: u32,
    pub remaining: u32,
    pub reset: Duration,
}

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
struct RedisTier {
    limiter: redis::RedisLimiter,
    /// False from a failed call until a probe succeeds: requests meanwhile do not
    /// call Redis at all, so an outage costs at most one timeout, not one per request.
    healthy: Arc<AtomicBool>,
    url: RedisUrl,
}

/// The decision counters of one rule (`authd_ratelimit_decisions_total`).
struct RuleCounters {
    /// The rule had room (whether or not another rule refused the request).
    allowed: IntCounter,
    /// The rule refused the request.
    refused: IntCounter,
    /// Redis failed in fail-closed mode: no decision, the request was refused.
    unavailable: IntCounter,
}

/// The limiter's metric handles, resolved when it is built.
struct LimiterMetrics {
    /// One per rule, in the order of [`RateLimits::rules`].
    rules: Vec<RuleCounters>,
    redis_duration: Histogram,
    redis_timeout: IntCounter,
    redis_error: IntCounter,
    redis_not_connected: IntCounter,
    redis_bad_reply: IntCounter,
}

impl LimiterMetrics {
    fn new(metrics: &Metrics, rules: &RateLimits) -> Self {
        let m = &metrics.rate_limit;
        let rules = (rules.rules().iter())
            .map(|rule| {
                let rule = rule.to_string();
                let counter = |outcome| m.decisions.with_label_values(&[rule.as_str(), outcome]);
                RuleCounters {
                    allowed: counter("allowed"),
                    refused: counter("refused"),
                    unavailable: counter("unavailable"),
                }
            })
            .collect();
        let error = |kind| m.redis_errors.with_label_values(&[kind]);
        Self {
            rules,
            redis_duration: m.redis_duration.clone(),
            redis_timeout: error("timeout"),
            redis_error: error("error"),
            redis_not_connected: error("not_connected"),
            redis_bad_reply: error("bad_reply"),
        }
    }

    fn redis_failed(&self, why: &redis::RedisFailure) {
        match why {
            redis::RedisFailure::NotConnected => &self.redis_not_connected,
            redis::RedisFailure::Timeout(_) => &self.redis_timeout,
            redis::RedisFailure::Redis(_) => &self.redis_error,
            redis::RedisFailure::BadReply(_) => &self.redis_bad_reply,
        }
        .inc();
    }
}

/// Decides whether a request may pass. Shared (in an `Arc`) by every clone of the
/// layer.
pub struct RateLimiter {
    rules: RateLimits,
    /// Per rule, the start of its keys: `{prefix}:{method}:{kind}:{window_ms}:`,
    /// built once so a decision allocates only the key itself.
    key_starts: Vec<String>,
    trust_forwarded_for: bool,
    failure: FailureMode,
    local: local::LocalLimiter,
    redis: Option<RedisTier>,
    counters: Counters,
    metrics: LimiterMetrics,
}

impl RateLimiter {
    fn new(settings: Settings, redis: Option<RedisTier>, metrics: &Metrics) -> Self {
        let key_starts = (settings.rules.rules().iter())
            .map(|rule| format!("{}:{}:", settings.prefix, rule.key_stem()))
            .collect();
        if let Some(tier) = &redis {
            // Read when scraped, so the gauge always says what the flag says.
            let (healthy, gauge) = (
                tier.healthy.clone(),
                metrics.rate_limit.fallback_active.clone(),
            );
            metrics.on_scrape(move || gauge.set(i64::from(!healthy.load(Ordering::SeqCst))));
        }
        let metrics = LimiterMetrics::new(metrics, &settings.rules);
        RateLimiter {
            rules: settings.rules,
            key_starts,
            trust_forwarded_for: settings.trust_forwarded_for,
            failure: settings.failure,
            local: local::LocalLimiter::new(),
            redis,
            counters: Counters::default(),
            metrics,
        }
    }

    /// Builds the limiter. With Redis configured it tries to connect once (at most
    /// [`CONNECT_TIMEOUT`]); if that fails it starts degraded and a background task
    /// keeps trying, so a Redis outage never stops authd from starting.
    pub async fn start(settings: Settings, metrics: &Metrics) -> anyhow::Result<Arc<Self>> {
        let redis = match &settings.redis_url {
            Some(url) if !settings.rules.is_empty() => Some(RedisTier {
                limiter: redis::RedisLimiter::new(url, settings.redis_timeout)?,
                healthy: Arc::new(AtomicBool::new(false)),
                url: url.clone(),
            }),
            _ => None,
        };
        let limiter = Arc::new(RateLimiter::new(settings.clone(), redis, metrics));
        match &limiter.redis {
            None if limiter.rules.is_empty() => {
                if settings.redis_url.is_some() {
                    tracing::info!(
                        "AUTHD_REDIS_URL is set but there are no rate limits: not using it"
                    );
                }
            }
            None => tracing::info!(
                rules = %limiter.rules,
                "rate limits enforced per replica by the in-process limiter (no AUTHD_REDIS_URL)"
            ),
            Some(tier) => {
                match tier.limiter.probe(CONNECT_TIMEOUT).await {
                    Ok(()) => {
                        tier.healthy.store(true, Ordering::SeqCst);
                        tracing::info!(
                            rules = %limiter.rules,
                            redis = %tier.url,
                            "rate limits enforced globally through Redis"
                        );
                    }
                    Err(why) => tracing::warn!(
                        rules = %limiter.rules,
                        redis = %tier.url,
                        error = %why,
                        "Redis does not answer at start: {} until it does",
                        limiter.degraded_behaviour()
                    ),
                }
                spawn_prober(Arc::downgrade(&limiter));
            }
        }
        Ok(limiter)
    }

    pub fn rules(&self) -> &RateLimits {
        &self.rules
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
            _ if self.rules.is_empty() => Backend::Off,
            None => Backend::Local,
            Some(tier) if tier.healthy.load(Ordering::SeqCst) => Backend::Redis,
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
        peer: Option<IpAddr>,
    ) -> Vec<Check> {
        let mut checks = Vec::new();
        for (index, rule) in self.rules.rules().iter().enumerate() {
            if !rule.matches(method) {
                continue;
            }
            let start = &self.key_starts[index];
            let mut key = String::with_capacity(start.len() + 40);
            key.push_str(start);
            match &rule.key {
                KeyKind::Global => {}
                KeyKind::Peer => match self.client_ip(headers, peer) {
                    Some(ip) => {
                        use std::fmt::Write as _;
                        let _ = write!(key, "{ip}"); // writing to a String cannot fail
                    }
                    // Not over TCP (a test harness): all such requests share one key.
                    None => key.push_str("unknown"),
                },
                KeyKind::Header(name) => match headers.get(name) {
                    Some(value) => key.push_str(&header_key(value.as_bytes())),
                    // Without the header the rule does not apply: pair header rules
                    // with a peer rule for clients that omit it.
                    None => continue,
                },
            }
            checks.push(Check {
                rule: index,
                key,
                limit: rule.limit,
                window: rule.window,
            });
        }
        checks
    }

    fn client_ip(&self, headers: &http::HeaderMap, peer: Option<IpAddr>) -> Option<IpAddr> {
        let forwarded = self
            .trust_forwarded_for
            .then(|| first_forwarded_hop(headers))
            .flatten();
        forwarded.or(peer).map(|ip| ip.to_canonical())
    }

    /// Decides `checks` (from [`plan`](Self::plan), not empty): the quota left, or
    /// RESOURCE_EXHAUSTED (or UNAVAILABLE when Redis fails in fail-closed mode).
    pub(crate) async fn decide(&self, checks: &[Check]) -> Result<Quota, Error> {
        let outcome = match &self.redis {
            None => self.decide_locally(checks),
            Some(tier) if tier.healthy.load(Ordering::SeqCst) => {
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
                        if tier.healthy.swap(false, Ordering::SeqCst) {
                            tracing::warn!(
                                redis = %tier.url,
                                error = %why,
                                "Redis rate limiting failed: {} until Redis answers again",
                                self.degraded_behaviour()
                            );
                        }
                        self.decide_degraded(checks)?
                    }
                }
            }
            Some(_) => self.decide_degraded(checks)?,
        };
        self.verdict(checks, &outcome)
    }

    fn decide_locally(&self, checks: &[Check]) -> Outcome {
        self.counters
            .local_decisions
            .fetch_add(1, Ordering::Relaxed);
        self.local.decide(checks, Instant::now())
    }

    fn decide_degraded(&self, checks: &[Check]) -> Result<Outcome, Error> {
        match self.failure {
            FailureMode::Open => Ok(self.decide_locally(checks)),
            FailureMode::Closed => {
                self.counters.unavailable.fetch_add(1, Ordering::Relaxed);
                for check in checks {
                    self.metrics.rules[check.rule].unavailable.inc();
                }
                Err(Error::Unavailable(
                    "rate limits cannot be checked while Redis does not answer".into(),
                ))
            }
        }
    }

    /// Turns a backend's outcome into what the client is told.
    fn verdict(&self, checks: &[Check], outcome: &Outcome) -> Result<Quota, Error> {
        let pairs = checks.iter().zip(&outcome.states);
        for (check, state) in pairs.clone() {
            let counters = &self.metrics.rules[check.rule];
            // A refused request leaves at 0 remaining exactly the rules that refused it.
            if outcome.allowed || state.remaining > 0 {
                counters.allowed.inc();
            } else {
                counters.refused.inc();
            }
        }
        if outcome.allowed {
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
                    let rule = &self.rules.rules()[c.rule];
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

/// While Redis is degraded, tries it every [`PROBE_INTERVAL`] and restores it once
/// it answers; ends when the limiter is dropped (the server stopped).
fn spawn_prober(limiter: Weak<RateLimiter>) {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(PROBE_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let Some(limiter) = limiter.upgrade() else {
                return;
            };
            let Some(tier) = &limiter.redis else {
                return;
            };
            if tier.healthy.load(Ordering::SeqCst) {
                continue;
            }
            match tier.limiter.probe(CONNECT_TIMEOUT).await {
                Ok(()) => {
                    if !tier.healthy.swap(true, Ordering::SeqCst) {
                        tracing::info!(
                            redis = %tier.url,
                            "Redis answers again: rate limits are global across replicas again"
                        );
                    }
                }
                Err(why) => tracing::debug!(error = %why, "Redis still does not answer"),
            }
        }
    });
}

/// The first `x-forwarded-for` hop: the client as the first proxy saw it.
fn first_forwarded_hop(headers: &http::HeaderMap) -> Option<IpAddr> {
    let value = headers.get("x-forwarded-for")?.to_str().ok()?;
    let first = value.split(',').next()?.trim();
    first
        .parse::<IpAddr>()
        .ok()
        .or_else(|| first.parse::<std::net::SocketAddr>().ok().map(|a| a.ip()))
}

/// The key part for a header value: the value itself when short and plain,
/// otherwise a hash of it (which cannot collide with a plain value: those have no `:`).
fn header_key(value: &[u8]) -> String {
    let plain = value
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if plain && value.len() <= MAX_RAW_HEADER_KEY {
        // Plain ASCII, checked just above.
        String::from_utf8_lossy(value).into_owned()
    } else {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(value);
        let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<RateLimits, String> {
        text.parse()
    }

    #[test]
    fn the_design_example_parses() {
        let rules = parse("Login:peer=20/1s,Login:global=2000/1s,*:peer=200/1s").unwrap();
        let rules = rules.rules();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[0].method, Some("Login"));
        assert_eq!(rules[0].key, KeyKind::Peer);
        assert_eq!(rules[0].limit, 20);
        assert_eq!(rules[0].window, Duration::from_secs(1));
        assert_eq!(rules[1].key, KeyKind::Global);
        assert_eq!(rules[1].limit, 2000);
        assert_eq!(rules[2].method, None);
    }

    #[test]
    fn good_rules_parse_and_print_normalized() {
        for (text, shown) in [
            ("Login:peer=20/1s", "Login:peer=20/1s"),
            (" login : global = 5 / 500ms ", "Login:global=5/500ms"),
            ("*:header:X-Client-Id=100/1m", "*:header:x-client-id=100/1m"),
            ("ValidateToken:peer=1000/1h", "ValidateToken:peer=1000/1h"),
            ("Register:global=10/1m 30s", "Register:global=10/1m30s"),
        ] {
            let rules = parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert_eq!(rules.to_string(), shown, "{text:?}");
            // The printed form parses back to the same rule.
            assert_eq!(parse(shown).unwrap(), rules);
        }
        assert!(parse("").unwrap().is_empty());
        assert_eq!(parse("Login:peer=1/1s,").unwrap().rules().len(), 1);
        // Same method and key with different windows: a burst and a sustained limit.
        assert_eq!(
            parse("Login:peer=5/1s,Login:peer=100/1m")
                .unwrap()
                .rules()
                .len(),
            2
        );
    }

    #[test]
    fn bad_rules_are_refused_naming_the_rule_and_the_problem() {
        for (text, expected) in [
            (
                "Login:peer=20/1s,Logn:peer=5/1s",
                r#"rule "Logn:peer=5/1s": unknown method "Logn""#,
            ),
            ("Login", "expected METHOD:KEY=LIMIT/WINDOW"),
            ("Login:peer", "expected METHOD:KEY=LIMIT/WINDOW"),
            ("Login:peer=20", "expected METHOD:KEY=LIMIT/WINDOW"),
            ("peer=20/1s", "expected METHOD:KEY=LIMIT/WINDOW"),
            (
                "Login:ip=20/1s",
                r#"unknown key "ip" (expected peer, global or header:NAME)"#,
            ),
            ("Login:header:=20/1s", "needs a header name"),
            ("Login:header:bad header=20/1s", "not a valid header name"),
            ("Login:peer=0/1s", "at least 1"),
            ("Login:peer=-1/1s", r#"limit "-1" is not a whole number"#),
            ("Login:peer=many/1s", "not a whole number"),
            ("Login:peer=99999999999/1s", "not a whole number"),
            ("Login:peer=20/soon", r#"window "soon""#),
            ("Login:peer=20/0s", "at least 1ms"),
            ("Login:peer=20/1500us", "whole number of milliseconds"),
            ("Login:peer=20/2days", "at most 1day"),
            (
                "Login:peer=5/1s,Login:peer=9/1s",
                "counts the same requests as Login:peer=5/1s",
            ),
        ] {
            let err = parse(text).expect_err(text);
            assert!(err.contains(expected), "{text:?}: {err}");
            assert!(err.starts_with("rule \""), "{text:?}: {err}");
        }
    }

    #[test]
    fn the_known_rpcs_are_those_of_the_proto() {
        use prost::Message as _;
        let set = prost_types::FileDescriptorSet::decode(crate::pb::FILE_DESCRIPTOR_SET).unwrap();
        let mut methods: Vec<String> = set
            .file
            .iter()
            .flat_map(|f| &f.service)
            .filter(|s| s.name() == "AuthService")
            .flat_map(|s| &s.method)
            .map(|m| m.name().to_owned())
            .collect();
        methods.sort();
        let mut known: Vec<String> = RPCS.iter().map(|m| m.to_string()).collect();
        known.sort();
        assert_eq!(methods, known);
    }

    #[test]
    fn redis_urls_never_show_their_password() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
            ("redis://:s3cret@cache:6379/2", "redis://:***@cache:6379/2"),
            ("redis://authd:s3cret@cache", "redis://authd:***@cache"),
            ("redis://s3cret@cache", "redis://***@cache"),
            (
                "redis+unix:///run/redis.sock?db=1&pass=s3cret",
                "redis+unix:///run/redis.sock?db=1&pass=***",
            ),
        ] {
            let parsed: RedisUrl = url.parse().unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(parsed.to_string(), shown);
            assert!(!format!("{parsed:?}").contains("s3cret"));
        }
        let err = "http://:s3cret@cache".parse::<RedisUrl>().unwrap_err();
        assert!(!err.contains("s3cret"), "{err}");
    }

    fn limiter(rules: &str, trust_forwarded_for: bool) -> RateLimiter {
        let settings = Settings {
            rules: rules.parse().unwrap(),
            redis_url: None,
            prefix: "p".into(),
            redis_timeout: Duration::from_millis(50),
            failure: FailureMode::Open,
            trust_forwarded_for,
        };
        RateLimiter::new(settings, None, &Metrics::new())
    }

    fn keys(l: &RateLimiter, method: &str, headers: &[(&str, &str)], peer: &str) -> Vec<String> {
        let mut map = http::HeaderMap::new();
        for (k, v) in headers {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        l.plan(method, &map, Some(peer.parse().unwrap()))
            .into_iter()
            .map(|c| c.key)
            .collect()
    }

    #[test]
    fn keys_name_the_rule_and_the_subject() {
        let l = limiter(
            "Login:peer=20/1s,*:global=1000/1m,*:header:x-client-id=5/1s,Register:peer=1/1s",
            false,
        );
        assert_eq!(
            keys(&l, "Login", &[("x-client-id", "app-1")], "10.0.0.7"),
            [
                "p:Login:peer:1000:10.0.0.7",
                "p:*:global:60000:",
                "p:*:header:x-client-id:1000:app-1",
            ]
        );
        // No header: the header rule does not apply.
        assert_eq!(
            keys(&l, "ValidateToken", &[], "10.0.0.7"),
            ["p:*:global:60000:"]
        );
        // IPv4-mapped IPv6 is the same client as IPv4.
        assert_eq!(
            keys(&l, "Register", &[], "::ffff:10.0.0.7")[1],
            "p:Register:peer:1000:10.0.0.7"
        );
        // Odd or long header values are hashed: fixed size, no separators.
        let odd = keys(&l, "Login", &[("x-client-id", "a:b c")], "10.0.0.7");
        assert!(
            odd[2].starts_with("p:*:header:x-client-id:1000:sha256:"),
            "{odd:?}"
        );
        let long = "x".repeat(200);
        let long = keys(&l, "Login", &[("x-client-id", long.as_str())], "10.0.0.7");
        assert_eq!(
            long[2].len(),
            "p:*:header:x-client-id:1000:sha256:".len() + 32
        );
    }

    #[test]
    fn forwarded_for_is_used_only_when_trusted() {
        let headers = [("x-forwarded-for", "203.0.113.9, 10.0.0.1")];
        let untrusted = limiter("Login:peer=1/1s", false);
        assert_eq!(
            keys(&untrusted, "Login", &headers, "10.0.0.1"),
            ["p:Login:peer:1000:10.0.0.1"]
        );
        let trusted = limiter("Login:peer=1/1s", true);
        assert_eq!(
            keys(&trusted, "Login", &headers, "10.0.0.1"),
            ["p:Login:peer:1000:203.0.113.9"]
        );
        // A hop that is not an address: the connection's peer.
        assert_eq!(
            keys(
                &trusted,
                "Login",
                &[("x-forwarded-for", "unknown")],
                "10.0.0.1"
            ),
            ["p:Login:peer:1000:10.0.0.1"]
        );
        assert_eq!(
            keys(
                &trusted,
                "Login",
                &[("x-forwarded-for", "[2001:db8::1]:4711")],
                "10.0.0.1"
            ),
            ["p:Login:peer:1000:2001:db8::1"]
        );
    }

    #[tokio::test]
    async fn a_refusal_names_every_refusing_rule_and_waits_for_the_last() {
        let l = limiter(
            "Login:peer=1/1s,Login:global=1/1m,Login:header:x-client-id=5/1s",
            false,
        );
        let map = http::HeaderMap::new();
        let checks = l.plan("Login", &map, Some("10.0.0.7".parse().unwrap()));
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
}
