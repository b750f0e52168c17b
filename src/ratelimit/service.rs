//! Envoy's rate limit service, `envoy.service.ratelimit.v3.RateLimitService`, on
//! authd's sliding windows: each descriptor of a ShouldRateLimit request is matched
//! against the rules file (`descriptors`, kept live by `reload`), and the limited
//! ones are decided together by the [`RateLimiter`] that decides authd's own RPCs
//! (Redis when configured, in process otherwise, with the same failure modes).
//!
//! What one request means:
//! - **All or nothing.** The limited descriptors of one request are decided in one
//!   step (one Redis script, or one lock): the request is allowed only if every
//!   enforced rule has room for its hits, and only then are the hits added, to
//!   every rule. A descriptor over its limit therefore makes the others not count
//!   either: a refused request adds no entry anywhere, as for authd's own RPCs.
//! - **Shadow mode** (a rule's `shadow_mode`, or `AUTHD_RATE_LIMIT_SHADOW` for all):
//!   a shadow rule is decided and counted exactly as if enforced, and never refuses.
//!   When only shadow rules lack room, they are left out and the rest is decided
//!   again (so enforced rules still count the request, and the shadow rule's log
//!   holds what it would hold if it were enforced: no entry for a request it would
//!   have refused). The metrics and the log name the rule that would have refused.
//! - **Hits**: the descriptor's `hits_addend` if set, else the request's, 0 meaning
//!   1 as Envoy does. A descriptor repeated in one request counts once with the sum
//!   of its hits.
//! - No rule (unknown domain, key or value, or a node without a `rate_limit`): OK
//!   with no `current_limit`, as envoyproxy/ratelimit answers; `unlimited`: OK with
//!   `limit_remaining` at its maximum.
//!
//! Requests come from a proxy but carry what its clients sent, so their size is
//! bounded before anything is looked up (INVALID_ARGUMENT beyond), and a key is a
//! digest of its values: whatever the values, keys have one size, and the
//! in-process limiter's key cap bounds their number.

use super::{
    Check, RateLimiter, RuleState,
    descriptors::MAX_DEPTH,
    reload::{LiveRules, Loaded},
};
use crate::{
    codec::RequestCodec,
    error::{Error, FieldViolation},
    metrics::Metrics,
};
use envoy_types::pb::{
    envoy::{
        config::core::v3::HeaderValue,
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse,
            rate_limit_response::{Code, DescriptorStatus, RateLimit},
        },
    },
    google::protobuf::Duration as ProtoDuration,
};
use prometheus::IntCounter;
use sha2::{Digest as _, Sha256};
use std::{collections::HashMap, fmt::Write as _, sync::Arc, time::Duration};

/// Most descriptors in one request.
pub(crate) const MAX_DESCRIPTORS: usize = 64;
/// Most bytes of a domain, an entry's key or value.
pub(crate) const MAX_TEXT: usize = 256;
/// Most hits one descriptor may add: each is an entry of the window's log.
pub(crate) const MAX_HITS: u64 = 10_000;
/// Descriptor rules are numbered from here in a [`Check`], apart from authd's own
/// rules (the in-process limiter keeps an overflow log per number).
const RULE_BASE: usize = 1 << 24;

/// ShouldRateLimit answers, by overall code.
struct Answers {
    ok: IntCounter,
    over_limit: IntCounter,
    invalid: IntCounter,
    unavailable: IntCounter,
}

/// Decides ShouldRateLimit requests.
pub(crate) struct DescriptorLimits {
    limiter: Arc<RateLimiter>,
    rules: Arc<LiveRules>,
    /// `AUTHD_RATE_LIMIT_SHADOW`: every rule in shadow mode.
    shadow_all: bool,
    prefix: String,
    answers: Answers,
}

/// What a descriptor met.
enum Plan {
    /// No rule: no limit.
    Free,
    Unlimited,
    /// A limited rule, counted by the check at this index.
    Limited {
        rule: usize,
        check: usize,
    },
}

