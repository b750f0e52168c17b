//! The Redis tier on a master watched by real sentinels (`redis_servers`: a master,
//! a replica, three sentinels, quorum 2): limits enforced through the master the
//! sentinels name; the master killed, the failure mode applies while they fail
//! over, authd finds the new master through them, and limits are exact again. The
//! gap is measured and printed, never asserted.

use crate::helpers::{TestApp, spawn_app_with, unique_name};
use crate::redis_servers::{Sentinels, cli, poll};
use authd::{RateLimitBackend as Backend, pb::LoginRequest};
use std::time::{Duration, Instant};
use tonic::Code;

const USER: &str = "alice";
const PASSWORD: &str = "correct horse battery";

/// `n` logins one after the other: how many passed.
async fn logins(app: &TestApp, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let mut client = app.client.clone();
        let answer = client
            .login(LoginRequest {
                username: USER.into(),
                password: PASSWORD.into(),
            })
            .await;
        match answer {
            Ok(_) => ok += 1,
            Err(s) if s.code() == Code::ResourceExhausted => {}
            Err(s) => panic!("expected OK or RESOURCE_EXHAUSTED, got {s:?}"),
        }
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_is_followed_through_the_sentinels() {
    let test = "a_failover_is_followed_through_the_sentinels";
    let Some(mut set) = Sentinels::start(test).await else {
        return;
    };
    let prefix = unique_name("rl");
    // Login counts exactness; ValidateToken (cheap, never limited here in
    // practice) is what the test polls with during the failover.
    let rules = "Login:global=5/1h,ValidateToken:global=100000/1h";
    let mut app = spawn_app_with(|c| {
        c.limits.redis_url = Some(set.url().parse().expect("a Sentinel URL"));
        c.limits.rate_limit_prefix = prefix.clone();
        c.limits.rate_limits = Some(rules.parse().unwrap());
        c.limits.redis_timeout = Duration::from_millis(500);
    })
    .await;
    assert_eq!(app.handle.rate_limit_stats().backend, Backend::Redis);
    app.register(USER, PASSWORD).await.unwrap();
    assert_eq!(logins(&app, 2).await, 2);

    let key = format!("{prefix}:Login:global:3600000:{{}}");
    let new = set.replica.port;
    // The replica has the log before the master goes (asynchronous replication).
    assert!(
        poll(Duration::from_secs(10), || cli(new, &["zcard", &key])
            .is_some_and(|o| o.trim() == "2"))
        .await
    );

    set.master.kill();
    let killed = Instant::now();
    let (mut degraded_at, mut back_at) = (None, None);
    let local_before = app.handle.rate_limit_stats().local_decisions;
    let give_up = killed + Duration::from_secs(90);
    while Instant::now() < give_up {
        // Any answer but UNAVAILABLE: fail-open serves from the replica's counts.
        let answer = app.validate("not a token").await;
        assert!(
            answer.is_err_and(|s| s.code() == Code::Unauthenticated),
            "ValidateToken is answered throughout"
        );
        let backend = app.handle.rate_limit_stats().backend;
        if backend == Backend::Degraded && degraded_at.is_none() {
            degraded_at = Some(killed.elapsed());
        }
        if backend == Backend::Redis && degraded_at.is_some() {
            back_at = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let back_at = back_at.expect("authd found the new master within 90 s");
    eprintln!(
        "{test}: master killed; failure mode from {:?}, Redis again after {back_at:?} \
         (sentinel down-after 1000 ms)",
        degraded_at.unwrap()
    );
    assert!(
        app.handle.rate_limit_stats().local_decisions > local_before,
        "the in-process counts served meanwhile (fail open)"
    );
    assert!(
        cli(new, &["role"]).is_some_and(|o| o.starts_with("master")),
        "the replica was promoted"
    );

    // Exact again, on the new master: the log it had, then exactly the rest.
    let held: usize = (cli(new, &["zcard", &key]).unwrap().trim().parse()).unwrap();
    let before = app.handle.rate_limit_stats();
    let ok = logins(&app, 8).await;
    let after = app.handle.rate_limit_stats();
    assert_eq!(after.local_decisions, before.local_decisions);
    assert_eq!(ok, 5 - held, "{held} held already");
    assert_eq!(cli(new, &["zcard", &key]).unwrap().trim(), "5");
}
