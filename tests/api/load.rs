//! Behaviour when the service is full: refuse at once, keep probes answering, and
//! never spend a hash on a request nobody waits for.

use crate::helpers::{
    SLOW_ITERATIONS, TestDb, expect_code, metric, register, spawn_app_on, wait_until,
};
use authd::pb::{LoginRequest, auth_service_client::AuthServiceClient};
use futures::future::join_all;
use std::time::Duration;
use tonic::{Code, transport::Channel};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt;

fn retry_delay(status: &tonic::Status) -> Duration {
    let details = status.check_error_details().expect("details decode");
    details
        .retry_info()
        .and_then(|r| r.retry_delay)
        .expect("a RetryInfo with a delay")
}

/// A login with the deadline `timeout` (sent as `grpc-timeout`).
async fn login_within(
    client: &AuthServiceClient<Channel>,
    username: &str,
    timeout: Duration,
) -> Result<(), tonic::Status> {
    let mut request = tonic::Request::new(LoginRequest {
        username: username.into(),
        password: "a fine password".into(),
    });
    request.set_timeout(timeout);
    client.clone().login(request).await.map(|_| ())
}

async fn a_burst_that_cannot_be_answered_in_time_is_refused_at_once(db: TestDb) {
    let mut app = spawn_app_on(&db, |c| {
        c.passwords.hash_threads = Some(1);
        c.passwords.pbkdf2_iterations = SLOW_ITERATIONS / 4;
    })
    .await;
    // One account per login of the burst: no login waits for another attempt on its
    // account (the login throttle's rule). Registered with all the time they need:
    // this test's server shares the machine with the others.
    let accounts = (0..40).map(|i| {
        let mut request = tonic::Request::new(authd::pb::RegisterRequest {
            username: format!("burst-{i}"),
            password: "a fine password".into(),
        });
        request.set_timeout(Duration::from_secs(600));
        let mut client = app.client.clone();
        async move { client.register(request).await }
    });
    for result in join_all(accounts).await {
        result.unwrap();
    }
    // Logins one after another until the rate they are answered at is measured.
    let handle = app.handle.clone();
    let rate = || {
        let text = handle.render_metrics();
        metric(&text, "authd_admission_answer_rate{kind=\"hash\"}").filter(|r| *r > 0.0)
    };
    for _ in 0..200 {
        if rate().is_some() {
            break;
        }
        app.login("burst-0", "a fine password").await.unwrap();
    }
    let rate = rate().expect("the answer rate is measured");
    // A deadline in which about ten logins one after another fit the room of a client
    // alone (three quarters of it), and forty sent at once.
    let deadline = Duration::from_secs_f64(10.0 / (0.75 * rate));
    let completed = handle.hash_stats().completed;
    let burst = (0..40).map(|i| {
        let client = app.client.clone();
        let handle = handle.clone();
        async move {
            let result = login_within(&client, &format!("burst-{i}"), deadline).await;
            (result, handle.hash_stats().completed)
        }
    });
    let results = join_all(burst).await;
    let refused: Vec<_> = results
        .iter()
        .filter_map(|(r, done)| match r {
            Err(s) if s.code() == Code::ResourceExhausted => Some((s, *done)),
            _ => None,
        })
        .collect();
    assert!(refused.len() >= 20, "about ten of forty fit: {results:?}");
    for (status, hashes_done) in &refused {
        assert_eq!(
            *hashes_done, completed,
            "refused at once, before any hash of the burst"
        );
        assert!(status.message().contains("deadline"), "{status:?}");
        // Told to come back once the work ahead is done: at least ten logins' time.
        assert!(retry_delay(status) >= Duration::from_secs_f64(10.0 / rate) / 2);
        assert!(status.metadata().get("retry-after").is_some(), "{status:?}");
    }
    // The others were admitted: answered, or (on a machine slowed by the tests
    // beside this one) at their deadline, by the server or by the client's own timer.
    assert!(
        results.iter().all(|(r, _)| match r {
            Ok(()) => true,
            Err(s) => matches!(
                s.code(),
                Code::ResourceExhausted | Code::DeadlineExceeded | Code::Cancelled
            ),
        }),
        "{results:?}"
    );
    // The same forty with a deadline they all fit in: every one admitted.
    let patient = (0..40).map(|i| {
        let client = app.client.clone();
        async move { login_within(&client, &format!("burst-{i}"), 50 * deadline).await }
    });
    for result in join_all(patient).await {
        result.unwrap();
    }
}