impl DescriptorLimits {
    pub(crate) fn new(
        limiter: Arc<RateLimiter>,
        rules: Arc<LiveRules>,
        shadow_all: bool,
        prefix: &str,
        metrics: &Metrics,
    ) -> Self {
        let family = &metrics.rate_limit.service_answers;
        let answer = |code| family.with_label_values(&[code]);
        DescriptorLimits {
            limiter,
            rules,
            shadow_all,
            prefix: format!("{prefix}:rls:"),
            answers: Answers {
                ok: answer("ok"),
                over_limit: answer("over_limit"),
                invalid: answer("invalid"),
                unavailable: answer("unavailable"),
            },
        }
    }

    /// Answers one request.
    /// `request_id` (the trace layer's) ties the log line of a refusal, or of a
    /// shadow rule that would have refused, to the request's own log line.
    pub(crate) async fn should_rate_limit(
        &self,
        request: &RateLimitRequest,
        request_id: Option<&str>,
    ) -> Result<RateLimitResponse, Error> {
        if let Err(why) = validate(request) {
            self.answers.invalid.inc();
            return Err(why);
        }
        let loaded = self.rules.current();
        let (plans, checks) = self.plan(&loaded, request);
        let mut span = crate::otel::child("ratelimit.descriptors");
        let decided = self.decide(&checks, &loaded, &mut span).await;
        let (over, states, shadow_over) = match decided {
            Ok(decided) => decided,
            Err(why) => {
                self.answers.unavailable.inc();
                for plan in &plans {
                    if let Plan::Limited { rule, .. } = plan {
                        loaded.counters[*rule].unavailable.inc();
                    }
                }
                return Err(why);
            }
        };
        let refuses = |check: usize| states[check].remaining < checks[check].hits;
        let mut response = RateLimitResponse {
            overall_code: if over { Code::OverLimit } else { Code::Ok } as i32,
            ..Default::default()
        };
        let (mut policy, mut quota) = (String::new(), String::new());
        let (mut refused_by, mut shadow_refused_by) = (Vec::new(), Vec::new());
        for plan in &plans {
            let status = match *plan {
                Plan::Free => status(Code::Ok, None, 0, Duration::ZERO),
                Plan::Unlimited => status(Code::Ok, None, u32::MAX, Duration::ZERO),
                Plan::Limited { rule, check } => {
                    let spec = &loaded.file.rules()[rule];
                    let state = states[check];
                    let shadow = spec.shadow || self.shadow_all;
                    let counters = &loaded.counters[rule];
                    let code = if shadow_over[check] || (shadow && over && refuses(check)) {
                        counters.shadow_over_limit.inc();
                        shadow_refused_by.push(spec.name.as_str());
                        Code::Ok
                    } else if over && refuses(check) {
                        counters.over_limit.inc();
                        refused_by.push(spec.name.as_str());
                        Code::OverLimit
                    } else {
                        counters.ok.inc();
                        Code::Ok
                    };
                    let (limit, unit) = spec.limit.unwrap_or((0, super::descriptors::Unit::Second));
                    if !shadow {
                        let name = field_name(&spec.name);
                        let sep = if policy.is_empty() { "" } else { ", " };
                        let _ = write!(
                            policy,
                            "{sep}\"{name}\";q={limit};w={}",
                            unit.window().as_secs()
                        );
                        let _ = write!(
                            quota,
                            "{sep}\"{name}\";r={};t={}",
                            state.remaining,
                            state.reset.as_secs() + u64::from(state.reset.subsec_nanos() > 0)
                        );
                    }
                    let current = RateLimit {
                        name: spec.name.clone(),
                        requests_per_unit: limit,
                        unit: unit.proto(),
                    };
                    status(code, Some(current), state.remaining, state.reset)
                }
            };
            response.statuses.push(status);
        }
        if !policy.is_empty() {
            for (key, value) in [("RateLimit-Policy", policy), ("RateLimit", quota)] {
                response.response_headers_to_add.push(HeaderValue {
                    key: key.into(),
                    value,
                    ..Default::default()
                });
            }
        }
        if over {
            self.answers.over_limit.inc();
        } else {
            self.answers.ok.inc();
        }
        if !refused_by.is_empty() || !shadow_refused_by.is_empty() {
            tracing::info!(
                request_id = request_id.unwrap_or_default(),
                domain = %request.domain,
                over_limit = refused_by.join(","),
                shadow_over_limit = shadow_refused_by.join(","),
                "ShouldRateLimit: {}",
                if over { "over limit" } else { "a shadow rule would have refused" }
            );
        }
        Ok(response)
    }

