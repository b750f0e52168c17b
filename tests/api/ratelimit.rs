//! Rate limiting through the real server: exact global limits across replicas on a
//! real Redis (`AUTHD_TEST_REDIS_URL`, each test under its own key prefix), sliding
//! rather than fixed windows, per-client keys, the fallback while Redis fails and
//! the return to it, and the exemption of health and reflection.
//!
//! No verdict here depends on how fast the machine is: windows are long beside any
//! test's run time, and the sliding window on Redis is shown by placing entries at
//! chosen ages (Redis keeps its own clock); the in-process limiter's window logic is
//! tested with a clock its unit tests control (`ratelimit::limiter`).
//!
//! Tests without Redis in their name run on the in-process limiter and need nothing.

use crate::helpers::{
    ProxiedRedis, TestApp, expect_code, metric_of, redis_url, spawn_app_with, unique_name,
    wait_until,
};
use authd::{
    FailureMode, RateLimitBackend as Backend,
    config::Config,
    pb::{
        LoginRequest, RegisterRequest, ValidateTokenRequest, auth_service_client::AuthServiceClient,
    },
};
use std::{net::IpAddr, process::Command, time::Duration};
use tonic::{Code, Request, Status, transport::Channel};
use tonic_types::StatusExt as _;

const USER: &str = "alice";
const PASSWORD: &str = "correct horse battery";

/// Redis settings for `c`: the test server, a prefix of its own, `rules`.
fn with_redis(c: &mut Config, url: &str, prefix: &str, rules: &str) {
    c.limits.redis_url = Some(url.parse().expect("a Redis URL"));
    c.limits.rate_limit_prefix = prefix.to_owned();
    c.limits.rate_limits = Some(rules.parse().expect("valid rules"));
    // Unoptimized servers and the whole test suite share two cores: an answer can
    // take longer than the production default of 50ms (a burst of 100 calls queued on
    // one connection of a busy machine has taken over 1 s), and a timeout (rightly)
    // falls back to the per-replica limiter, which is not what most tests look at.
    // Tests of a slow Redis set their own.
    c.limits.redis_timeout = Duration::from_secs(10);
}

fn login_request(username: &str) -> LoginRequest {
    LoginRequest {
        username: username.into(),
        password: PASSWORD.into(),
    }
}

/// A login of the registered user: OK, or the status that refused it.
async fn login(client: &mut AuthServiceClient<Channel>) -> Result<(), Status> {
    client.login(login_request(USER)).await.map(|_| ())
}

/// Tallies outcomes: OK and RESOURCE_EXHAUSTED; anything else fails the test.
#[derive(Default, Debug)]
struct Tally {
    ok: usize,
    refused: Vec<Status>,
}

impl Tally {
    fn add(&mut self, result: Result<(), Status>) {
        match result {
            Ok(()) => self.ok += 1,
            Err(s) if s.code() == Code::ResourceExhausted => self.refused.push(s),
            Err(s) => panic!("expected OK or RESOURCE_EXHAUSTED, got {s:?}"),
        }
    }
}

/// `n` logins of the registered user, all at once, spread over `clients`.
async fn burst(clients: &[AuthServiceClient<Channel>], n: usize) -> Tally {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let mut client = clients[i % clients.len()].clone();
            tokio::spawn(async move { login(&mut client).await })
        })
        .collect();
    let mut tally = Tally::default();
    for task in tasks {
        tally.add(task.await.unwrap());
    }
    tally
}

fn metadata<'a>(status: &'a Status, key: &str) -> Option<&'a str> {
    status.metadata().get(key).map(|v| v.to_str().unwrap())
}

