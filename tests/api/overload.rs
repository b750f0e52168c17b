//! Overload without collapse, through the real server: clients from distinct
//! 127.0.0.x addresses (each socket bound to its own), both backends.
//!
//! - the hash queue is fair between clients and work-conserving: a polite client
//!   beside one that re-asks at once is never refused, and a busy client alone gets
//!   the whole queue;
//! - requests in flight are bounded by the time they would take, at the answer
//!   rate measured: a client that re-asks at once is refused at that bound, one
//!   below its fair share of it never;
//! - a refusal is held before its answer (pushback), bounded per client, and a
//!   graceful shutdown answers every held refusal at once; a client that goes away
//!   frees what it held.
//!
//! Every verdict is a count (answers by code, refusals held), never a time.

use crate::helpers::{
    SLOW_ITERATIONS, TestDb, connect_from, spawn_app_on, spawn_registrations, wait_until,
};
use authd::pb::{LoginRequest, auth_service_client::AuthServiceClient};
use futures::future::join_all;
use std::{
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};
use tonic::{Code, Request, Status, transport::Channel};
use tonic_types::StatusExt as _;

const PASSWORD: &str = "correct horse battery";
const EAGER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 30);
const POLITE: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 31);
/// A cost that holds a hashing lane for a tenth of a second or more on any machine,
/// and registers one account in well under a second.
const COSTLY_ITERATIONS: u32 = SLOW_ITERATIONS / 4;

crate::backend_tests!(
    a_polite_client_beside_one_that_re_asks_at_once_is_never_refused,
    one_busy_client_alone_may_fill_the_whole_queue,
    requests_in_flight_are_bounded_by_time_and_a_polite_client_still_gets_in,
    refusals_are_held_within_their_bounds_and_a_shutdown_answers_them,
);

async fn login(client: &AuthServiceClient<Channel>, username: &str) -> Result<(), Status> {
    (client.clone())
        .login(LoginRequest {
            username: username.into(),
            password: PASSWORD.into(),
        })
        .await
        .map(|_| ())
}

/// A login with a deadline far beyond any test: its refusal may be held as long as
/// the server's longest hold (a call with no deadline is held a second at most).
async fn patient_login(client: &AuthServiceClient<Channel>, username: &str) -> Result<(), Status> {
    let mut request = Request::new(LoginRequest {
        username: username.into(),
        password: PASSWORD.into(),
    });
    request.set_timeout(Duration::from_secs(600));
    client.clone().login(request).await.map(|_| ())
}

async fn a_polite_client_beside_one_that_re_asks_at_once_is_never_refused(db: TestDb) {
    // One costly stored hash, written by an app of that cost: a failed login then
    // costs as much (an unknown username is hashed against a dummy of the highest
    // stored cost), so the eager client's logins hold their places long enough to
    // fill the queue whatever the speed of the machine or of the database.
    let mut costly = spawn_app_on(&db, |c| c.passwords.pbkdf2_iterations = COSTLY_ITERATIONS).await;
    costly.register("costly", PASSWORD).await.unwrap();
    costly.stop().await.unwrap();
    let mut app = spawn_app_on(&db, |c| {
        // One thread and a queue of a few batches: the eager client alone fills it.
        c.passwords.hash_threads = Some(1);
        c.passwords.hash_queue = Some(8);
        // The hashing thread at the priority of the rest: the eager client's storm of
        // refusals slows its own hashes, not the polite client's (other tests cover
        // the nice value).
        c.passwords.hash_thread_nice = 0;
        // Refusals answered at once: the eager client re-asks as fast as it can.
        c.overload.refusal_hold = Duration::ZERO;
        // No throttle: the eager client's failed logins are all hashed.
        c.limits.login_failures = 0;
    })
    .await;
    for i in 0..3 {
        app.register(&format!("polite-{i}"), PASSWORD)
            .await
            .unwrap();
    }
    let eager = connect_from(app.addr, EAGER).await;
    let polite = connect_from(app.addr, POLITE).await;

    // Forty logins of unknown users always in flight from one address, each asking
    // again the moment it is answered, until the polite client is done.
    let done = Arc::new(AtomicBool::new(false));
    let (eager_answered, eager_refused) =
        (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let storm: Vec<_> = (0..40)
        .map(|i| {
            let (client, done) = (eager.clone(), done.clone());
            let (answered, refused) = (eager_answered.clone(), eager_refused.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::SeqCst) {
                    match login(&client, &format!("eager-{i}")).await {
                        // Hashed and answered: no such user.
                        Err(s) if s.code() == Code::Unauthenticated => {
                            answered.fetch_add(1, Ordering::SeqCst)
                        }
                        Err(s) if s.code() == Code::ResourceExhausted => {
                            refused.fetch_add(1, Ordering::SeqCst)
                        }
                        Ok(()) => panic!("an unknown user logged in"),
                        Err(s) => panic!("the eager client got {s:?}"),
                    };
                }
            })
        })
        .collect();
    let counted = eager_refused.clone();
    wait_until("the eager client is refused (the queue is full)", || {
        counted.load(Ordering::SeqCst) > 0
    })
    .await;

    // Three polite logins at a time, one after another, twenty each.
    let results = join_all((0..3).map(|i| {
        let client = polite.clone();
        async move {
            let mut codes = Vec::new();
            for _ in 0..20 {
                codes.push(
                    login(&client, &format!("polite-{i}"))
                        .await
                        .map_err(|s| s.code()),
                );
            }
            codes
        }
    }))
    .await;
    let refused_meanwhile = eager_refused.load(Ordering::SeqCst);
    done.store(true, Ordering::SeqCst);
    for task in storm {
        task.await.unwrap();
    }
    let polite: Vec<_> = results.into_iter().flatten().collect();
    assert_eq!(polite.len(), 60);
    assert!(
        polite.iter().all(Result::is_ok),
        "every polite login succeeds: {polite:?}"
    );
    // The eager client was refused all along, and still served (its answers say no
    // such user).
    assert!(refused_meanwhile > 0);
    assert!(eager_answered.load(Ordering::SeqCst) > 0);
}

