//! Envoy's rate limit service (`envoy.service.ratelimit.v3.RateLimitService`) through
//! the real server and a tonic client built from Envoy's protos (the `envoy-types`
//! crate): descriptor matching, hits, remaining and reset, the IETF headers,
//! shadow mode, `unlimited`, unknown descriptors, the rules file rewritten or
//! broken while serving, exactness over window edges, and on a real Redis
//! (`AUTHD_TEST_REDIS_URL`, each test under its own key prefix) replicas sharing
//! one limit exactly.
//!
//! Verdicts count decisions, never time: windows are driven by a clock the test
//! controls (the in-process tier), or are long beside the test (Redis keeps its own
//! clock).

use crate::helpers::{TestApp, expect_code, metric, redis_url, spawn_app_with, unique_name};
use authd::{ManualClock, config::Config};
use envoy_types::pb::{
    envoy::{
        extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
        service::ratelimit::v3::{
            RateLimitRequest, RateLimitResponse, rate_limit_response::Code,
            rate_limit_service_client::RateLimitServiceClient,
        },
    },
    google::protobuf::UInt64Value,
};
use futures::future::join_all;
use std::{path::PathBuf, sync::Arc, time::Duration};
use tonic::transport::Channel;

pub(crate) const RULES: &str = r#"
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 2, name: login}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: {unit: hour, requests_per_unit: 5}
      - key: plan
        value: trial
        shadow_mode: true
        rate_limit: {unit: hour, requests_per_unit: 1}
      - key: plan
        value: internal
        rate_limit: {unlimited: true}
  - key: burst
    rate_limit: {unit: second, requests_per_unit: 4}
"#;

/// A rules file in a directory of its own, kept as long as the value.
struct RulesFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl RulesFile {
    fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rules.yaml");
        std::fs::write(&path, text).unwrap();
        RulesFile { _dir: dir, path }
    }

    fn rewrite(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }
}

struct Rls {
    app: TestApp,
    client: RateLimitServiceClient<Channel>,
    file: RulesFile,
    clock: Arc<ManualClock>,
}

/// An app serving `rules`, on Redis when `redis` names one (under a prefix of its
/// own), in process otherwise, with a clock the test moves.
async fn spawn_rls(
    rules: &str,
    redis: Option<(&str, &str)>,
    adjust: impl FnOnce(&mut Config),
) -> Rls {
    let file = RulesFile::new(rules);
    let clock = Arc::new(ManualClock::new());
    let app = spawn_app_with(|c| {
        c.limits.rate_limit_rules_file = Some(file.path.clone());
        c.clock = Some(clock.clone());
        if let Some((url, prefix)) = redis {
            c.limits.redis_url = Some(url.parse().unwrap());
            c.limits.rate_limit_prefix = prefix.to_owned();
            c.limits.redis_timeout = Duration::from_secs(10);
        }
        adjust(c);
    })
    .await;
    let client = RateLimitServiceClient::new(app.channel().await);
    Rls {
        app,
        client,
        file,
        clock,
    }
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).into(),
                value: (*value).into(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(req)
        .await
        .expect("an answer")
        .into_inner()
}

fn over(response: &RateLimitResponse) -> bool {
    response.overall_code == Code::OverLimit as i32
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    (response.response_headers_to_add.iter())
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

/// `n` asks of `req`, one after the other: how many were OK.
async fn oks(
    client: &mut RateLimitServiceClient<Channel>,
    req: &RateLimitRequest,
    n: usize,
) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        ok += usize::from(!over(&ask(client, req.clone()).await));
    }
    ok
}

