//! The login throttle through the real server: per client and per account, the
//! owner from another address unaffected, unknown usernames indistinguishable, no
//! hash for a throttled attempt, counts shared through Redis by two replicas, the
//! fallback while Redis fails (one timeout while it hangs, not one per login), and
//! the audit trail of it all.
//!
//! No verdict depends on the machine's speed: delays are hours long beside any
//! test's run time, and the doubling on Redis is shown by moving a stored failure
//! back in time (the in-process doubling, and that one address alone never reaches
//! the across-clients count, are tested with a clock the unit tests control, in
//! `throttle`).

use crate::cli::spawn_authd;
use crate::helpers::{
    ProxiedRedis, TEST_KEY, TEST_KID, TestApp, expect_code, key_spec, metric, redis_url,
    spawn_app_with, unique_name, wait_for,
};
use authd::{
    FailureMode,
    config::Config,
    pb::{LoginRequest, RegisterRequest, auth_service_client::AuthServiceClient},
};
use std::time::Duration;
use tonic::{Code, Request, Status, transport::Channel};
use tonic_types::StatusExt as _;

const OWNER: &str = "alice";
const PASSWORD: &str = "correct horse battery";
const HOUR: Duration = Duration::from_secs(3600);

/// Long delays, counted by the forwarded client address so one test client can be
/// many addresses.
fn throttled(c: &mut Config, failures: u32, account_failures: u32) {
    c.limits.login_failures = failures;
    c.limits.login_account_failures = account_failures;
    c.limits.login_delay = HOUR;
    c.limits.login_delay_max = 8 * HOUR;
    c.limits.login_account_delay_max = HOUR;
    c.limits.trust_forwarded_for = true;
}

/// A login of `username` with `password` from the client address `from`.
async fn login_from(
    client: &AuthServiceClient<Channel>,
    from: &str,
    username: &str,
    password: &str,
) -> Result<(), Status> {
    let mut request = Request::new(LoginRequest {
        username: username.into(),
        password: password.into(),
    });
    request
        .metadata_mut()
        .insert("x-forwarded-for", from.parse().unwrap());
    client.clone().login(request).await.map(|_| ())
}

async fn register(app: &mut TestApp, username: &str) {
    app.client
        .register(RegisterRequest {
            username: username.into(),
            password: PASSWORD.into(),
        })
        .await
        .unwrap();
}

/// Everything a throttled client is told; returns the retry delay.
#[track_caller]
fn assert_throttled(status: &Status, subject: &str) -> Duration {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(
        status.message(),
        "too many failed logins for this account; retry later"
    );
    let delay = status
        .get_details_retry_info()
        .and_then(|r| r.retry_delay)
        .expect("RetryInfo with a delay");
    let quota = status.get_details_quota_failure().expect("QuotaFailure");
    assert_eq!(quota.violations.len(), 1);
    assert_eq!(quota.violations[0].subject, subject);
    let retry_after: u64 = status
        .metadata()
        .get("retry-after")
        .expect("retry-after")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        retry_after,
        delay.as_secs() + u64::from(delay.subsec_nanos() > 0)
    );
    delay
}

fn logins(app: &TestApp, outcome: &str) -> f64 {
    metric(
        &app.handle.render_metrics(),
        &format!("authd_logins_total{{outcome=\"{outcome}\"}}"),
    )
    .unwrap_or(0.0)
}

