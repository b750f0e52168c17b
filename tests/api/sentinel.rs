//! The Redis tier on a master watched by real sentinels (`redis_servers`: a master,
//! a replica, three sentinels, quorum 2): limits enforced through the master the
//! sentinels name; the master killed (or demoted alive by a manual failover, when
//! it answers writes with READONLY), the failure mode applies while they fail over
//! (open: in-process counts; closed: UNAVAILABLE), authd finds the new master
//! through them, and limits are exact again. The gap is measured and printed, never
//! asserted.

use crate::helpers::{TestApp, metric, spawn_app_with, unique_name, wait_until};
use crate::redis_servers::{Sentinels, cli};
use authd::{FailureMode, RateLimitBackend as Backend, pb::LoginRequest};
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
async fn a_killed_master_is_replaced_through_the_sentinels_failing_open_meanwhile() {
    let test = "a_killed_master_is_replaced_through_the_sentinels_failing_open_meanwhile";
    failover(test, FailureMode::Open, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_through_the_sentinels_failing_closed_meanwhile() {
    let test = "a_killed_master_is_replaced_through_the_sentinels_failing_closed_meanwhile";
    failover(test, FailureMode::Closed, true).await;
}

/// The old master stays up, and takes writes until the sentinels reconfigure it
/// (seconds later): authd, asking the sentinels once a second, moves before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_demoted_by_a_manual_failover_is_left_for_the_new_one() {
    let test = "a_master_demoted_by_a_manual_failover_is_left_for_the_new_one";
    failover(test, FailureMode::Closed, false).await;
}

/// The master killed (`kill`), or demoted by `SENTINEL FAILOVER` and left running.
async fn failover(test: &str, failure: FailureMode, kill: bool) {
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
        c.limits.rate_limit_failure = failure;
    })
    .await;
    assert_eq!(app.handle.rate_limit_stats().backend, Backend::Redis);
    app.register(USER, PASSWORD).await.unwrap();
    assert_eq!(logins(&app, 2).await, 2);

    let key = format!("{prefix}:Login:global:3600000:{{}}");
    let (old, new) = (set.master.port, set.replica.port);
    let text = app.handle.render_metrics();
    let series = |port: u16| format!("authd_redis_sentinel_master{{address=\"127.0.0.1:{port}\"}}");
    assert_eq!(metric(&text, &series(old)), Some(1.0), "{text}");
    // The replica has the log before the master goes (asynchronous replication).
    wait_until("the replica has the log", || {
        cli(new, &["zcard", &key]).is_some_and(|o| o.trim() == "2")
    })
    .await;

    let killed = Instant::now();
    if kill {
        set.master.kill();
    } else {
        let port = set.sentinels[0].port;
        assert!(
            cli(port, &["sentinel", "failover", "mymaster"]).is_some_and(|o| o.contains("OK")),
            "SENTINEL FAILOVER accepted"
        );
    }
    let (mut degraded_at, mut back_at) = (None, None);
    let before = app.handle.rate_limit_stats();
    // Decisions on the new master show in its log of ValidateToken.
    let polled = format!("{prefix}:ValidateToken:global:3600000:{{}}");
    let mut count_on_new: Option<u64> = None;
    let give_up = killed + Duration::from_secs(90);
    while Instant::now() < give_up {
        // Fail open: answered throughout (the replica's counts); closed: UNAVAILABLE
        // while the limiter is degraded.
        let code = app.validate("not a token").await.unwrap_err().code();
        let backend = app.handle.rate_limit_stats().backend;
        match failure {
            FailureMode::Open => assert_eq!(code, Code::Unauthenticated),
            FailureMode::Closed => assert!(
                matches!(code, Code::Unauthenticated | Code::Unavailable),
                "{code:?}"
            ),
        }
        if backend == Backend::Degraded && degraded_at.is_none() {
            degraded_at = Some(killed.elapsed());
        }
        let promoted = cli(new, &["role"]).is_some_and(|o| o.starts_with("master"));
        let count: u64 = cli(new, &["zcard", &polled])
            .and_then(|o| o.trim().parse().ok())
            .unwrap_or(0);
        if backend == Backend::Redis && count_on_new.is_some_and(|c| count > c) {
            back_at = Some(killed.elapsed());
            break;
        }
        count_on_new = promoted.then_some(count);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let back_at = back_at.expect("authd decided on the new master within 90 s");
    eprintln!(
        "{test}: master {}; failure mode from {degraded_at:?}, decisions on the new master \
         after {back_at:?} (sentinel down-after 1000 ms)",
        if kill { "killed" } else { "demoted" },
    );
    let stats = app.handle.rate_limit_stats();
    if kill {
        assert!(degraded_at.is_some(), "a dead master is a failure");
    }
    if degraded_at.is_some() {
        match failure {
            FailureMode::Open => assert!(
                stats.local_decisions > before.local_decisions,
                "the in-process counts served meanwhile"
            ),
            FailureMode::Closed => assert!(
                stats.unavailable > before.unavailable,
                "UNAVAILABLE meanwhile"
            ),
        }
    }

    // The metrics name the master answering.
    let text = app.handle.render_metrics();
    assert_eq!(metric(&text, &series(new)), Some(1.0), "{text}");
    assert_eq!(metric(&text, &series(old)), None);

    // Exact again, on the new master: the log it had, then exactly the rest.
    let held: usize = (cli(new, &["zcard", &key]).unwrap().trim().parse()).unwrap();
    let before = app.handle.rate_limit_stats();
    let ok = logins(&app, 8).await;
    let after = app.handle.rate_limit_stats();
    assert_eq!(after.local_decisions, before.local_decisions);
    assert_eq!(ok, 5 - held, "{held} held already");
    assert_eq!(cli(new, &["zcard", &key]).unwrap().trim(), "5");
}
