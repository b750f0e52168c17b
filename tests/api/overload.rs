//! Overload without collapse, through the real server: clients from distinct
//! 127.0.0.x addresses (each socket bound to its own), both backends.
//!
//! - a client that re-asks at once is held to the room of its deadline, and a
//!   polite client beside it is never refused;
//! - a busy client alone has every request admitted while they fit its deadline:
//!   no count bound refuses it;
//! - a refusal is held before its answer (pushback), bounded per client, and a
//!   graceful shutdown answers every held refusal at once; a client that goes away
//!   frees what it held.
//!
//! Every verdict is a count (answers by code, refusals held), never a time.

use crate::helpers::{
    SLOW_ITERATIONS, TestDb, connect_from, metric, spawn_app_on, spawn_registrations, wait_until,
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
    a_client_that_re_asks_at_once_is_held_to_its_deadline_and_a_polite_one_is_never_refused,
    a_busy_client_alone_has_every_request_admitted_while_they_fit_its_deadline,
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

/// A login with the deadline `timeout`.
async fn login_within(
    client: &AuthServiceClient<Channel>,
    username: &str,
    timeout: Duration,
) -> Result<(), Status> {
    let mut request = Request::new(LoginRequest {
        username: username.into(),
        password: PASSWORD.into(),
    });
    request.set_timeout(timeout);
    client.clone().login(request).await.map(|_| ())
}

/// A login with a deadline far beyond any test: its refusal may be held as long as
/// the server's longest hold (a call with no deadline is held a second at most).
async fn patient_login(client: &AuthServiceClient<Channel>, username: &str) -> Result<(), Status> {
    login_within(client, username, Duration::from_secs(600)).await
}

async fn a_client_that_re_asks_at_once_is_held_to_its_deadline_and_a_polite_one_is_never_refused(
    db: TestDb,
) {
    // One costly stored hash, written by an app of that cost: a failed login then
    // costs as much (an unknown username is hashed against a dummy of the highest
    // stored cost), so the eager client's logins take long enough to fill the room
    // of their deadline whatever the speed of the machine or of the database.
    let mut costly = spawn_app_on(&db, |c| c.passwords.pbkdf2_iterations = COSTLY_ITERATIONS).await;
    costly.register("costly", PASSWORD).await.unwrap();
    costly.stop().await.unwrap();
    let mut app = spawn_app_on(&db, |c| {
        c.passwords.hash_threads = Some(1);
        // The hashing thread at the priority of the rest: the eager client's storm of
        // refusals slows its own hashes, not the polite client's (other tests cover
        // the nice value).
        c.passwords.hash_thread_nice = 0;
        // Refusals held as by default (pushback): the eager client asks again the
        // moment it is answered, and is slowed, not served.
        c.overload.refusal_hold = authd::config::Config::defaults().overload.refusal_hold;
        // No throttle: the eager client's failed logins are all hashed.
        c.limits.login_failures = 0;
    })
    .await;
    for i in 0..3 {
        app.register(&format!("polite-{i}"), PASSWORD)
            .await
            .unwrap();
    }
    // Logins like the eager client's (an unknown user: a failure, padded to the costly
    // hash), one after another, until the rate they are answered at is measured.
    let handle = app.handle.clone();
    let rate = || {
        let text = handle.render_metrics();
        metric(&text, "authd_admission_answer_rate{kind=\"hash\"}").filter(|r| *r > 0.0)
    };
    for _ in 0..200 {
        if rate().is_some() {
            break;
        }
        let status = app.login("nobody", PASSWORD).await.unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    }
    let rate = rate().expect("the answer rate is measured");
    // The eager client's deadline fits about ten logins in the room of a busy client
    // (three quarters of it); the polite client's is ten times as long: the eager
    // client's storm may slow the machine, and the polite client must not depend on
    // how much.
    let eager_deadline = Duration::from_secs_f64(10.0 / (0.75 * rate));
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
                    match login_within(&client, &format!("eager-{i}"), eager_deadline).await {
                        // Hashed and answered: no such user.
                        Err(s) if s.code() == Code::Unauthenticated => {
                            answered.fetch_add(1, Ordering::SeqCst)
                        }
                        Err(s) if s.code() == Code::ResourceExhausted => {
                            refused.fetch_add(1, Ordering::SeqCst)
                        }
                        // Admitted on a rate its own storm kept the machine from
                        // keeping up: answered at the deadline, by the server or by
                        // the client's own timer.
                        Err(s) if matches!(s.code(), Code::DeadlineExceeded | Code::Cancelled) => 0,
                        Ok(()) => panic!("an unknown user logged in"),
                        Err(s) => panic!("the eager client got {s:?}"),
                    };
                }
            })
        })
        .collect();
    let counted = eager_refused.clone();
    wait_until("the eager client is refused", || {
        counted.load(Ordering::SeqCst) > 0
    })
    .await;

    // Three polite logins at a time, one after another, twenty each.
    let results = join_all((0..3).map(|i| {
        let client = polite.clone();
        async move {
            let (username, deadline) = (format!("polite-{i}"), 10 * eager_deadline);
            let mut codes = Vec::new();
            for _ in 0..20 {
                let login = login_within(&client, &username, deadline);
                codes.push(login.await.map_err(|s| s.code()));
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
    let metrics = app.handle.render_metrics();
    let refusals = |cause: &str| {
        metric(
            &metrics,
            &format!("authd_admission_refused_total{{cause=\"{cause}\"}}"),
        )
    };
    assert!(refusals("deadline").unwrap() + refusals("share").unwrap() > 0.0);
    assert_eq!(refusals("in_flight"), Some(0.0));
    assert_eq!(refusals("client"), Some(0.0));
}

async fn a_busy_client_alone_has_every_request_admitted_while_they_fit_its_deadline(db: TestDb) {
    let app = spawn_app_on(&db, |c| {
        c.passwords.hash_threads = Some(1);
        c.passwords.pbkdf2_iterations = SLOW_ITERATIONS;
        // A share of one request per client: the busy client goes past it while
        // the in-flight cap has room beyond a share.
        c.overload.max_in_flight = 16;
        c.overload.max_in_flight_per_client = Some(1);
        c.overload.refusal_hold = Duration::ZERO;
    })
    .await;
    let busy = connect_from(app.addr, EAGER).await;
    // Ten registrations at once, with no deadline (the longest wait, 5 s): nothing
    // is measured yet, so nothing predicts they would not fit; all ten are taken
    // at once, to the hashing thread or its queue, and nothing refuses any.
    let calls = spawn_registrations(&busy, "busy", 10, PASSWORD);
    let handle = app.handle.clone();
    wait_until("all ten are hashing or queued", || {
        let stats = handle.hash_stats();
        stats.running as usize + handle.hash_queued() == 10
    })
    .await;
    assert_eq!(app.handle.open_for(EAGER.into()), 10);
    assert_eq!(app.handle.in_flight(), 10);
    let metrics = app.handle.render_metrics();
    for cause in ["deadline", "share", "client", "in_flight"] {
        let series = format!("authd_admission_refused_total{{cause=\"{cause}\"}}");
        assert_eq!(metric(&metrics, &series), Some(0.0), "{cause}");
    }
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