async fn requests_in_flight_are_bounded_by_time_and_a_polite_client_still_gets_in(db: TestDb) {
    let mut app = spawn_app_on(&db, |c| {
        // A target no login meets: once the answer rate is measured, the bound is
        // its floor (two full batches for the one hashing thread).
        c.overload.in_flight_wait = Duration::from_millis(1);
        c.passwords.hash_threads = Some(1);
        c.overload.refusal_hold = Duration::ZERO;
    })
    .await;
    // One at a time (never beyond any bound), one account per eager request in
    // flight; these answers are the first measurement.
    const EAGER_IN_FLIGHT: usize = 150;
    for i in 0..EAGER_IN_FLIGHT {
        app.register(&format!("eager-{i}"), PASSWORD).await.unwrap();
    }
    app.register("polite", PASSWORD).await.unwrap();
    let handle = app.handle.clone();
    let gauge = |name: &str| crate::helpers::metric(&handle.render_metrics(), name);
    wait_until("the answer rate is measured", || {
        gauge("authd_admission_answer_rate").is_some_and(|rate| rate > 0.0)
    })
    .await;
    let limit = gauge("authd_admission_in_flight_limit").unwrap();
    assert!(
        (1.0..EAGER_IN_FLIGHT as f64).contains(&limit),
        "the bound is the floor, below the eager client's requests: {limit}"
    );

    let eager = connect_from(app.addr, EAGER).await;
    let polite = connect_from(app.addr, POLITE).await;
    let done = Arc::new(AtomicBool::new(false));
    let (eager_ok, eager_refused) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let storm: Vec<_> = (0..EAGER_IN_FLIGHT)
        .map(|i| {
            let (client, done) = (eager.clone(), done.clone());
            let (ok, refused) = (eager_ok.clone(), eager_refused.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::SeqCst) {
                    match login(&client, &format!("eager-{i}")).await {
                        Ok(()) => ok.fetch_add(1, Ordering::SeqCst),
                        Err(s) if s.code() == Code::ResourceExhausted => {
                            refused.fetch_add(1, Ordering::SeqCst)
                        }
                        Err(s) => panic!("the eager client got {s:?}"),
                    };
                }
            })
        })
        .collect();
    wait_until("the bound by time refuses the eager client", || {
        gauge("authd_admission_refused_total{cause=\"wait\"}").is_some_and(|n| n > 0.0)
    })
    .await;
    // One polite login at a time: below any fair share of the bound.
    let mut polite_codes = Vec::new();
    for _ in 0..30 {
        polite_codes.push(login(&polite, "polite").await.map_err(|s| s.code()));
    }
    done.store(true, Ordering::SeqCst);
    for task in storm {
        task.await.unwrap();
    }
    assert!(
        polite_codes.iter().all(Result::is_ok),
        "every polite login succeeds: {polite_codes:?}"
    );
    assert!(eager_ok.load(Ordering::SeqCst) > 0);
    assert!(eager_refused.load(Ordering::SeqCst) > 0);
}

