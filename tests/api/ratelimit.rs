//! Rate limiting through the real server: exact global limits across replicas on a
//! real Redis (`AUTHD_TEST_REDIS_URL`, each test under its own key prefix), sliding
//! rather than fixed windows, per-client keys, the fallback while Redis fails and
//! the return to it, and the exemption of health and reflection.
//!
//! Tests without Redis in their name run on the in-process limiter and need nothing.

use crate::helpers::{
    TcpProxy, TestApp, expect_code, redis_url, spawn_app_with, unique_name, wait_until,
};
use authd::{
    config::Config,
    pb::{
        LoginRequest, RegisterRequest, ValidateTokenRequest, auth_service_client::AuthServiceClient,
    },
    ratelimit::{Backend, FailureMode},
};
use std::{
    net::{IpAddr, SocketAddr},
    process::Command,
    time::{Duration, Instant},
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    sync::watch,
};
use tonic::{Code, Request, Status, transport::Channel};
use tonic_types::StatusExt as _;

const USER: &str = "alice";
const PASSWORD: &str = "correct horse battery";

/// Redis settings for `c`: the test server, a prefix of its own, `rules`.
fn with_redis(c: &mut Config, url: &str, prefix: &str, rules: &str) {
    c.redis_url = Some(url.parse().expect("a Redis URL"));
    c.rate_limit_prefix = prefix.to_owned();
    c.rate_limits = Some(rules.parse().expect("valid rules"));
    // Unoptimized servers and the whole test suite share two cores: an answer can
    // take longer than the production default of 50ms, and a timeout (rightly) falls
    // back to the per-replica limiter, which is not what most tests look at.
    c.redis_timeout = Duration::from_secs(1);
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
    let rule = "Login:global=50/2s";
    let mut apps = Vec::new();
    for _ in 0..3 {
        let mut app = spawn_app_with(|c| with_redis(c, &url, &prefix, rule)).await;
        // Each replica has its own database here; Register is not limited.
        app.register(USER, PASSWORD).await.unwrap();
        assert_eq!(app.handle.rate_limit_stats().backend, Backend::Redis);
        apps.push(app);
    }
    let clients: Vec<_> = apps.iter().map(|a| a.client.clone()).collect();

    let started = Instant::now();
    let tally = burst(&clients, 300).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "the burst took {took:?}, longer than the window: this machine is too slow for the test"
    );
    assert_eq!(
        tally.ok, 50,
        "exactly the limit passes, across all replicas"
    );
    assert_eq!(tally.refused.len(), 250);
    let mut longest = Duration::ZERO;
    for status in &tally.refused {
        let delay = assert_rate_limited(status, rule, 50);
        assert!(delay <= Duration::from_secs(2), "{delay:?}");
        longest = longest.max(delay);
    }
    for app in &apps {
        let stats = app.handle.rate_limit_stats();
        assert_eq!(stats.local_decisions, 0, "{stats:?}");
        assert_eq!(stats.redis_failures, 0, "{stats:?}");
    }

    // Once the window has slid past the burst, requests pass again.
    tokio::time::sleep(longest + Duration::from_millis(200)).await;
    let mut client = clients[1].clone();
    login(&mut client).await.expect("a slot freed");
}

