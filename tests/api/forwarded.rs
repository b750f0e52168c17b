//! Calling services and their end users, through the real server: a service in
//! `AUTHD_TRUSTED_CALLERS` names each request's end user in `x-forwarded-for`, and
//! every per-client limit counts that user; anyone else's header is ignored; a
//! chain of trusted proxies is walked from the right, so a spoofed leftmost entry
//! counts for nothing. The end users' addresses are only ever data in a header:
//! every connection is to and from 127.0.0.0/8.
//!
//! Each test runs on the in-process limiter and, with `AUTHD_TEST_REDIS_URL`, on
//! Redis. Every verdict is a count of answers by code, never a time.

use crate::helpers::{
    TestApp, TestDb, connect_from, redis_url, spawn_app_on, spawn_app_with, unique_name,
};
use authd::{
    config::Config,
    pb::{LoginRequest, RegisterRequest, auth_service_client::AuthServiceClient},
};
use futures::{StreamExt as _, stream};
use std::{net::Ipv4Addr, time::Duration};
use tonic::{Code, Request, Status, transport::Channel};

const PASSWORD: &str = "correct horse battery";
/// The calling service's address (trusted) and an untrusted client's.
const SERVICE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 40);
const UNTRUSTED: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 41);

crate::backend_tests!(a_trusted_service_registers_for_a_thousand_end_users);

/// The end users the service registers for: 1,000 distinct addresses, IPv4 and
/// IPv6 (documentation ranges, never contacted).
fn end_user(n: usize) -> String {
    match n {
        0..250 => format!("198.51.100.{n}"),
        _ => format!("2001:db8::{n:x}"),
    }
}

/// `c` with the calling service trusted, the default Register limit, and room for
/// 300 registrations at once on one connection, and with `redis` the limits counted
/// in Redis under a prefix of their own.
fn trusting_the_service(c: &mut Config, redis: Option<&str>) {
    c.limits.trusted_callers = Some("127.0.0.40/32".parse().unwrap());
    c.limits.register_limit = Config::defaults().limits.register_limit;
    c.server.max_streams_per_connection = 1000;
    if let Some(url) = redis {
        c.limits.redis_url = Some(url.parse().unwrap());
        c.limits.rate_limit_prefix = unique_name("authd-test-forwarded");
        // An unoptimized server on a busy machine; a timeout would fall back to the
        // per-replica counts, which is not what these tests look at.
        c.limits.redis_timeout = Duration::from_secs(10);
    }
}

/// A Register of `username`, naming `forwarded` in `x-forwarded-for` if given.
async fn register_for(
    client: &AuthServiceClient<Channel>,
    username: String,
    forwarded: Option<String>,
) -> Result<(), Status> {
    let mut request = Request::new(RegisterRequest {
        username,
        password: PASSWORD.into(),
    });
    if let Some(forwarded) = forwarded {
        let value = forwarded.parse().unwrap();
        request.metadata_mut().insert("x-forwarded-for", value);
    }
    // A deadline no test server misses, however slow its machine: these tests count
    // the limits by client, not what fits in time (`overload` does).
    request.set_timeout(Duration::from_secs(600));
    client.clone().register(request).await.map(drop)
}

/// `count` registrations, at most `at_once` in flight, the `n`th naming
/// `forwarded(n)`: how many were answered OK, and how many refused by the Register
/// limit. Any other answer fails the test.
async fn registrations(
    client: &AuthServiceClient<Channel>,
    prefix: &str,
    count: usize,
    at_once: usize,
    forwarded: impl Fn(usize) -> Option<String>,
) -> (usize, usize) {
    let answers: Vec<_> = stream::iter(0..count)
        .map(|n| register_for(client, format!("{prefix}-{n}"), forwarded(n)))
        .buffer_unordered(at_once)
        .collect()
        .await;
    let (mut ok, mut limited) = (0, 0);
    for answer in answers {
        match answer {
            Ok(()) => ok += 1,
            Err(s) if s.code() == Code::ResourceExhausted => {
                assert!(s.message().contains("Register:peer=100/1m"), "{s:?}");
                limited += 1;
            }
            Err(s) => panic!("unexpected answer: {s:?}"),
        }
    }
    (ok, limited)
}

