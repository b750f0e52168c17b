//! The Redis tier on a real Redis Cluster of three primaries the tests start
//! (`redis_servers`): replicas enforce one global limit exactly through it, each
//! key's window lives in one slot on one shard, a request whose rules fall on
//! several slots leaves no entry anywhere when refused, a window moved to another
//! shard (MOVED) is followed and stays exact, a stopped shard brings the
//! failure mode within the Redis timeout and exact limits come back with it, and
//! the login throttle counts on it.

use crate::helpers::{TestApp, expect_code, spawn_app_with, unique_name};
use crate::redis_servers::Cluster;
use authd::{FailureMode, RateLimitBackend as Backend, config::Config, pb::LoginRequest};
use std::time::Duration;
use tonic::{Code, Status};

const USER: &str = "alice";
const PASSWORD: &str = "correct horse battery";

fn on_cluster(c: &mut Config, cluster: &Cluster, prefix: &str, rules: &str) {
    c.limits.redis_url = Some(cluster.url().parse().expect("a cluster URL"));
    c.limits.rate_limit_prefix = prefix.to_owned();
    c.limits.rate_limits = Some(rules.parse().expect("valid rules"));
    // Two shared cores and unoptimized servers: see `ratelimit::with_redis`.
    c.limits.redis_timeout = Duration::from_secs(10);
}

async fn login(app: &TestApp) -> Result<(), Status> {
    let mut client = app.client.clone();
    (client.login(LoginRequest {
        username: USER.into(),
        password: PASSWORD.into(),
    }))
    .await
    .map(|_| ())
}

