//! Rate limiting: the rules of `AUTHD_RATE_LIMITS`, the keys a request is counted
//! under, and the limiter that decides, on Redis when one is configured and in
//! process otherwise. It knows nothing of health or reflection: its tower layer
//! (`crate::layers::ratelimit`) exempts them before asking, and of the configuration only the [`Settings`] it is given.
//!
//! One job per file:
//! - `rules`: the rule syntax, parsed once at the edge;
//! - `keys`: which rules match a request, and the key each counts it under;
//! - `deferred`: the decision a grant's handler takes once it has read the client id
//!   a `client-id` rule counts;
//! - `limiter`: the [`RateLimiter`] (Redis tier, local fallback, prober, stats);
//! - `redis`: the Lua script that decides for all matching rules in one round trip;
//! - `local`: the in-process sliding-window log, the same rules per replica;
//! - `descriptors`: the rules file of Envoy's rate limit service (envoyproxy/
//!   ratelimit's YAML, a compatible subset) and how a descriptor matches it;
//! - `reload`: the rules file in force, re-read live, a bad one kept out;
//! - `service`: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` on the
//!   same limiter: descriptors decided all or nothing, shadow mode, the answer.

mod deferred;
mod descriptors;
mod keys;
mod limiter;
mod local;
mod redis;
mod reload;
mod rules;
mod service;

use std::time::Duration;

pub(crate) use deferred::Deferred;
pub use limiter::{Backend, RateLimitStats, RateLimiter};
pub(crate) use reload::LiveRules;
pub use rules::{KeyKind, RateLimits, RegisterLimit};
pub(crate) use service::{DescriptorLimits, RateLimitServer};
// What a request meets while Redis fails is the same for every Redis user.
pub use crate::redis::FailureMode;

/// Everything the limiter needs from the configuration.
#[derive(Clone)]
pub struct Settings {
    pub rules: RateLimits,
    /// The Redis that holds the counts of every replica; `None`: per replica only.
    pub redis: Option<std::sync::Arc<crate::redis::SharedRedis>>,
    pub prefix: String,
    pub redis_timeout: Duration,
    pub failure: FailureMode,
    /// Most keys the in-process limiter tracks (see `local`).
    pub max_local_keys: usize,
    /// Envoy's rate limit service is served (a rules file is configured): the
    /// limiter connects to Redis even when authd's own RPCs have no rules.
    pub descriptors: bool,
    /// The time of the in-process windows; `None`: the machine's (tests set one).
    pub clock: Option<std::sync::Arc<dyn crate::clock::Clock>>,
}

/// One matching rule of one request: the key to count under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Check {
    /// Index of the rule in [`RateLimits::rules`].
    rule: usize,
    key: String,
    limit: u32,
    window: Duration,
    /// How many requests this one counts as (1 for authd's own RPCs; Envoy's
    /// `hits_addend` for a descriptor): it passes only if the log has room for all
    /// of them, and then adds them all.
    hits: u32,
}

/// The state of one rule's log after a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RuleState {
    /// Requests the rule would still allow now: after this request's hits when it was
    /// allowed, before them when it was refused (fewer than its hits for a rule that
    /// refused).
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