/// Checks everything a rate-limited client is told, and returns the retry delay.
#[track_caller]
fn assert_rate_limited(status: &Status, rule: &str, limit: u32) -> Duration {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let delay = status
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .expect("RetryInfo with a delay");
    let quota = status.get_details_quota_failure().expect("QuotaFailure");
    let subjects: Vec<_> = quota
        .violations
        .iter()
        .map(|v| v.subject.as_str())
        .collect();
    assert!(subjects.contains(&rule), "{subjects:?} lacks {rule}");
    let secs: u64 = metadata(status, "retry-after")
        .expect("retry-after")
        .parse()
        .unwrap();
    assert!(
        secs >= 1 && secs >= delay.as_secs(),
        "retry-after {secs} vs {delay:?}"
    );
    assert_eq!(
        metadata(status, "ratelimit-limit"),
        Some(limit.to_string().as_str())
    );
    assert_eq!(metadata(status, "ratelimit-remaining"), Some("0"));
    assert!(metadata(status, "ratelimit-reset").is_some());
    delay
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_the_limit_passes_across_three_replicas_on_redis() {
    let Some(url) = redis_url("exactly_the_limit_passes_across_three_replicas_on_redis") else {
        return;
    };
    let prefix = unique_name("rl");
    // A window far longer than any burst takes, however busy the machine.
    let rule = "Login:global=50/1h";
    let mut apps = Vec::new();
    for _ in 0..3 {
        let mut app = spawn_app_with(|c| with_redis(c, &url, &prefix, rule)).await;
        // Each replica has its own database here; Register is not limited.
        app.register(USER, PASSWORD).await.unwrap();
        assert_eq!(app.handle.rate_limit_stats().backend, Backend::Redis);
        apps.push(app);
    }
    let clients: Vec<_> = apps.iter().map(|a| a.client.clone()).collect();

    let tally = burst(&clients, 300).await;
    // Every decision was Redis' (a timeout would fall back to a replica's own count,
    // which may pass more): checked first, so that a failure says why.
    let stats: Vec<_> = apps.iter().map(|a| a.handle.rate_limit_stats()).collect();
    assert!(
        stats
            .iter()
            .all(|s| s.local_decisions == 0 && s.redis_failures == 0),
        "{stats:?}"
    );
    assert_eq!(
        tally.ok, 50,
        "exactly the limit passes, across all replicas"
    );
    assert_eq!(tally.refused.len(), 250);
    for status in &tally.refused {
        let delay = assert_rate_limited(status, rule, 50);
        assert!(delay <= Duration::from_secs(3600), "{delay:?}");
    }
    let mut counted = [0.0; 3];
    for app in &apps {
        let text = app.handle.render_metrics();
        for (i, line) in [
            r#"authd_ratelimit_requests_total{outcome="admitted"}"#,
            r#"authd_ratelimit_requests_total{outcome="refused"}"#,
            r#"authd_ratelimit_refusals_total{rule="Login:global=50/1h"}"#,
        ]
        .iter()
        .enumerate()
        {
            counted[i] += metric_of(&text, line);
        }
    }
    // The metrics say what the clients saw: admitted, refused, and by which rule.
    assert_eq!(counted, [50.0, 250.0, 250.0]);
}

/// Redis' own clock, in microseconds since the epoch.
async fn redis_now_us(redis: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(redis).await.unwrap();
    secs * 1_000_000 + micros
}

/// Puts `n` entries, `age` old by Redis' clock, in the log of a `Login:global` rule
/// with a `window_ms` window under `prefix`: requests that the limiter allowed then.
async fn seed_log(
    redis: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    window_ms: u64,
    n: usize,
    age: Duration,
) {
    let key = format!("{prefix}:Login:global:{window_ms}:{{}}");
    let at = redis_now_us(redis).await - age.as_micros() as i64;
    for i in 0..n {
        let member = format!("seed-{}-{i}", age.as_millis());
        let _: i64 = redis::cmd("ZADD")
            .arg(&key)
            .arg(at)
            .arg(member)
            .query_async(redis)
            .await
            .unwrap();
    }
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&key)
        .arg(window_ms * 2)
        .query_async(redis)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_slides_on_redis() {
    let Some(url) = redis_url("the_window_slides_on_redis") else {
        return;
    };
    let prefix = unique_name("rl");
    let rule = "Login:global=50/10s";
    let mut app = spawn_app_with(|c| with_redis(c, &url, &prefix, rule)).await;
    app.register(USER, PASSWORD).await.unwrap();
    let mut redis = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let clients = [app.client.clone()];

    // A full log whose entries are 5 s old: still in the 10 s window, so nothing
    // passes, and the wait is until they leave it, about 5 s from now.
    seed_log(&mut redis, &prefix, 10_000, 50, Duration::from_secs(5)).await;
    let refused = burst(&clients, 3).await;
    assert_eq!(refused.ok, 0);
    let delay = assert_rate_limited(&refused.refused[0], rule, 50);
    assert!(
        delay > Duration::ZERO && delay <= Duration::from_secs(5),
        "{delay:?}"
    );
    let _: i64 = redis::cmd("DEL")
        .arg(format!("{prefix}:Login:global:10000:{{}}"))
        .query_async(&mut redis)
        .await
        .unwrap();

    // 50 entries 11 s old have left the window: a fixed window that began with them
    // would still be full, a sliding log lets the whole limit through again.
    seed_log(&mut redis, &prefix, 10_000, 50, Duration::from_secs(11)).await;
    assert_eq!(burst(&clients, 60).await.ok, 50);

    // Half of a full log in the window, half out: half the limit passes.
    let _: i64 = redis::cmd("DEL")
        .arg(format!("{prefix}:Login:global:10000:{{}}"))
        .query_async(&mut redis)
        .await
        .unwrap();
    seed_log(&mut redis, &prefix, 10_000, 25, Duration::from_secs(12)).await;
    seed_log(&mut redis, &prefix, 10_000, 25, Duration::from_secs(4)).await;
    assert_eq!(burst(&clients, 40).await.ok, 25);
    assert_eq!(app.handle.rate_limit_stats().local_decisions, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_local_limiter_enforces_the_same_rules() {
    let mut app = spawn_app_with(|c| {
        c.limits.rate_limits = Some("Login:global=50/1h".parse().unwrap());
    })
    .await;
    app.register(USER, PASSWORD).await.unwrap();
    let clients = [app.client.clone()];
    let tally = burst(&clients, 60).await;
    assert_eq!(tally.ok, 50);
    assert_rate_limited(&tally.refused[0], "Login:global=50/1h", 50);
    assert_eq!(app.handle.rate_limit_stats().backend, Backend::Local);
}

/// A client of `app` whose connections come from `ip` (any 127.x address works on Linux).
async fn client_from(app: &TestApp, ip: &str) -> AuthServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .local_address(Some(ip.parse::<IpAddr>().unwrap()))
        .connect()
        .await
        .expect("connect from another loopback address");
    AuthServiceClient::new(channel)
}

async fn validate_as(
    client: &mut AuthServiceClient<Channel>,
    client_id: Option<&str>,
) -> Result<(), Status> {
    let mut request = Request::new(ValidateTokenRequest {
        access_token: "not-a-token".into(),
        ..Default::default()
    });
    if let Some(id) = client_id {
        request
            .metadata_mut()
            .insert("x-client-id", id.parse().unwrap());
    }
    match client.validate_token(request).await {
        // Past the limiter, a bogus token is UNAUTHENTICATED: what matters is that it passed.
        Err(s) if s.code() == Code::Unauthenticated => Ok(()),
        Err(s) => Err(s),
        Ok(_) => panic!("a bogus token validated"),
    }
}

async fn register_as(client: &mut AuthServiceClient<Channel>, name: &str) -> Result<(), Status> {
    client
        .register(RegisterRequest {
            username: name.into(),
            password: PASSWORD.into(),
        })
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_and_header_keys_are_per_client_and_global_is_shared_on_redis() {
    let Some(url) = redis_url("peer_and_header_keys_are_per_client_and_global_is_shared_on_redis")
    else {
        return;
    };
    let prefix = unique_name("rl");
    let rules = "Login:peer=2/1m,ValidateToken:header:x-client-id=2/1m,Register:global=3/1m";
    let mut app = spawn_app_with(|c| with_redis(c, &url, &prefix, rules)).await;
    app.register(USER, PASSWORD).await.unwrap(); // 1 of the 3 registrations
    let mut a = client_from(&app, "127.0.0.2").await;
    let mut b = client_from(&app, "127.0.0.3").await;

    // peer: each address has its own two logins.
    login(&mut a).await.unwrap();
    login(&mut a).await.unwrap();
    assert_rate_limited(&login(&mut a).await.unwrap_err(), "Login:peer=2/1m", 2);
    login(&mut b).await.unwrap();
    login(&mut b).await.unwrap();
    expect_code(login(&mut b).await, Code::ResourceExhausted);

    // header: each x-client-id value has its own two, whoever sends it; a request
    // without the header is not counted by a header rule.
    validate_as(&mut a, Some("app-1")).await.unwrap();
    validate_as(&mut b, Some("app-1")).await.unwrap();
    let refused = validate_as(&mut a, Some("app-1")).await.unwrap_err();
    assert_rate_limited(&refused, "ValidateToken:header:x-client-id=2/1m", 2);
    validate_as(&mut a, Some("app-2")).await.unwrap();
    validate_as(&mut a, Some("app-2")).await.unwrap();
    for _ in 0..5 {
        validate_as(&mut a, None).await.unwrap();
    }

    // global: one count for everyone.
    register_as(&mut a, "bob").await.unwrap();
    register_as(&mut b, "carol").await.unwrap();
    let refused = register_as(&mut a, "dave").await.unwrap_err();
    assert_rate_limited(&refused, "Register:global=3/1m", 3);
    expect_code(register_as(&mut b, "erin").await, Code::ResourceExhausted);
    assert_eq!(app.handle.rate_limit_stats().local_decisions, 0);
}

#[tokio::test]
async fn forwarded_for_counts_peers_only_when_trusted() {
    let login_from = |client: &AuthServiceClient<Channel>, hop: &'static str| {
        let mut client = client.clone();
        async move {
            let mut request = Request::new(login_request(USER));
            request.metadata_mut().insert(
                "x-forwarded-for",
                format!("{hop}, 10.0.0.1").parse().unwrap(),
            );
            client.login(request).await.map(|_| ())
        }
    };
    for trusted in [false, true] {
        let mut app = spawn_app_with(|c| {
            c.limits.rate_limits = Some("Login:peer=1/1m".parse().unwrap());
            c.limits.trust_forwarded_for = trusted;
        })
        .await;
        app.register(USER, PASSWORD).await.unwrap();
        login_from(&app.client, "203.0.113.1").await.unwrap();
        let second = login_from(&app.client, "203.0.113.2").await;
        if trusted {
            second.expect("another forwarded client has its own limit");
            expect_code(
                login_from(&app.client, "203.0.113.1").await,
                Code::ResourceExhausted,
            );
        } else {
            // Untrusted, the header is ignored: both come from 127.0.0.1.
            expect_code(second, Code::ResourceExhausted);
        }
    }
}

#[tokio::test]
async fn allowed_responses_carry_the_quota() {
    let mut app = spawn_app_with(|c| {
        c.limits.rate_limits = Some("Login:peer=3/1m,Login:global=100/1m".parse().unwrap());
    })
    .await;
    app.register(USER, PASSWORD).await.unwrap();
    for remaining in ["2", "1"] {
        let response = app.client.login(login_request(USER)).await.unwrap();
        let md = response.metadata();
        // The rule closest to refusing is reported.
        assert_eq!(md.get("ratelimit-limit").unwrap(), "3");
        assert_eq!(md.get("ratelimit-remaining").unwrap(), remaining);
        // Room left: another request may come at once.
        assert_eq!(md.get("ratelimit-reset").unwrap(), "0");
    }
    // A wrong password passed the limiter (and counts): its error carries the quota too.
    let wrong = expect_code(
        app.login(USER, "wrong password").await,
        Code::Unauthenticated,
    );
    assert_eq!(metadata(&wrong, "ratelimit-remaining"), Some("0"));
    assert_eq!(metadata(&wrong, "ratelimit-reset"), Some("60"));
    let refused = app.login(USER, PASSWORD).await.unwrap_err();
    assert_rate_limited(&refused, "Login:peer=3/1m", 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_costs_one_timeout_then_the_local_limiter_serves_until_it_answers() {
    let Some(redis) = ProxiedRedis::start(
        "a_hung_redis_costs_one_timeout_then_the_local_limiter_serves_until_it_answers",
    )
    .await
    else {
        return;
    };
    let mut app = spawn_app_with(|c| {
        with_redis(c, &redis.url, &redis.prefix, "Login:global=5/1m");
        // Short enough to see that a hung Redis costs one timeout, long enough that a
        // busy test machine does not time out before the freeze.
        c.limits.redis_timeout = Duration::from_millis(250);
    })
    .await;
    app.register(USER, PASSWORD).await.unwrap();
    login(&mut app.client).await.unwrap(); // 1 of 5 on Redis
    assert_eq!(app.handle.rate_limit_stats().backend, Backend::Redis);

    redis.proxy.stall();
    // The first request waits out the timeout, then the local limiter decides.
    // One timeout, not a hang (the proxy holds Redis for as long as the test wants).
    login(&mut app.client)
        .await
        .expect("served under the local limiter");
    let stats = app.handle.rate_limit_stats();
    assert_eq!(stats.backend, Backend::Degraded);
    assert_eq!(stats.redis_failures, 1);
    assert_metrics(
        &app,
        &[
            r#"authd_ratelimit_redis_errors_total{kind="timeout"} 1"#,
            "authd_ratelimit_fallback_active 1",
            // Both Redis calls are timed: the decision before the freeze, and the timeout.
            "authd_ratelimit_redis_duration_seconds_count 2",
        ],
    );

    // Later requests do not ask Redis at all: no more timeouts. The local limiter
    // enforces the same rule per replica (its log starts empty: 5 more pass).
    let mut tally = Tally::default();
    for _ in 0..10 {
        tally.add(login(&mut app.client).await);
    }
    assert_eq!(tally.ok, 4, "1 + 4 = the local limit of 5");
    assert_rate_limited(&tally.refused[0], "Login:global=5/1m", 5);
    assert_eq!(app.handle.rate_limit_stats().redis_failures, 1);
    assert_eq!(
        app.health_status("").await,
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );

    // Redis answers again: authd returns to it by itself, and Redis still holds the
    // one login it counted before the outage.
    redis.proxy.restore();
    let handle = app.handle.clone();
    wait_until("the limiter is back on Redis", || {
        handle.rate_limit_stats().backend == Backend::Redis
    })
    .await;
    let before = app.handle.rate_limit_stats().redis_decisions;
    let mut tally = Tally::default();
    for _ in 0..6 {
        tally.add(login(&mut app.client).await);
    }
    // Redis counted the login before the outage and the one whose answer timed out:
    // that request reached Redis after all (the proxy held it), and counts. Erring
    // towards refusing is the safe side of a lost answer.
    assert_eq!(tally.ok, 3, "Redis had 2 of 5");
    assert_eq!(app.handle.rate_limit_stats().redis_decisions, before + 6);
    assert_metrics(&app, &["authd_ratelimit_fallback_active 0"]);
}

/// Asserts that the app's metrics, in the text format, contain each line.
fn assert_metrics(app: &crate::helpers::TestApp, lines: &[&str]) {
    let text = app.handle.render_metrics();
    for line in lines {
        assert!(text.contains(line), "{line} missing in:\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_limiter_and_the_login_throttle_share_one_redis_connection() {
    let Some(redis) =
        ProxiedRedis::start("the_rate_limiter_and_the_login_throttle_share_one_redis_connection")
            .await
    else {
        return;
    };
    let mut app =
        spawn_app_with(|c| with_redis(c, &redis.url, &redis.prefix, "Login:global=100/1m")).await;
    assert_eq!(app.handle.rate_limit_stats().backend, Backend::Redis);
    app.register(USER, PASSWORD).await.unwrap();
    // A failed login: a rate-limit decision, then the throttle's read and count.
    let wrong = app
        .client
        .login(LoginRequest {
            username: USER.into(),
            password: "not the password".into(),
        })
        .await;
    expect_code(wrong, Code::Unauthenticated);
    login(&mut app.client).await.unwrap();
    let stats = app.handle.rate_limit_stats();
    assert_eq!(
        (stats.redis_decisions, stats.redis_failures),
        (2, 0),
        "{stats:?}"
    );
    let text = app.handle.render_metrics();
    // The throttle counted in Redis, not in the replica's own map.
    assert_eq!(metric_of(&text, "authd_login_throttle_local_entries"), 0.0);
    assert_eq!(
        metric_of(&text, "authd_login_throttle_redis_errors_total"),
        0.0
    );
    assert_eq!(redis.proxy.accepted(), 1, "one connection for both");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_down_at_start_does_not_stop_authd_and_is_used_once_it_answers() {
    let Some(redis) = ProxiedRedis::start(
        "a_redis_down_at_start_does_not_stop_authd_and_is_used_once_it_answers",
    )
    .await
    else {
        return;
    };
    redis.proxy.cut();
    let mut app =
        spawn_app_with(|c| with_redis(c, &redis.url, &redis.prefix, "Login:global=2/1m")).await;
    assert_eq!(app.handle.rate_limit_stats().backend, Backend::Degraded);
    use tonic_health::pb::health_check_response::ServingStatus;
    assert_eq!(app.health_status("").await, ServingStatus::Serving);
    assert_eq!(
        app.health_status("auth.v1.AuthService").await,
        ServingStatus::Serving
    );
    app.register(USER, PASSWORD).await.unwrap();
    login(&mut app.client).await.unwrap();
    login(&mut app.client).await.unwrap();
    expect_code(login(&mut app.client).await, Code::ResourceExhausted);
    assert_eq!(app.handle.rate_limit_stats().redis_decisions, 0);

    redis.proxy.restore();
    let handle = app.handle.clone();
    wait_until("the limiter is on Redis", || {
        handle.rate_limit_stats().backend == Backend::Redis
    })
    .await;
    // Redis has counted nothing yet: its own limit of 2 starts now.
    login(&mut app.client).await.unwrap();
    login(&mut app.client).await.unwrap();
    expect_code(login(&mut app.client).await, Code::ResourceExhausted);
    assert_eq!(app.handle.rate_limit_stats().redis_decisions, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_refuses_with_unavailable_while_redis_is_down_and_recovers() {
    let Some(redis) = ProxiedRedis::start(
        "fail_closed_refuses_with_unavailable_while_redis_is_down_and_recovers",
    )
    .await
    else {
        return;
    };
    let mut app = spawn_app_with(|c| {
        with_redis(c, &redis.url, &redis.prefix, "Login:global=100/1m");
        c.limits.rate_limit_failure = FailureMode::Closed;
    })
    .await;
    app.register(USER, PASSWORD).await.unwrap();
    login(&mut app.client).await.unwrap();

    redis.proxy.cut();
    let status = expect_code(login(&mut app.client).await, Code::Unavailable);
    assert!(status.message().contains("Redis"), "{status:?}");
    expect_code(login(&mut app.client).await, Code::Unavailable);
    // Only rate-limited requests are refused: Register has no rule, health is SERVING.
    app.register("bob", PASSWORD).await.unwrap();
    use tonic_health::pb::health_check_response::ServingStatus;
    assert_eq!(app.health_status("").await, ServingStatus::Serving);
    let stats = app.handle.rate_limit_stats();
    assert_eq!((stats.backend, stats.unavailable), (Backend::Degraded, 2));
    assert_eq!(stats.local_decisions, 0);
    assert_metrics(
        &app,
        &[
            r#"authd_ratelimit_decisions_total{outcome="unavailable",rule="Login:global=100/1m"} 2"#,
            r#"authd_grpc_requests_total{code="UNAVAILABLE",method="Login",protocol="grpc",service="auth.v1.AuthService"} 2"#,
            "authd_ratelimit_fallback_active 1",
        ],
    );

    redis.proxy.restore();
    let handle = app.handle.clone();
    wait_until("the limiter is back on Redis", || {
        handle.rate_limit_stats().backend == Backend::Redis
    })
    .await;
    // The login throttle's own Redis connection recovers on its own, soon after.
    let client = app.client.clone();
    crate::helpers::wait_for("served again through Redis", || {
        let mut client = client.clone();
        async move {
            match login(&mut client).await {
                Ok(()) => Some(()),
                Err(s) if s.code() == Code::Unavailable => None,
                Err(s) => panic!("served again through Redis: {s:?}"),
            }
        }
    })
    .await;
}

#[tokio::test]
async fn health_and_reflection_pass_when_every_rule_is_exhausted() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest,
    };
    let mut app = spawn_app_with(|c| {
        c.limits.rate_limits = Some("*:global=1/1m,*:peer=1/1m".parse().unwrap());
    })
    .await;
    expect_code(
        app.login(USER, PASSWORD).await,
        Code::Unauthenticated, // the one request allowed
    );
    expect_code(app.register(USER, PASSWORD).await, Code::ResourceExhausted);
    expect_code(app.validate("x").await, Code::ResourceExhausted);
    for _ in 0..10 {
        assert_eq!(app.health_status("").await, ServingStatus::Serving);
        assert_eq!(
            app.health_status("auth.v1.AuthService").await,
            ServingStatus::Serving
        );
    }
    let mut reflection = ServerReflectionClient::new(app.channel().await);
    for _ in 0..5 {
        let request = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::ListServices(String::new())),
        };
        let mut responses = reflection
            .server_reflection_info(tokio_stream::iter([request]))
            .await
            .expect("reflection is not limited")
            .into_inner();
        assert!(responses.message().await.unwrap().is_some());
    }
    let stats = app.handle.rate_limit_stats();
    assert_eq!((stats.local_decisions, stats.refused), (3, 2));
}

fn authd() -> Command {
    crate::helpers::authd_command()
}

#[test]
fn a_bad_rule_stops_the_start_with_a_line_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    for (rules, expected) in [
        (
            "Login:peer=20/1s,Logn:peer=5/1s",
            r#"rule "Logn:peer=5/1s": unknown method "Logn""#,
        ),
        (
            "Login:ip=20/1s",
            r#"rule "Login:ip=20/1s": unknown key "ip""#,
        ),
        ("Login:peer=0/1s", "the limit must be at least 1"),
        ("Login:peer=20/soon", r#"window "soon""#),
        ("Login:peer=20", "expected METHOD:KEY=LIMIT/WINDOW"),
    ] {
        let out = authd()
            .env("AUTHD_RATE_LIMITS", rules)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{rules:?} was accepted");
        let stderr = String::from_utf8(out.stderr).unwrap();
        let first = stderr.lines().next().unwrap_or_default();
        assert!(first.starts_with("error:"), "{rules:?}: {stderr}");
        assert!(first.contains(expected), "{rules:?}: {first}");
    }
}

#[test]
fn the_redis_password_is_never_printed() {
    let out = authd()
        .args(["--redis-url", "redis://:hunter2@cache:notaport"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("--redis-url"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");

    let out = authd()
        .env("AUTHD_REDIS_URL", "redis://:hunter2@cache:6379")
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(!help.contains("hunter2"), "{help}");
    for (var, default) in [
        ("AUTHD_REDIS_URL", None),
        ("AUTHD_RATE_LIMITS", None),
        ("AUTHD_RATE_LIMIT_PREFIX", Some("authd:rl")),
        ("AUTHD_REDIS_TIMEOUT", Some("50ms")),
        ("AUTHD_RATE_LIMIT_FAILURE", Some("open")),
        ("AUTHD_TRUST_FORWARDED_FOR", Some("false")),
    ] {
        assert!(help.contains(&format!("env: {var}")), "--help lacks {var}");
        if let Some(default) = default {
            assert!(
                help.contains(&format!("[default: {default}]")),
                "--help lacks {default}"
            );
        }
    }
}