async fn health_answers_while_every_hash_thread_is_busy(db: TestDb) {
    let mut app = spawn_app_on(&db, |c| {
        c.passwords.hash_threads = Some(1);
        c.passwords.pbkdf2_iterations = SLOW_ITERATIONS;
    })
    .await;
    let busy = tokio::spawn({
        let mut client = app.client.clone();
        async move { register(&mut client, "busy", "a fine password").await }
    });
    let handle = app.handle.clone();
    wait_until("the only hash thread is busy", || {
        handle.hash_stats().running == 1
    })
    .await;

    assert_eq!(app.health_status("").await, ServingStatus::Serving);
    assert_eq!(
        app.health_status("auth.v1.AuthService").await,
        ServingStatus::Serving
    );
    // Ordering, not timing: health answered before the running hash finished.
    assert_eq!(handle.hash_stats().completed, 0);
    assert!(!busy.is_finished());
    busy.await.unwrap().unwrap();
}

async fn a_request_whose_deadline_passes_in_the_queue_is_never_hashed(db: TestDb) {
    let mut app = spawn_app_on(&db, |c| {
        c.passwords.hash_threads = Some(1);
        c.passwords.pbkdf2_iterations = SLOW_ITERATIONS;
    })
    .await;
    let first = tokio::spawn({
        let mut client = app.client.clone();
        async move { register(&mut client, "patient", "a fine password").await }
    });
    let handle = app.handle.clone();
    wait_until("the only hash thread is busy", || {
        handle.hash_stats().running == 1
    })
    .await;

    // The deadline travels as grpc-timeout, on a connection whose client does not
    // enforce it itself (a tonic client would race the server with its own timer
    // and may give up with CANCELLED first), so what comes back is the server's answer.
    // Half the shortest time the first hash takes: enough for the request to reach
    // the queue on a loaded machine (its lookup on PostgreSQL included), too little
    // for the first hash to end.
    let request = authd::pb::RegisterRequest {
        username: "hasty".into(),
        password: "a fine password".into(),
    };
    let status = crate::h2raw::unary(
        app.addr,
        "/auth.v1.AuthService/Register",
        &request,
        &[("grpc-timeout", "250m")],
    )
    .await;
    assert_eq!(status.0, Code::DeadlineExceeded as i32, "{status:?}");
    assert!(
        !first.is_finished(),
        "the deadline passed while the first hash ran"
    );

    first.await.unwrap().unwrap();
    wait_until("the expired job is dropped", || {
        let s = handle.hash_stats();
        s.dropped_cancelled + s.dropped_expired == 1
    })
    .await;
    assert_eq!(
        handle.hash_stats().completed,
        1,
        "only the patient request was hashed: {status:?}"
    );
    // The hasty user was not created.
    expect_code(
        app.login("hasty", "a fine password").await,
        Code::Unauthenticated,
    );
}

async fn requests_beyond_the_admission_cap_are_refused_but_probes_pass(db: TestDb) {
    let mut app = spawn_app_on(&db, |c| {
        c.passwords.hash_threads = Some(1);
        c.overload.max_in_flight = 1;
        c.passwords.pbkdf2_iterations = SLOW_ITERATIONS;
    })
    .await;
    let first = tokio::spawn({
        let mut client = app.client.clone();
        async move { register(&mut client, "first", "a fine password").await }
    });
    let handle = app.handle.clone();
    wait_until("one request is admitted", || handle.in_flight() == 1).await;

    let status = expect_code(
        app.login("first", "a fine password").await,
        Code::ResourceExhausted,
    );
    assert!(status.message().contains("in flight"), "{status:?}");
    assert!(retry_delay(&status) > Duration::ZERO);
    assert_eq!(app.health_status("").await, ServingStatus::Serving);
    first.await.unwrap().unwrap();
}

crate::backend_tests!(
    a_burst_that_cannot_be_answered_in_time_is_refused_at_once,
    health_answers_while_every_hash_thread_is_busy,
    a_request_whose_deadline_passes_in_the_queue_is_never_hashed,
    requests_beyond_the_admission_cap_are_refused_but_probes_pass,
);