/// `n` logins at once spread over `apps`: how many passed (anything but OK or
/// RESOURCE_EXHAUSTED fails the test).
async fn burst(apps: &[TestApp], n: usize) -> usize {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let mut client = apps[i % apps.len()].client.clone();
            tokio::spawn(async move {
                (client.login(LoginRequest {
                    username: USER.into(),
                    password: PASSWORD.into(),
                }))
                .await
                .map(|_| ())
            })
        })
        .collect();
    let mut ok = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(()) => ok += 1,
            Err(s) if s.code() == Code::ResourceExhausted => {}
            Err(s) => panic!("expected OK or RESOURCE_EXHAUSTED, got {s:?}"),
        }
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_enforce_one_limit_exactly_through_a_redis_cluster() {
    let test = "three_replicas_enforce_one_limit_exactly_through_a_redis_cluster";
    let Some(cluster) = Cluster::start(test).await else {
        return;
    };
    let prefix = unique_name("rl");
    // Two rules whose keys fall in two slots: the global one (a slot of its own)
    // refuses, the client's one (tagged with the address) has room.
    let rules = "Login:global=30/1h,Login:peer=1000/1h";
    let mut apps = Vec::new();
    for _ in 0..3 {
        let mut app = spawn_app_with(|c| on_cluster(c, &cluster, &prefix, rules)).await;
        app.register(USER, PASSWORD).await.unwrap();
        assert_eq!(app.handle.rate_limit_stats().backend, Backend::Redis);
        apps.push(app);
    }
    let ok = burst(&apps, 120).await;
    let stats: Vec<_> = apps.iter().map(|a| a.handle.rate_limit_stats()).collect();
    assert!(
        stats
            .iter()
            .all(|s| s.local_decisions == 0 && s.redis_failures == 0),
        "every decision was the cluster's: {stats:?}"
    );
    assert_eq!(ok, 30, "exactly the limit passes, across all replicas");

    let global = format!("{prefix}:Login:global:3600000:{{}}");
    let peer = format!("{prefix}:Login:peer:3600000:{{127.0.0.1}}");
    assert_ne!(cluster.slot(&global), cluster.slot(&peer), "two slots");
    // Each window lives on one shard, in the slot its key names.
    for key in [&global, &peer] {
        assert_eq!(cluster.holders(key).len(), 1, "{key} is on one node");
    }
    // The 90 refused requests were taken back from the slot that had room: both
    // logs hold exactly the allowed requests.
    assert_eq!(cluster.zcard(&global), 30);
    assert_eq!(cluster.zcard(&peer), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_moved_to_another_shard_is_followed_and_stays_exact() {
    let test = "a_window_moved_to_another_shard_is_followed_and_stays_exact";
    let Some(cluster) = Cluster::start(test).await else {
        return;
    };
    let prefix = unique_name("rl");
    let mut app = spawn_app_with(|c| on_cluster(c, &cluster, &prefix, "Login:global=10/1h")).await;
    app.register(USER, PASSWORD).await.unwrap();
    assert_eq!(burst(std::slice::from_ref(&app), 4).await, 4);
    let key = format!("{prefix}:Login:global:3600000:{{}}");
    let from = cluster.holders(&key)[0];
    let to = (from + 1) % 3;
    cluster.move_slot(&key, from, to);
    assert_eq!(cluster.holders(&key), [to]);
    // The connection still sends to the old owner, which answers MOVED: followed.
    let ok = burst(std::slice::from_ref(&app), 12).await;
    let stats = app.handle.rate_limit_stats();
    assert_eq!(
        (stats.local_decisions, stats.redis_failures),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(ok, 6, "the window moved whole, and stays exact");
    assert_eq!(cluster.zcard(&key), 10);
}

/// A shard stopped: the failure mode applies at once; exact limits again once the
/// shard is back (on its port, with its nodes.conf; it lost its counts).
async fn a_stopped_shard(failure: FailureMode, test: &str) {
    let Some(mut cluster) = Cluster::start(test).await else {
        return;
    };
    let prefix = unique_name("rl");
    let timeout = Duration::from_millis(500);
    let app = spawn_app_with(|c| {
        on_cluster(c, &cluster, &prefix, "Login:global=5/1h");
        c.limits.redis_timeout = timeout;
        c.limits.rate_limit_failure = failure;
    })
    .await;
    let mut app = app;
    app.register(USER, PASSWORD).await.unwrap();
    login(&app).await.unwrap();
    let key = format!("{prefix}:Login:global:3600000:{{}}");
    let holders = cluster.holders(&key);
    assert_eq!(holders.len(), 1, "{key} is on one node");
    let shard = holders[0];

    cluster.nodes[shard].kill();
    // The first login after the shard stopped: decided by the failure mode.
    let first = login(&app).await;
    match failure {
        FailureMode::Open => first.unwrap(),
        FailureMode::Closed => {
            expect_code(first, Code::Unavailable);
        }
    }
    assert_eq!(app.handle.rate_limit_stats().backend, Backend::Degraded);

    cluster.nodes[shard].restart().await;
    cluster.wait_ok().await;
    let handle = app.handle.clone();
    crate::helpers::wait_until("the limiter comes back to the cluster", || {
        handle.rate_limit_stats().backend == Backend::Redis
    })
    .await;
    let before = app.handle.rate_limit_stats();
    let ok = burst(std::slice::from_ref(&app), 12).await;
    let after = app.handle.rate_limit_stats();
    assert_eq!(
        (after.local_decisions, after.redis_failures),
        (before.local_decisions, before.redis_failures),
        "the burst was decided by the cluster"
    );
    // The restarted shard lost its log: the limit starts afresh, exactly.
    assert_eq!(ok, 5);
    assert_eq!(cluster.zcard(&key), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_shard_fails_open_and_exact_limits_return_with_it() {
    a_stopped_shard(
        FailureMode::Open,
        "a_stopped_shard_fails_open_and_exact_limits_return_with_it",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_shard_fails_closed_and_exact_limits_return_with_it() {
    a_stopped_shard(
        FailureMode::Closed,
        "a_stopped_shard_fails_closed_and_exact_limits_return_with_it",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_login_throttle_counts_on_the_cluster() {
    let Some(cluster) = Cluster::start("the_login_throttle_counts_on_the_cluster").await else {
        return;
    };
    let prefix = unique_name("authd-test-throttle");
    let replica = || {
        spawn_app_with(|c| {
            c.limits.redis_url = Some(cluster.url().parse().unwrap());
            c.limits.rate_limit_prefix = prefix.clone();
            c.limits.redis_timeout = Duration::from_secs(10);
            c.limits.login_failures = 3;
            c.limits.login_account_failures = 10;
            c.limits.login_delay = Duration::from_secs(3600);
            c.limits.login_delay_max = Duration::from_secs(8 * 3600);
            c.limits.login_account_delay_max = Duration::from_secs(3600);
        })
    };
    let mut a = replica().await;
    let b = replica().await;
    a.register(USER, PASSWORD).await.unwrap();
    for _ in 0..3 {
        expect_code(a.login(USER, "a wrong guess").await, Code::Unauthenticated);
    }
    // The other replica reads the same counts: refused before any hash.
    let mut client = b.client.clone();
    let refused = client
        .login(LoginRequest {
            username: USER.into(),
            password: PASSWORD.into(),
        })
        .await;
    expect_code(refused, Code::ResourceExhausted);
    let text = a.handle.render_metrics();
    assert_eq!(
        crate::helpers::metric(&text, "authd_login_throttle_redis_errors_total"),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_descriptor_request_takes_every_hit_back_from_the_other_slots() {
    use envoy_types::pb::envoy::{
        extensions::common::ratelimit::v3::{RateLimitDescriptor, rate_limit_descriptor::Entry},
        service::ratelimit::v3::{
            RateLimitRequest, rate_limit_response::Code as RlsCode,
            rate_limit_service_client::RateLimitServiceClient,
        },
    };
    let test = "a_refused_descriptor_request_takes_every_hit_back_from_the_other_slots";
    let Some(cluster) = Cluster::start(test).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: mesh\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .unwrap();
    let prefix = unique_name("rls");
    let app = spawn_app_with(|c| {
        on_cluster(c, &cluster, &prefix, "Login:peer=1000/1h");
        c.limits.rate_limit_rules_file = Some(rules.clone());
    })
    .await;
    let mut client = RateLimitServiceClient::new(app.channel().await);
    let entry = |key: &str, value: &str| RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    };
    let mut ask = async |descriptors: Vec<RateLimitDescriptor>, hits: u32| {
        let request = RateLimitRequest {
            domain: "mesh".into(),
            descriptors,
            hits_addend: hits,
        };
        let answer = client.should_rate_limit(request).await.unwrap();
        RlsCode::try_from(answer.into_inner().overall_code).unwrap()
    };
    let both = || vec![entry("a", "x"), entry("b", "y")];
    assert_eq!(ask(both(), 2).await, RlsCode::Ok, "2 of 10 and 2 of 2");
    // b has no room for 3 more: refused, and the 3 hits a's slot took are taken back.
    assert_eq!(ask(both(), 3).await, RlsCode::OverLimit);
    // So a holds 2, and 8 more fill it exactly.
    assert_eq!(ask(vec![entry("a", "x")], 8).await, RlsCode::Ok);
    assert_eq!(ask(vec![entry("a", "x")], 1).await, RlsCode::OverLimit);
    let stats = app.handle.rate_limit_stats();
    assert!(
        stats.local_decisions == 0 && stats.redis_failures == 0,
        "every decision was the cluster's: {stats:?}"
    );
}