async fn one_busy_client_alone_may_fill_the_whole_queue(db: TestDb) {
    let app = spawn_app_on(&db, |c| {
        c.passwords.hash_threads = Some(1);
        c.passwords.hash_queue = Some(5);
        c.passwords.pbkdf2_iterations = SLOW_ITERATIONS;
        // A share of one request per client: the busy client goes past it while
        // the in-flight cap has room beyond a share.
        c.overload.max_in_flight = 16;
        c.overload.max_in_flight_per_client = Some(1);
        c.overload.refusal_hold = Duration::ZERO;
    })
    .await;
    let busy = connect_from(app.addr, EAGER).await;
    // Ten registrations at once: the thread and the queue of five take six (one
    // running, five queued), and only the hash queue's bound refuses the rest.
    let calls = spawn_registrations(&busy, "busy", 10, PASSWORD);
    let handle = app.handle.clone();
    wait_until("the thread and the queue are full", || {
        let stats = handle.hash_stats();
        stats.running as usize + handle.hash_queued() == 6 && stats.rejected == 4
    })
    .await;
    // Every place is the busy client's, and nothing refused it but the queue's bound.
    assert_eq!(app.handle.open_for(EAGER.into()), 6);
    let metrics = app.handle.render_metrics();
    let full = crate::helpers::metric(&metrics, "authd_hash_refused_total{cause=\"full\"}");
    assert_eq!(full, Some(4.0));
    assert_eq!(
        crate::helpers::metric(&metrics, "authd_admission_refused_total{cause=\"client\"}"),
        Some(0.0)
    );
    for call in calls {
        call.abort();
    }
}

async fn refusals_are_held_within_their_bounds_and_a_shutdown_answers_them(db: TestDb) {
    let mut app = spawn_app_on(&db, |c| {
        // Two logins an hour per address: the rest refused, with an hour's hint.
        c.limits.rate_limits = Some("Login:peer=2/1h".parse().unwrap());
        c.limits.trust_forwarded_for = false;
        // Held for as long as a test could take; five at most for one client.
        c.overload.refusal_hold = Duration::from_secs(60);
        c.overload.refusal_rate = 1;
        c.overload.refusal_hold_max_per_client = Some(5);
    })
    .await;
    app.register("held", PASSWORD).await.unwrap();
    let client = connect_from(app.addr, EAGER).await;
    for _ in 0..2 {
        login(&client, "held").await.unwrap();
    }
    let answered = Arc::new(AtomicUsize::new(0));
    // Ten more at once, all refused: five are held, five answered at once.
    let calls: Vec<_> = (0..10)
        .map(|_| {
            let client = client.clone();
            let answered = answered.clone();
            tokio::spawn(async move {
                let result = patient_login(&client, "held").await;
                answered.fetch_add(1, Ordering::SeqCst);
                result
            })
        })
        .collect();
    let handle = app.handle.clone();
    let counted = answered.clone();
    wait_until("five refusals held and five answered", || {
        handle.refusals_held() == 5 && counted.load(Ordering::SeqCst) == 5
    })
    .await;
    let metrics = app.handle.render_metrics();
    let value = |series| crate::helpers::metric(&metrics, series);
    assert_eq!(value("authd_refusals_held"), Some(5.0));
    assert_eq!(value("authd_refusals_held_total"), Some(5.0));
    assert_eq!(value("authd_refusals_unheld_total"), Some(5.0));

    // Another client's refusal is held beside them (its own bound), and freed when
    // the client goes away.
    let other = connect_from(app.addr, POLITE).await;
    for _ in 0..2 {
        login(&other, "held").await.unwrap();
    }
    let abandoned = tokio::spawn({
        let other = other.clone();
        async move { patient_login(&other, "held").await }
    });
    wait_until("the other client's refusal is held", || {
        handle.refusals_held() == 6
    })
    .await;
    abandoned.abort();
    drop(other);
    wait_until("the abandoned refusal is no longer held", || {
        handle.refusals_held() == 5
    })
    .await;
    assert_eq!(
        answered.load(Ordering::SeqCst),
        5,
        "the held ones still wait"
    );

    // A graceful shutdown answers every held refusal at once, with what is left of
    // its hint.
    app.begin_shutdown();
    for call in calls {
        let status = call.await.unwrap().unwrap_err();
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        let details = status.check_error_details().unwrap();
        let left = details.retry_info().and_then(|r| r.retry_delay).unwrap();
        assert!(left > Duration::from_secs(3000), "about an hour: {left:?}");
        assert!(details.quota_failure().is_some(), "the rule is still named");
    }
    assert_eq!(app.handle.refusals_held(), 0);
}