    /// The plan of every descriptor and the checks of the limited ones, a key
    /// counted once (with the sum of its hits) however often it is repeated.
    fn plan(&self, loaded: &Loaded, request: &RateLimitRequest) -> (Vec<Plan>, Vec<Check>) {
        let mut plans = Vec::with_capacity(request.descriptors.len());
        let mut checks: Vec<Check> = Vec::new();
        let mut by_key: HashMap<String, usize> = HashMap::new();
        for descriptor in &request.descriptors {
            let entries = descriptor
                .entries
                .iter()
                .map(|e| (e.key.as_str(), e.value.as_str()));
            let Some(rule) = loaded.file.matching(&request.domain, entries) else {
                plans.push(Plan::Free);
                continue;
            };
            let spec = &loaded.file.rules()[rule];
            let Some((limit, unit)) = spec.limit else {
                plans.push(Plan::Unlimited);
                continue;
            };
            let hits = hits(request, descriptor);
            let window = unit.window();
            // The domain, the rule's place and every value: a key of one size whatever
            // the request sent. The limit is left out, so changing it keeps the counts.
            let mut digest = Sha256::new();
            for part in [request.domain.as_str(), spec.path.as_str()] {
                digest.update(part.as_bytes());
                digest.update([0]);
            }
            for entry in &descriptor.entries {
                digest.update(entry.key.as_bytes());
                digest.update([0]);
                digest.update(entry.value.as_bytes());
                digest.update([0]);
            }
            let key = format!(
                "{}{}:{}",
                self.prefix,
                window.as_secs(),
                hex::encode(&digest.finalize()[..16])
            );
            let check = match by_key.get(&key) {
                Some(&index) => {
                    let c = &mut checks[index];
                    c.hits = c.hits.saturating_add(hits);
                    index
                }
                None => {
                    by_key.insert(key.clone(), checks.len());
                    checks.push(Check {
                        rule: RULE_BASE + rule,
                        key,
                        limit,
                        window,
                        hits,
                    });
                    checks.len() - 1
                }
            };
            plans.push(Plan::Limited { rule, check });
        }
        (plans, checks)
    }

    /// Decides `checks`: whether an enforced rule refused the request, the state of
    /// every check, and which shadow rules would have refused it while it passed.
    async fn decide(
        &self,
        checks: &[Check],
        loaded: &Loaded,
        span: &mut crate::otel::Child,
    ) -> Result<(bool, Vec<RuleState>, Vec<bool>), Error> {
        let shadow =
            |check: &Check| self.shadow_all || loaded.file.rules()[check.rule - RULE_BASE].shadow;
        let mut states = vec![
            RuleState {
                remaining: 0,
                reset: Duration::ZERO
            };
            checks.len()
        ];
        let mut shadow_over = vec![false; checks.len()];
        let mut active: Vec<usize> = (0..checks.len()).collect();
        // Each round leaves out at least one shadow rule, or ends.
        while !active.is_empty() {
            let batch: Vec<Check> = active.iter().map(|&i| checks[i].clone()).collect();
            let outcome = self.limiter.outcome(&batch, span).await?;
            for (&i, state) in active.iter().zip(&outcome.states) {
                states[i] = *state;
            }
            if outcome.allowed {
                break;
            }
            let refusing: Vec<usize> = (active.iter().zip(&outcome.states))
                .filter(|&(&i, state)| state.remaining < checks[i].hits)
                .map(|(&i, _)| i)
                .collect();
            if refusing.is_empty() || refusing.iter().any(|&i| !shadow(&checks[i])) {
                return Ok((true, states, shadow_over));
            }
            for &i in &refusing {
                shadow_over[i] = true;
            }
            active.retain(|&i| !shadow_over[i]);
        }
        Ok((false, states, shadow_over))
    }
}

/// The hits a descriptor adds: its own `hits_addend`, else the request's; 0 is 1.
fn hits(
    request: &RateLimitRequest,
    descriptor: &envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor,
) -> u32 {
    let own = descriptor.hits_addend.as_ref().map(|v| v.value);
    let hits = own.unwrap_or(u64::from(request.hits_addend)).max(1);
    // Bounded by `validate`.
    u32::try_from(hits.min(MAX_HITS)).unwrap_or(1)
}