/// Matching, hits, remaining, reset, headers, `unlimited` and unknown descriptors,
/// on whichever tier `redis` picks.
async fn matching_and_answers(redis: Option<(&str, &str)>) {
    let mut rls = spawn_rls(RULES, redis, |_| {}).await;
    let c = &mut rls.client;

    // The value-specific entry wins over the key-only one.
    let login = request("edge", &[&[("path", "/login")]]);
    let first = ask(c, login.clone()).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    let status = &first.statuses[0];
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.name.as_str(), limit.requests_per_unit, limit.unit),
        ("login", 2, 2)
    );
    assert_eq!(status.limit_remaining, 1);
    assert_eq!(
        header(&first, "RateLimit-Policy"),
        Some(r#""login";q=2;w=60"#)
    );
    assert_eq!(header(&first, "RateLimit"), Some(r#""login";r=1;t=0"#));
    let second = ask(c, login.clone()).await;
    assert_eq!(second.statuses[0].limit_remaining, 0);
    let reset = second.statuses[0].duration_until_reset.unwrap();
    assert!(reset.seconds > 50 && reset.seconds <= 60, "{reset:?}");
    let third = ask(c, login.clone()).await;
    assert!(over(&third));
    assert_eq!(third.statuses[0].code, Code::OverLimit as i32);
    // Another path: the key-only rule, 100 a minute, counted per value.
    let other = ask(c, request("edge", &[&[("path", "/other")]])).await;
    assert_eq!(other.statuses[0].limit_remaining, 99);
    assert_eq!(
        other.statuses[0].current_limit.as_ref().unwrap().name,
        "path"
    );

    // Nested: the last entry's node.
    let free = request("edge", &[&[("tenant", "acme"), ("plan", "free")]]);
    let answer = ask(c, free.clone()).await;
    assert_eq!(answer.statuses[0].limit_remaining, 4);
    assert_eq!(answer.statuses[0].current_limit.as_ref().unwrap().unit, 3);
    // hits_addend: the request's, then a descriptor's own; 3 more do not fit in 4 - 2.
    let mut heavy = free.clone();
    heavy.hits_addend = 2;
    assert_eq!(ask(c, heavy.clone()).await.statuses[0].limit_remaining, 2);
    heavy.descriptors[0].hits_addend = Some(UInt64Value { value: 3 });
    let refused = ask(c, heavy.clone()).await;
    assert!(over(&refused));
    assert_eq!(
        refused.statuses[0].limit_remaining, 2,
        "a refusal adds nothing"
    );
    heavy.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    assert_eq!(ask(c, heavy).await.statuses[0].limit_remaining, 0);
    assert!(over(&ask(c, free).await));

    // unlimited, an intermediate node, unknown keys and domains: OK, no limit.
    let internal = ask(
        c,
        request("edge", &[&[("tenant", "acme"), ("plan", "internal")]]),
    )
    .await;
    assert_eq!(internal.statuses[0].limit_remaining, u32::MAX);
    assert!(internal.statuses[0].current_limit.is_none());
    for req in [
        request("edge", &[&[("tenant", "acme")]]),
        request("edge", &[&[("unknown", "x")]]),
        request("nowhere", &[&[("path", "/login")]]),
    ] {
        let answer = ask(c, req).await;
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert!(answer.statuses[0].current_limit.is_none());
        assert!(answer.response_headers_to_add.is_empty());
    }

    // All or nothing: a descriptor over its limit makes the others not count.
    let both = request(
        "edge",
        &[&[("remote_address", "10.0.0.9")], &[("path", "/login")]],
    );
    let answer = ask(c, both).await;
    assert!(over(&answer));
    assert_eq!(answer.statuses[0].code, Code::Ok as i32);
    assert_eq!(answer.statuses[0].limit_remaining, 3, "not counted");
    assert_eq!(answer.statuses[1].code, Code::OverLimit as i32);
    let alone = ask(c, request("edge", &[&[("remote_address", "10.0.0.9")]])).await;
    assert_eq!(alone.statuses[0].limit_remaining, 2);
    let text = rls.app.handle.render_metrics();
    let series = r#"authd_ratelimit_descriptor_decisions_total{domain="edge",outcome="over_limit",rule="login"}"#;
    assert_eq!(metric(&text, series), Some(2.0), "{text}");
}

#[tokio::test]
async fn descriptors_match_count_and_answer_in_process() {
    matching_and_answers(None).await;
}

#[tokio::test]
async fn descriptors_match_count_and_answer_on_redis() {
    let Some(url) = redis_url("descriptors_match_count_and_answer_on_redis") else {
        return;
    };
    matching_and_answers(Some((&url, &unique_name("rls_match")))).await;
}

#[tokio::test]
async fn shadow_rules_count_as_if_enforced_and_never_refuse_in_process() {
    shadow_rules_count_as_if_enforced(None).await;
}

#[tokio::test]
async fn shadow_rules_count_as_if_enforced_and_never_refuse_on_redis() {
    let Some(url) = redis_url("shadow_rules_count_as_if_enforced_and_never_refuse_on_redis") else {
        return;
    };
    shadow_rules_count_as_if_enforced(Some((&url, &unique_name("rls_shadow")))).await;
}

async fn shadow_rules_count_as_if_enforced(redis: Option<(&str, &str)>) {
    let mut rls = spawn_rls(RULES, redis, |_| {}).await;
    let trial = request(
        "edge",
        &[
            &[("tenant", "acme"), ("plan", "trial")],
            &[("remote_address", "10.1.1.1")],
        ],
    );
    let answers: Vec<_> = join_all((0..3).map(|_| {
        let mut c = rls.client.clone();
        let req = trial.clone();
        async move { ask(&mut c, req).await }
    }))
    .await;
    assert!(answers.iter().all(|a| !over(a)), "{answers:?}");
    // The enforced rule beside the shadow one counted every request: 3 of 3.
    let address = ask(
        &mut rls.client,
        request("edge", &[&[("remote_address", "10.1.1.1")]]),
    )
    .await;
    assert!(over(&address));
    // The shadow rule counted one (its limit), and would have refused two.
    let text = rls.app.handle.render_metrics();
    let series = |outcome: &str| {
        format!(
            r#"authd_ratelimit_descriptor_decisions_total{{domain="edge",outcome="{outcome}",rule="tenant/plan=trial"}}"#
        )
    };
    assert_eq!(metric(&text, &series("ok")), Some(1.0), "{text}");
    assert_eq!(
        metric(&text, &series("shadow_over_limit")),
        Some(2.0),
        "{text}"
    );
    // A shadow rule is not announced to clients.
    let answer = ask(
        &mut rls.client,
        request("edge", &[&[("tenant", "b"), ("plan", "trial")]]),
    )
    .await;
    assert!(header(&answer, "RateLimit").is_none());
}

#[tokio::test]
async fn global_shadow_mode_never_answers_over_limit() {
    let mut rls = spawn_rls(RULES, None, |c| c.limits.rate_limit_shadow = true).await;
    let req = request("edge", &[&[("path", "/login")]]);
    assert_eq!(oks(&mut rls.client, &req, 5).await, 5);
    let text = rls.app.handle.render_metrics();
    let series = r#"authd_ratelimit_descriptor_decisions_total{domain="edge",outcome="shadow_over_limit",rule="login"}"#;
    assert_eq!(metric(&text, series), Some(3.0), "{text}");
}

#[tokio::test]
async fn a_rewritten_file_is_in_force_keeping_counts_and_a_broken_one_is_ignored() {
    let mut rls = spawn_rls(RULES, None, |_| {}).await;
    let login = request("edge", &[&[("path", "/login")]]);
    let address = request("edge", &[&[("remote_address", "10.2.2.2")]]);
    assert_eq!(oks(&mut rls.client, &login, 1).await, 1);
    assert_eq!(oks(&mut rls.client, &address, 2).await, 2);
    // Login's limit raised to 4; the address rule unchanged; a new rule beside them.
    let raised = RULES.replace(
        "requests_per_unit: 2, name: login",
        "requests_per_unit: 4, name: login",
    ) + "  - key: new\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
    rls.file.rewrite(&raised);
    assert_eq!(rls.app.handle.reload_rate_limit_rules().await, Ok(true));
    // Counts kept: 1 of login's 4 used, 2 of the address's 3.
    assert_eq!(oks(&mut rls.client, &login, 5).await, 3);
    assert_eq!(oks(&mut rls.client, &address, 5).await, 1);
    assert_eq!(
        oks(&mut rls.client, &request("edge", &[&[("new", "x")]]), 3).await,
        1
    );

    // A broken file: refused with the reason, the rules in force stay.
    rls.file.rewrite("domain: edge\ndescriptors: [{key: path, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n");
    let why = rls.app.handle.reload_rate_limit_rules().await.unwrap_err();
    assert!(why.contains("fortnight"), "{why}");
    let fresh = request("edge", &[&[("path", "/fresh")]]);
    assert_eq!(
        oks(&mut rls.client, &fresh, 3).await,
        3,
        "the 100 a minute rule stays"
    );
    let text = rls.app.handle.render_metrics();
    assert_eq!(
        metric(
            &text,
            r#"authd_ratelimit_rules_reloads_total{outcome="error"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &text,
            r#"authd_ratelimit_rules_reloads_total{outcome="ok"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(&text, "authd_ratelimit_rules_file_refused"),
        Some(1.0)
    );
}

#[tokio::test]
async fn no_window_holds_more_than_the_limit_across_its_edges() {
    // 4 a second, asked from 0.5 s of the test's clock on, every 100 ms, in bursts
    // of 6 at each half second and just before it. A fixed window (reset at each
    // whole second) would let 4 through at 0.5 s and 4 more at 1.0 s: 8 within 1 s.
    let mut rls = spawn_rls(RULES, None, |_| {}).await;
    let req = request("edge", &[&[("burst", "edge-test")]]);
    let mut allowed_at = Vec::new();
    for step in 0..60u64 {
        if step >= 5 {
            let burst = if matches!(step % 5, 0 | 4) { 6 } else { 1 };
            for _ in 0..burst {
                if !over(&ask(&mut rls.client, req.clone()).await) {
                    allowed_at.push(step * 100);
                }
            }
        }
        rls.clock.advance(Duration::from_millis(100));
    }
    for &start in &allowed_at {
        let within = (allowed_at.iter())
            .filter(|&&t| t >= start && t < start + 1000)
            .count();
        assert!(
            within <= 4,
            "{within} OK within 1 s from {start} ms: {allowed_at:?}"
        );
    }
    // Each window is used whole, once its oldest entry has left: 4 at 0.5 s, none at
    // the 1.0 s edge, 4 again at 1.5 s, and so on.
    assert_eq!(
        &allowed_at[..8],
        [500, 500, 500, 500, 1500, 1500, 1500, 1500]
    );
    assert_eq!(allowed_at.len(), 4 * 6, "{allowed_at:?}");
}

/// Many concurrent streams for one key: exactly the limit is OK.
async fn exactly_the_limit_concurrently(apps: &mut [Rls]) {
    let req = request("edge", &[&[("tenant", "race"), ("plan", "free")]]);
    let asks = (0..60).map(|i| {
        let mut client = apps[i % apps.len()].client.clone();
        let req = req.clone();
        async move { !over(&ask(&mut client, req).await) }
    });
    let ok = join_all(asks).await.into_iter().filter(|ok| *ok).count();
    assert_eq!(ok, 5);
}

#[tokio::test]
async fn concurrent_streams_for_one_key_get_exactly_the_limit_in_process() {
    exactly_the_limit_concurrently(&mut [spawn_rls(RULES, None, |_| {}).await]).await;
}

#[tokio::test]
async fn two_replicas_on_one_redis_enforce_one_limit_exactly() {
    let Some(url) = redis_url("two_replicas_on_one_redis_enforce_one_limit_exactly") else {
        return;
    };
    let prefix = unique_name("rls_replicas");
    let a = spawn_rls(RULES, Some((&url, &prefix)), |_| {}).await;
    let b = spawn_rls(RULES, Some((&url, &prefix)), |_| {}).await;
    let mut apps = [a, b];
    exactly_the_limit_concurrently(&mut apps).await;
    for app in &apps {
        assert_eq!(app.app.handle.rate_limit_stats().local_decisions, 0);
    }
}

#[tokio::test]
async fn hostile_requests_are_bounded() {
    let mut rls = spawn_rls(RULES, None, |c| c.limits.rate_limit_max_keys = 100).await;
    let c = &mut rls.client;
    let many: Vec<&[(&str, &str)]> = vec![&[("path", "/x")]; 65];
    let long = "v".repeat(257);
    let deep: Vec<(&str, &str)> = vec![("k", "v"); 17];
    for (what, req) in [
        ("65 descriptors", request("edge", &many)),
        (
            "a long value",
            request("edge", &[&[("path", long.as_str())]]),
        ),
        ("17 entries", request("edge", &[&deep])),
        ("no descriptor", request("edge", &[])),
        ("no domain", request("", &[&[("path", "/x")]])),
        ("an empty descriptor", request("edge", &[&[]])),
    ] {
        let status = c.should_rate_limit(req).await.expect_err(what);
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{what}: {status:?}"
        );
    }
    let mut heavy = request("edge", &[&[("path", "/x")]]);
    heavy.hits_addend = 10_001;
    expect_code(
        c.should_rate_limit(heavy).await,
        tonic::Code::InvalidArgument,
    );
    // Values an attacker invents: the in-process limiter stays within its key cap.
    for i in 0..300 {
        ask(c, request("edge", &[&[("path", &format!("/p{i}"))]])).await;
    }
    let text = rls.app.handle.render_metrics();
    let keys = metric(&text, "authd_ratelimit_local_keys").unwrap();
    assert!(keys <= 100.0 + 8.0, "{keys}");
}

#[tokio::test]
async fn reflection_lists_and_describes_the_rate_limit_service() {
    use tonic_reflection::pb::v1alpha::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let rls = spawn_rls(RULES, None, |_| {}).await;
    let mut client = ServerReflectionClient::new(rls.app.channel().await);
    let requests = [
        MessageRequest::ListServices(String::new()),
        MessageRequest::FileContainingSymbol("envoy.service.ratelimit.v3.RateLimitService".into()),
        // An imported file, so that a client can resolve every field's type.
        MessageRequest::FileByFilename(
            "envoy/extensions/common/ratelimit/v3/ratelimit.proto".into(),
        ),
    ]
    .map(|m| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    });
    let mut responses = client
        .server_reflection_info(tokio_stream::iter(requests))
        .await
        .unwrap()
        .into_inner();
    let mut answers = Vec::new();
    while let Some(r) = responses.message().await.unwrap() {
        answers.push(r.message_response.expect("a response"));
    }
    let MessageResponse::ListServicesResponse(list) = &answers[0] else {
        panic!("{:?}", answers[0]);
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService"),
        "{names:?}"
    );
    for answer in &answers[1..] {
        let MessageResponse::FileDescriptorResponse(files) = answer else {
            panic!("{answer:?}");
        };
        assert!(!files.file_descriptor_proto.is_empty());
    }
    // Without a rules file the service is neither served nor listed.
    let plain = crate::helpers::spawn_app().await;
    let mut client = RateLimitServiceClient::new(plain.channel().await);
    let status = client
        .should_rate_limit(request("edge", &[&[("path", "/x")]]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented);
}

#[tokio::test]
async fn the_files_authd_rules_are_reloaded_live_keeping_counts() {
    let rules = |n: u32| format!("{RULES}---\nauthd: \"Login:global={n}/1m\"\n");
    let mut rls = spawn_rls(&rules(2), None, |_| {}).await;
    let app = &mut rls.app;
    app.register("rita", "a fine password").await.unwrap();
    for _ in 0..2 {
        app.login("rita", "a fine password").await.unwrap();
    }
    let refused = app.login("rita", "a fine password").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
    rls.file.rewrite(&rules(3));
    assert_eq!(app.handle.reload_rate_limit_rules().await, Ok(true));
    // 2 of 3 used already: one more, then refused.
    app.login("rita", "a fine password").await.unwrap();
    let refused = app.login("rita", "a fine password").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::ResourceExhausted);
}

#[tokio::test]
async fn authd_rules_in_the_file_and_in_the_environment_are_refused() {
    let rules = format!("{RULES}---\nauthd: \"Login:global=2/1m\"\n");
    let file = RulesFile::new(&rules);
    let mut config = crate::helpers::test_config(
        format!("sqlite://{}", file.path.with_extension("db").display())
            .parse()
            .unwrap(),
    );
    config.limits.rate_limit_rules_file = Some(file.path.clone());
    config.limits.rate_limits = Some("Login:peer=5/1s".parse().unwrap());
    let err = authd::app::Application::build(config)
        .await
        .err()
        .expect("refused");
    assert!(format!("{err:#}").contains("given twice"), "{err:#}");
    // While serving, a file that gains an authd: section beside AUTHD_RATE_LIMITS is
    // refused whole, and the rules in force stay.
    let mut rls = spawn_rls(RULES, None, |c| {
        c.limits.rate_limits = Some("Login:peer=5/1s".parse().unwrap())
    })
    .await;
    rls.file.rewrite(&rules);
    let why = rls.app.handle.reload_rate_limit_rules().await.unwrap_err();
    assert!(why.contains("given twice"), "{why}");
    let req = request("edge", &[&[("path", "/login")]]);
    assert_eq!(oks(&mut rls.client, &req, 3).await, 2);
}

#[tokio::test]
async fn while_redis_fails_the_configured_failure_mode_applies() {
    let Some(redis) = crate::helpers::ProxiedRedis::start(
        "while_redis_fails_the_configured_failure_mode_applies",
    )
    .await
    else {
        return;
    };
    let req = request("edge", &[&[("path", "/login")]]);
    // Closed: UNAVAILABLE while Redis is cut, and counted as such.
    let mut closed = spawn_rls(RULES, Some((&redis.url, &redis.prefix)), |c| {
        c.limits.rate_limit_failure = authd::FailureMode::Closed;
        c.limits.redis_timeout = Duration::from_millis(250);
    })
    .await;
    assert_eq!(oks(&mut closed.client, &req, 1).await, 1);
    redis.proxy.cut();
    let status = closed
        .client
        .should_rate_limit(req.clone())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable);
    let text = closed.app.handle.render_metrics();
    let series = r#"authd_ratelimit_descriptor_decisions_total{domain="edge",outcome="unavailable",rule="login"}"#;
    assert_eq!(metric(&text, series), Some(1.0), "{text}");
    // Open: the in-process windows decide, with the same limit per replica.
    let mut open = spawn_rls(RULES, Some((&redis.url, &redis.prefix)), |c| {
        c.limits.redis_timeout = Duration::from_millis(250);
    })
    .await;
    assert_eq!(oks(&mut open.client, &req, 4).await, 2);
    assert!(open.app.handle.rate_limit_stats().local_decisions >= 2);
}