#[tokio::test]
async fn a_client_is_refused_after_its_failures_before_any_hash_whatever_the_password() {
    let mut app = spawn_app_with(|c| throttled(c, 3, 10)).await;
    register(&mut app, OWNER).await;
    for _ in 0..3 {
        expect_code(
            login_from(&app.client, "203.0.113.1", OWNER, "a wrong guess").await,
            Code::Unauthenticated,
        );
    }
    let hashes = app.handle.hash_stats().completed;
    // The right password too: or guessing would go on.
    let refused = login_from(&app.client, "203.0.113.1", OWNER, PASSWORD)
        .await
        .unwrap_err();
    let delay = assert_throttled(&refused, "login-throttle:client");
    assert!(
        delay <= HOUR && delay > HOUR - Duration::from_secs(600),
        "{delay:?}"
    );
    assert_eq!(app.handle.hash_stats().completed, hashes, "no hash was run");
    assert_eq!(logins(&app, "throttled"), 1.0);
    assert_eq!(logins(&app, "failed"), 3.0);

    // The owner, from another address, is not affected at all.
    login_from(&app.client, "198.51.100.7", OWNER, PASSWORD)
        .await
        .unwrap();
    assert_eq!(logins(&app, "ok"), 1.0);
    // Nor is another account from the attacker's address.
    register(&mut app, "bob").await;
    login_from(&app.client, "203.0.113.1", "bob", PASSWORD)
        .await
        .unwrap();
}

#[tokio::test]
async fn unknown_usernames_are_counted_and_refused_exactly_like_known_ones() {
    let mut app = spawn_app_with(|c| throttled(c, 2, 10)).await;
    register(&mut app, OWNER).await;
    let mut seen = Vec::new();
    for username in [OWNER, "nobody-here"] {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let status = login_from(&app.client, "203.0.113.9", username, "a wrong guess")
                .await
                .unwrap_err();
            statuses.push((status.code(), status.message().to_owned()));
        }
        let last = login_from(&app.client, "203.0.113.9", username, "a wrong guess")
            .await
            .unwrap_err();
        assert_throttled(&last, "login-throttle:client");
        seen.push(statuses);
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0][0].0, Code::Unauthenticated);
    assert_eq!(seen[0][2].0, Code::ResourceExhausted);
}

#[tokio::test]
async fn many_addresses_slow_an_account_but_never_for_a_client_that_logged_in_before() {
    let mut app = spawn_app_with(|c| throttled(c, 2, 6)).await;
    register(&mut app, OWNER).await;
    login_from(&app.client, "198.51.100.7", OWNER, PASSWORD)
        .await
        .unwrap();
    // A botnet: three addresses with two guesses each (their own thresholds).
    for bot in ["192.0.2.1", "192.0.2.2", "192.0.2.3"] {
        for _ in 0..2 {
            expect_code(
                login_from(&app.client, bot, OWNER, "a wrong guess").await,
                Code::Unauthenticated,
            );
        }
    }
    // A fourth address, with the right password, is held by the account count,
    // for no longer than its short maximum.
    let refused = login_from(&app.client, "192.0.2.4", OWNER, PASSWORD)
        .await
        .unwrap_err();
    assert!(assert_throttled(&refused, "login-throttle:account") <= HOUR);
    // The owner's own address is not.
    login_from(&app.client, "198.51.100.7", OWNER, PASSWORD)
        .await
        .unwrap();
}