async fn a_trusted_service_registers_for_a_thousand_end_users(db: TestDb) {
    let app = spawn_app_on(&db, |c| trusting_the_service(c, None)).await;
    thousand_end_users(app, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_service_registers_for_a_thousand_end_users_on_redis() {
    let Some(url) = redis_url("a_trusted_service_registers_for_a_thousand_end_users_on_redis")
    else {
        return;
    };
    let app = spawn_app_with(|c| trusting_the_service(c, Some(&url))).await;
    thousand_end_users(app, true).await;
}

/// One connection from the service, 300 registrations in flight at once on it,
/// each for an end user of its own: every one answered OK, though the service's
/// address alone would have been refused after 100. The limit still holds for each
/// end user, and for the service itself when it forwards no one.
async fn thousand_end_users(app: TestApp, on_redis: bool) {
    let service = connect_from(app.addr, SERVICE).await;
    let (ok, limited) = registrations(&service, "user", 1000, 300, |n| Some(end_user(n))).await;
    assert_eq!((ok, limited), (1000, 0));
    // One end user, 101 times: its own 100 a minute, whoever forwards it.
    let (ok, limited) =
        registrations(&service, "one", 101, 101, |_| Some("203.0.113.7".into())).await;
    assert_eq!((ok, limited), (100, 1));
    // Forwarding no one, the service is its own client, and the limit is its own.
    let (ok, limited) = registrations(&service, "itself", 101, 101, |_| None).await;
    assert_eq!((ok, limited), (100, 1));
    let stats = app.handle.rate_limit_stats();
    assert_eq!(stats.redis_failures, 0);
    if on_redis {
        // Every decision was Redis's, none a replica's own fallback.
        assert_eq!(stats.local_decisions, 0);
    }
}

#[tokio::test]
async fn a_forged_header_from_an_untrusted_address_is_ignored() {
    forged_header(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_header_from_an_untrusted_address_is_ignored_on_redis() {
    if let Some(url) = redis_url("a_forged_header_from_an_untrusted_address_is_ignored_on_redis") {
        forged_header(Some(&url)).await;
    }
}

/// 300 registrations from an address that is not trusted, each naming another
/// end user: the header is ignored, and the default limit refuses all but 100.
async fn forged_header(redis: Option<&str>) {
    let app = spawn_app_with(|c| trusting_the_service(c, redis)).await;
    let untrusted = connect_from(app.addr, UNTRUSTED).await;
    let (ok, limited) = registrations(&untrusted, "probe", 300, 30, |n| Some(end_user(n))).await;
    assert_eq!((ok, limited), (100, 200));
    // The end users it named were never counted: the service may still register them.
    let service = connect_from(app.addr, SERVICE).await;
    let (ok, limited) = registrations(&service, "real", 10, 10, |n| Some(end_user(n))).await;
    assert_eq!((ok, limited), (10, 0));
}

/// A Login of `alice` with `x-forwarded-for: forwarded` (none when empty).
async fn login_for(client: &AuthServiceClient<Channel>, forwarded: &str) -> Code {
    let mut request = Request::new(LoginRequest {
        username: "alice".into(),
        password: PASSWORD.into(),
    });
    if !forwarded.is_empty() {
        let value = forwarded.parse().unwrap();
        request.metadata_mut().insert("x-forwarded-for", value);
    }
    match client.clone().login(request).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn a_spoofed_hop_through_trusted_proxies_is_ignored() {
    spoofed_hop(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_hop_through_trusted_proxies_is_ignored_on_redis() {
    if let Some(url) = redis_url("a_spoofed_hop_through_trusted_proxies_is_ignored_on_redis") {
        spoofed_hop(Some(&url)).await;
    }
}

/// The service passes its requests through a proxy of its own (10.1.1.1, trusted),
/// and the end user sent an `x-forwarded-for` of its choosing, a new address each
/// time: the client is the rightmost untrusted entry, the real end user, so two
/// logins an hour per address hold for it whatever it puts first.
async fn spoofed_hop(redis: Option<&str>) {
    let mut app = spawn_app_with(|c| {
        trusting_the_service(c, redis);
        c.limits.trusted_callers = Some("127.0.0.40/32,10.0.0.0/8".parse().unwrap());
        c.limits.rate_limits = Some("Login:peer=2/1h".parse().unwrap());
    })
    .await;
    app.register("alice", PASSWORD).await.unwrap();
    let service = connect_from(app.addr, SERVICE).await;
    let chain = |spoofed: usize, user: &str| format!("{}, {user}, 10.1.1.1", end_user(spoofed));
    let mut codes = Vec::new();
    for spoofed in 0..5 {
        codes.push(login_for(&service, &chain(spoofed, "203.0.113.7")).await);
    }
    assert_eq!(
        codes,
        [Code::Ok, Code::Ok]
            .into_iter()
            .chain([Code::ResourceExhausted; 3])
            .collect::<Vec<_>>()
    );
    // Another end user behind the same proxies, with the same spoofed entries: its
    // own count.
    assert_eq!(
        login_for(&service, &chain(0, "203.0.113.8")).await,
        Code::Ok
    );
    assert_eq!(
        login_for(&service, &chain(1, "203.0.113.8")).await,
        Code::Ok
    );
    // The spoofed addresses themselves were never counted.
    assert_eq!(login_for(&service, &end_user(0)).await, Code::Ok);
    // The service forwarding no one is its own client; an untrusted peer's whole
    // chain is ignored.
    assert_eq!(login_for(&service, "").await, Code::Ok);
    let untrusted = connect_from(app.addr, UNTRUSTED).await;
    assert_eq!(
        login_for(&untrusted, &chain(2, "203.0.113.9")).await,
        Code::Ok
    );
    assert_eq!(
        login_for(&untrusted, &chain(3, "203.0.113.10")).await,
        Code::Ok
    );
    assert_eq!(
        login_for(&untrusted, &chain(4, "203.0.113.11")).await,
        Code::ResourceExhausted
    );
    // AUTHD_TRUST_FORWARDED_FOR=true alone (kept for existing configurations) trusts
    // every hop, so the leftmost counts: each spoofed address passes.
    let mut compat = spawn_app_with(|c| {
        trusting_the_service(c, redis);
        c.limits.trusted_callers = None;
        c.limits.trust_forwarded_for = true;
        c.limits.rate_limits = Some("Login:peer=2/1h".parse().unwrap());
    })
    .await;
    compat.register("alice", PASSWORD).await.unwrap();
    let service = connect_from(compat.addr, SERVICE).await;
    for spoofed in 0..5 {
        let code = login_for(&service, &chain(spoofed, "203.0.113.7")).await;
        assert_eq!(code, Code::Ok, "spoofed entry {spoofed}");
    }
}