/// Refuses a request beyond the bounds, before anything is looked up.
fn validate(request: &RateLimitRequest) -> Result<(), Error> {
    let bad = |field: &'static str, description: String| {
        Err(Error::InvalidArgument(vec![FieldViolation {
            field,
            description,
        }]))
    };
    if request.domain.is_empty() || request.domain.len() > MAX_TEXT {
        return bad("domain", format!("must be 1 to {MAX_TEXT} bytes"));
    }
    if request.descriptors.is_empty() || request.descriptors.len() > MAX_DESCRIPTORS {
        return bad(
            "descriptors",
            format!("must hold 1 to {MAX_DESCRIPTORS} descriptors"),
        );
    }
    if u64::from(request.hits_addend) > MAX_HITS {
        return bad("hits_addend", format!("must be at most {MAX_HITS}"));
    }
    for descriptor in &request.descriptors {
        if descriptor.entries.is_empty() || descriptor.entries.len() > MAX_DEPTH {
            return bad(
                "descriptors.entries",
                format!("must hold 1 to {MAX_DEPTH} entries"),
            );
        }
        let long = |e: &&envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry| {
            e.key.is_empty() || e.key.len() > MAX_TEXT || e.value.len() > MAX_TEXT
        };
        if descriptor.entries.iter().any(|e| long(&e)) {
            return bad(
                "descriptors.entries",
                format!("a key must be 1 to {MAX_TEXT} bytes, a value at most {MAX_TEXT}"),
            );
        }
        if descriptor
            .hits_addend
            .as_ref()
            .is_some_and(|v| v.value > MAX_HITS)
        {
            return bad(
                "descriptors.hits_addend",
                format!("must be at most {MAX_HITS}"),
            );
        }
        if descriptor.is_negative_hits {
            return bad("descriptors.is_negative_hits", "is not supported".into());
        }
    }
    Ok(())
}

fn status(
    code: Code,
    limit: Option<RateLimit>,
    remaining: u32,
    reset: Duration,
) -> DescriptorStatus {
    DescriptorStatus {
        code: code as i32,
        current_limit: limit,
        limit_remaining: remaining,
        duration_until_reset: Some(ProtoDuration {
            seconds: i64::try_from(reset.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(reset.subsec_nanos()).unwrap_or(0),
        }),
        ..Default::default()
    }
}

/// A rule name as a structured-field string (RFC 8941): printable ASCII, with `"`
/// and `\` (which would need escapes) and anything else replaced by `_`.
fn field_name(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ' '..='~' if c != '"' && c != '\\' => c,
            _ => '_',
        })
        .collect()
}

/// The gRPC service around [`DescriptorLimits`], on authd's codec: a request that
/// does not decode is INVALID_ARGUMENT with a generic message, as for AuthService.
#[derive(Clone)]
pub(crate) struct RateLimitServer {
    limits: Arc<DescriptorLimits>,
    max_message: usize,
}

impl RateLimitServer {
    pub(crate) fn new(limits: Arc<DescriptorLimits>, max_message: usize) -> Self {
        RateLimitServer {
            limits,
            max_message,
        }
    }
}

impl tonic::server::NamedService for RateLimitServer {
    const NAME: &'static str =
        envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::SERVICE_NAME;
}

/// ShouldRateLimit, as tonic's unary machinery calls it.
struct ShouldRateLimit(Arc<DescriptorLimits>);

impl tonic::server::UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future =
        crate::middleware::BoxFuture<Result<tonic::Response<RateLimitResponse>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<RateLimitRequest>) -> Self::Future {
        let limits = self.0.clone();
        Box::pin(async move {
            let id = request.extensions().get::<crate::rpc::RequestId>();
            let id = id.map(crate::rpc::RequestId::as_str);
            match limits.should_rate_limit(request.get_ref(), id).await {
                Ok(response) => Ok(tonic::Response::new(response)),
                Err(err) => Err(err.to_status()),
            }
        })
    }
}

impl tower::Service<http::Request<tonic::body::Body>> for RateLimitServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = crate::middleware::BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let (limits, max) = (self.limits.clone(), self.max_message);
        Box::pin(async move {
            if !req.uri().path().ends_with("/ShouldRateLimit") {
                return Ok(tonic::Status::unimplemented("").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(RequestCodec::default())
                .apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(ShouldRateLimit(limits), req).await)
        })
    }
}