#[tokio::test]
async fn zero_failures_turns_the_throttle_off() {
    let mut app = spawn_app_with(|c| throttled(c, 0, 10)).await;
    register(&mut app, OWNER).await;
    for _ in 0..8 {
        expect_code(
            login_from(&app.client, "203.0.113.1", OWNER, "a wrong guess").await,
            Code::Unauthenticated,
        );
    }
    login_from(&app.client, "203.0.113.1", OWNER, PASSWORD)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_account_threshold_one_client_could_reach_stops_the_start() {
    let mut config = crate::helpers::test_config(
        format!(
            "sqlite://{}/t.db",
            tempfile::tempdir().unwrap().keep().display()
        )
        .parse()
        .unwrap(),
    );
    throttled(&mut config, 5, 5);
    let err = authd::app::Application::build(config).await.err().unwrap();
    assert!(
        err.to_string().contains("--login-account-failures"),
        "{err}"
    );
}

/// Redis settings for a throttle shared under `prefix`.
fn with_redis(c: &mut Config, url: &str, prefix: &str) {
    c.limits.redis_url = Some(url.parse().unwrap());
    c.limits.rate_limit_prefix = prefix.to_owned();
    c.limits.redis_timeout = Duration::from_secs(1);
}

async fn redis_connection(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

#[tokio::test]
async fn an_account_digest_key_of_its_own_keeps_the_counts_across_signing_keys() {
    let Some(url) = redis_url("an_account_digest_key_of_its_own_keeps_the_counts") else {
        return;
    };
    let prefix = unique_name("authd-test-throttle");
    // Three replicas with three different signing keys (as before and after a
    // rotation); the first two share an account digest key.
    let digest_key = "c2FtZSBkaWdlc3Qga2V5IG9uIGV2ZXJ5IHJlcGxpY2EhIQ==";
    let replica = |signing: &'static [u8; 32], digest: Option<&'static str>| {
        let (url, prefix) = (url.clone(), prefix.clone());
        spawn_app_with(move |c| {
            throttled(c, 3, 10);
            with_redis(c, &url, &prefix);
            c.tokens.token_keys = Some(key_spec("k", signing).parse().unwrap());
            c.tokens.account_digest_key = digest.map(|k| k.parse().unwrap());
        })
    };
    let mut a = replica(b"first signing key, 32 bytes long", Some(digest_key)).await;
    let b = replica(b"other signing key, 32 bytes long", Some(digest_key)).await;
    let c = replica(b"third signing key, 32 bytes long", None).await;
    register(&mut a, OWNER).await;
    for _ in 0..3 {
        expect_code(
            login_from(&a.client, "203.0.113.7", OWNER, "a wrong guess").await,
            Code::Unauthenticated,
        );
    }
    // The same account on a replica with another signing key and the same digest
    // key: the same count, so the client is refused before any hash.
    let refused = login_from(&b.client, "203.0.113.7", OWNER, PASSWORD)
        .await
        .unwrap_err();
    assert_throttled(&refused, "login-throttle:client");
    // Without it, the digest follows the signing key: a count of its own (the
    // account is unknown to that replica's database).
    expect_code(
        login_from(&c.client, "203.0.113.7", OWNER, PASSWORD).await,
        Code::Unauthenticated,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_counts_through_redis_and_the_delay_doubles() {
    let Some(url) = redis_url("replicas_share_the_counts_through_redis") else {
        return;
    };
    let prefix = unique_name("authd-test-throttle");
    let mut a = spawn_app_with(|c| {
        throttled(c, 3, 10);
        with_redis(c, &url, &prefix);
    })
    .await;
    let b = spawn_app_with(|c| {
        throttled(c, 3, 10);
        with_redis(c, &url, &prefix);
    })
    .await;
    register(&mut a, OWNER).await;
    // Two failures on one replica, one on the other: the third is the threshold.
    for app in [&a, &a, &b] {
        expect_code(
            login_from(&app.client, "203.0.113.1", OWNER, "a wrong guess").await,
            Code::Unauthenticated,
        );
    }
    for app in [&a, &b] {
        let refused = login_from(&app.client, "203.0.113.1", OWNER, PASSWORD)
            .await
            .unwrap_err();
        let delay = assert_throttled(&refused, "login-throttle:client");
        assert!(delay > HOUR - Duration::from_secs(600), "{delay:?}");
    }

    // The keys hold no username, and every one expires.
    let mut redis = redis_connection(&url).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:login:*"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert!(!keys.is_empty());
    for key in &keys {
        assert!(!key.contains(OWNER), "{key}");
        let ttl: i64 = redis::cmd("PTTL")
            .arg(key)
            .query_async(&mut redis)
            .await
            .unwrap();
        assert!(ttl > 0, "{key} expires");
    }

    // Move the last failure back past its delay: the next attempt is let through,
    // fails, and the delay doubles.
    let pair = keys
        .iter()
        .find(|k| k.contains("}:c:"))
        .expect("the client's count");
    let last: u64 = redis::cmd("HGET")
        .arg(pair)
        .arg("l")
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(pair)
        .arg("l")
        .arg(last - 3_600_000 - 1000)
        .query_async(&mut redis)
        .await
        .unwrap();
    expect_code(
        login_from(&b.client, "203.0.113.1", OWNER, "a wrong guess").await,
        Code::Unauthenticated,
    );
    let refused = login_from(&a.client, "203.0.113.1", OWNER, PASSWORD)
        .await
        .unwrap_err();
    let delay = assert_throttled(&refused, "login-throttle:client");
    assert!(delay > 2 * HOUR - Duration::from_secs(600), "{delay:?}");

    // The owner, from elsewhere, is unaffected (the user is in `a`'s database;
    // `b` counted the same failures for a username it does not know).
    login_from(&a.client, "198.51.100.7", OWNER, PASSWORD)
        .await
        .unwrap();
}

#[tokio::test]
async fn while_redis_fails_the_counts_fall_back_to_the_replica_or_refuse_when_closed() {
    // A closed local port: nothing listens on port 1 of the loopback.
    let dead = "redis://127.0.0.1:1";
    let mut open = spawn_app_with(|c| {
        throttled(c, 2, 10);
        with_redis(c, dead, "authd-test-dead");
        c.limits.redis_timeout = Duration::from_millis(100);
    })
    .await;
    register(&mut open, OWNER).await;
    for _ in 0..2 {
        expect_code(
            login_from(&open.client, "203.0.113.1", OWNER, "a wrong guess").await,
            Code::Unauthenticated,
        );
    }
    let refused = login_from(&open.client, "203.0.113.1", OWNER, PASSWORD)
        .await
        .unwrap_err();
    assert_throttled(&refused, "login-throttle:client");
    let text = open.handle.render_metrics();
    assert_eq!(
        metric(&text, "authd_login_throttle_fallback_active"),
        Some(1.0)
    );
    assert!(metric(&text, "authd_login_throttle_redis_errors_total").unwrap() >= 3.0);
    login_from(&open.client, "198.51.100.7", OWNER, PASSWORD)
        .await
        .unwrap();

    let mut closed = spawn_app_with(|c| {
        throttled(c, 2, 10);
        with_redis(c, dead, "authd-test-dead");
        c.limits.redis_timeout = Duration::from_millis(100);
        c.limits.rate_limit_failure = FailureMode::Closed;
    })
    .await;
    register(&mut closed, OWNER).await;
    expect_code(
        login_from(&closed.client, "198.51.100.7", OWNER, PASSWORD).await,
        Code::Unavailable,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_redis_costs_the_throttle_one_timeout_then_it_counts_in_process_until_redis_answers()
{
    let Some(redis) = ProxiedRedis::start("a_hung_redis_costs_the_throttle_one_timeout").await
    else {
        return;
    };
    let proxy = &redis.proxy;
    let mut app = spawn_app_with(|c| {
        throttled(c, 3, 10);
        with_redis(c, &redis.url, &redis.prefix);
        c.limits.redis_timeout = Duration::from_millis(250);
    })
    .await;
    register(&mut app, OWNER).await;
    let throttle_metric = |name: &str| metric(&app.handle.render_metrics(), name);
    expect_code(
        login_from(&app.client, "203.0.113.1", OWNER, "a wrong guess").await,
        Code::Unauthenticated,
    );
    assert_eq!(
        throttle_metric("authd_login_throttle_redis_errors_total"),
        Some(0.0)
    );
    assert_eq!(
        throttle_metric("authd_login_throttle_fallback_active"),
        Some(0.0)
    );

    // Redis hangs: the first attempt waits out the timeout, and marks the shared
    // connection down; the next ones do not call Redis at all. Every one is counted
    // in process: three failures, then refusals.
    proxy.stall();
    for _ in 0..3 {
        expect_code(
            login_from(&app.client, "198.51.100.1", OWNER, "a wrong guess").await,
            Code::Unauthenticated,
        );
    }
    for _ in 0..3 {
        let refused = login_from(&app.client, "198.51.100.1", OWNER, PASSWORD)
            .await
            .unwrap_err();
        assert_throttled(&refused, "login-throttle:client");
    }
    assert_eq!(
        throttle_metric("authd_login_throttle_redis_errors_total"),
        Some(1.0),
        "six logins while Redis hangs: one call timed out, the others were not made"
    );
    assert_eq!(
        throttle_metric("authd_login_throttle_fallback_active"),
        Some(1.0)
    );

    // Redis answers again: the connection's prober marks it up, and the counts are
    // kept in Redis again, with no further failure.
    proxy.restore();
    wait_for("the throttle is back on Redis", || async {
        login_from(&app.client, "192.0.2.9", OWNER, PASSWORD)
            .await
            .unwrap();
        (throttle_metric("authd_login_throttle_fallback_active") == Some(0.0)).then_some(())
    })
    .await;
    assert_eq!(
        throttle_metric("authd_login_throttle_redis_errors_total"),
        Some(1.0)
    );
}

#[tokio::test]
async fn the_audit_trail_has_every_outcome_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let running = spawn_authd(
        dir.path(),
        &[
            ("AUTHD_TOKEN_KEYS", key_spec(TEST_KID, TEST_KEY)),
            ("AUTHD_LOGIN_FAILURES", "2".into()),
            ("AUTHD_LOGIN_DELAY", "1h".into()),
            ("AUTHD_LOGIN_DELAY_MAX", "2h".into()),
        ],
    );
    let mut client = running.client().await;
    let password = "sup3r-secret-passw0rd";
    let user_id = client
        .register(RegisterRequest {
            username: "oscar".into(),
            password: password.into(),
        })
        .await
        .unwrap()
        .into_inner()
        .user_id;
    let login = |username: &str, password: &str| {
        let mut client = client.clone();
        let request = LoginRequest {
            username: username.into(),
            password: password.into(),
        };
        async move { client.login(request).await.map(|r| r.into_inner()) }
    };
    let token = login("oscar", password).await.unwrap().access_token;
    expect_code(
        login("oscar", "wrong-passw0rd-1").await,
        Code::Unauthenticated,
    );
    // Someone typed their password into the username field.
    let typed = "my.secret.Passw0rd";
    expect_code(
        login(typed, "wrong-passw0rd-2").await,
        Code::Unauthenticated,
    );
    expect_code(
        login(typed, "wrong-passw0rd-3").await,
        Code::Unauthenticated,
    );
    expect_code(
        login(typed, "wrong-passw0rd-4").await,
        Code::ResourceExhausted,
    );

    let (status, log) = running.terminate().await;
    assert!(status.success());
    let events: Vec<serde_json::Value> = log
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["target"] == "authd::audit")
        .collect();
    let find = |event: &str, outcome: &str| -> Vec<&serde_json::Value> {
        events
            .iter()
            .filter(|e| e["event"] == event && e["outcome"] == outcome)
            .collect()
    };
    let registered = find("registered", "ok");
    assert_eq!(registered.len(), 1, "{events:?}");
    assert_eq!(registered[0]["user_id"], user_id.as_str());
    let ok = find("login", "ok");
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0]["user_id"], user_id.as_str());
    let failed = find("login", "failed");
    assert_eq!(failed.len(), 3);
    assert_eq!(failed[0]["user_id"], user_id.as_str());
    assert!(failed[1].get("user_id").is_none_or(|v| v.is_null()));
    assert_eq!(failed[1]["account"], failed[2]["account"]);
    assert_ne!(failed[0]["account"], failed[1]["account"]);
    let throttled = find("login", "throttled");
    assert_eq!(throttled.len(), 1);
    assert_eq!(throttled[0]["account"], failed[1]["account"]);
    assert_eq!(throttled[0]["scope"], "client");
    for e in &events {
        assert_eq!(e["peer"], "127.0.0.1", "{e}");
        assert!(
            e["request_id"].as_str().is_some_and(|id| !id.is_empty()),
            "{e}"
        );
        assert!(e["timestamp"].is_string(), "{e}");
    }
    let all = log.join("\n");
    for secret in [
        password,
        "wrong-passw0rd-1",
        "wrong-passw0rd-2",
        "wrong-passw0rd-4",
        typed,
        &typed.to_lowercase(),
        token.as_str(),
    ] {
        assert!(!all.contains(secret), "{secret} was logged:\n{all}");
    }
}