/// 50 at t≈0; none at t≈1.5 s (a fixed window might have reset by then); 50 again
/// once the first burst has left the 2 s window.
async fn the_window_slides(app: &mut TestApp) {
    app.register(USER, PASSWORD).await.unwrap();
    let clients = [app.client.clone()];
    let t0 = Instant::now();
    let first = burst(&clients, 50).await;
    let burst_done = Instant::now();
    assert_eq!(first.ok, 50);
    assert!(
        burst_done - t0 < Duration::from_millis(500),
        "the first burst took {:?}: this machine is too slow for the test",
        burst_done - t0
    );
    let mut client = app.client.clone();
    expect_code(login(&mut client).await, Code::ResourceExhausted);

    tokio::time::sleep_until((t0 + Duration::from_millis(1500)).into()).await;
    let middle = burst(&clients, 5).await;
    assert_eq!(middle.ok, 0, "no new slot 1.5 s into a 2 s window");
    assert!(
        t0.elapsed() < Duration::from_millis(1900),
        "the check at 1.5 s came too late: {:?}",
        t0.elapsed()
    );

    tokio::time::sleep_until((burst_done + Duration::from_millis(2100)).into()).await;
    let later = burst(&clients, 60).await;
    assert_eq!(later.ok, 50, "the whole first burst has left the window");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_slides_on_redis() {
    let Some(url) = redis_url("the_window_slides_on_redis") else {
        return;
    };
    let prefix = unique_name("rl");
    let mut app = spawn_app_with(|c| with_redis(c, &url, &prefix, "Login:global=50/2s")).await;
    the_window_slides(&mut app).await;
    assert_eq!(app.handle.rate_limit_stats().local_decisions, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_slides_on_the_local_limiter_too() {
    let mut app = spawn_app_with(|c| {
        c.rate_limits = Some("Login:global=50/2s".parse().unwrap());
    })
    .await;
    the_window_slides(&mut app).await;
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
            c.rate_limits = Some("Login:peer=1/1m".parse().unwrap());
            c.trust_forwarded_for = trusted;
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
        c.rate_limits = Some("Login:peer=3/1m,Login:global=100/1m".parse().unwrap());
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

/// A TCP proxy that can freeze: connections stay open, bytes stop flowing, as with
/// a Redis that hangs (paused, swapping, a dropped route) rather than refusing.
struct FreezableProxy {
    addr: SocketAddr,
    frozen: watch::Sender<bool>,
    accept: tokio::task::JoinHandle<()>,
}

impl FreezableProxy {
    async fn start(upstream: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (frozen, _) = watch::channel(false);
        let accept = tokio::spawn({
            let frozen = frozen.clone();
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                        continue;
                    };
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    tokio::spawn(pump(in_read, out_write, frozen.subscribe()));
                    tokio::spawn(pump(out_read, in_write, frozen.subscribe()));
                }
            }
        });
        Self {
            addr,
            frozen,
            accept,
        }
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }
}

impl Drop for FreezableProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Hold the bytes while frozen: the other side waits for an answer that never comes.
        if frozen.wait_for(|f| !*f).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

fn redis_via(url: &str, proxy: SocketAddr) -> String {
    crate::helpers::with_host(url, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_costs_one_timeout_then_the_local_limiter_serves_until_it_answers() {
    let Some(url) =
        redis_url("a_hung_redis_costs_one_timeout_then_the_local_limiter_serves_until_it_answers")
    else {
        return;
    };
    let proxy = FreezableProxy::start(crate::helpers::host_of(&url)).await;
    let prefix = unique_name("rl");
    let mut app = spawn_app_with(|c| {
        with_redis(
            c,
            &redis_via(&url, proxy.addr),
            &prefix,
            "Login:global=5/1m",
        );
        // Short enough to see that a hung Redis costs one timeout, long enough that a
        // busy test machine does not time out before the freeze.
        c.redis_timeout = Duration::from_millis(250);
    })
    .await;
    app.register(USER, PASSWORD).await.unwrap();
    login(&mut app.client).await.unwrap(); // 1 of 5 on Redis
    assert_eq!(app.handle.rate_limit_stats().backend, Backend::Redis);

    proxy.freeze(true);
    // The first request waits out the timeout, then the local limiter decides.
    let started = Instant::now();
    login(&mut app.client)
        .await
        .expect("served under the local limiter");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(1),
        "a hung Redis held a request for {waited:?} (timeout 250ms)"
    );
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
    proxy.freeze(false);
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
async fn a_redis_down_at_start_does_not_stop_authd_and_is_used_once_it_answers() {
    let Some(url) =
        redis_url("a_redis_down_at_start_does_not_stop_authd_and_is_used_once_it_answers")
    else {
        return;
    };
    let proxy = TcpProxy::start(crate::helpers::host_of(&url)).await;
    proxy.cut();
    let prefix = unique_name("rl");
    let mut app = spawn_app_with(|c| {
        with_redis(
            c,
            &redis_via(&url, proxy.addr),
            &prefix,
            "Login:global=2/1m",
        )
    })
    .await;
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

    proxy.restore();
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
    let Some(url) =
        redis_url("fail_closed_refuses_with_unavailable_while_redis_is_down_and_recovers")
    else {
        return;
    };
    let proxy = TcpProxy::start(crate::helpers::host_of(&url)).await;
    let prefix = unique_name("rl");
    let mut app = spawn_app_with(|c| {
        with_redis(
            c,
            &redis_via(&url, proxy.addr),
            &prefix,
            "Login:global=100/1m",
        );
        c.rate_limit_failure = FailureMode::Closed;
    })
    .await;
    app.register(USER, PASSWORD).await.unwrap();
    login(&mut app.client).await.unwrap();

    proxy.cut();
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
            r#"authd_grpc_requests_total{code="UNAVAILABLE",method="Login",service="auth.v1.AuthService"} 2"#,
            "authd_ratelimit_fallback_active 1",
        ],
    );

    proxy.restore();
    let handle = app.handle.clone();
    wait_until("the limiter is back on Redis", || {
        handle.rate_limit_stats().backend == Backend::Redis
    })
    .await;
    login(&mut app.client)
        .await
        .expect("served again through Redis");
}

#[tokio::test]
async fn health_and_reflection_pass_when_every_rule_is_exhausted() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest,
    };
    let mut app = spawn_app_with(|c| {
        c.rate_limits = Some("*:global=1/1m,*:peer=1/1m".parse().unwrap());
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
