//! Behaviour when the service is full: refuse at once, keep probes answering, and
//! never spend a hash on a request nobody waits for.

use crate::helpers::{SLOW_ITERATIONS, TestDb, expect_code, register, spawn_app_on, wait_until};
use futures::future::join_all;
use std::time::Duration;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_types::StatusExt;

fn retry_delay(status: &tonic::Status) -> Duration {
    let details = status.check_error_details().expect("details decode");
    details
        .retry_info()
        .and_then(|r| r.retry_delay)
        .expect("a RetryInfo with a delay")
}

async fn a_burst_beyond_the_hash_queue_is_refused_at_once(db: TestDb) {
    let app = spawn_app_on(&db, |c| {
        c.passwords.hash_threads = Some(1);
        c.passwords.hash_queue = Some(1);
        c.passwords.pbkdf2_iterations = SLOW_ITERATIONS;
    })
    .await;
    let handle = app.handle.clone();
    let burst = (0..10).map(|i| {
        let mut client = app.client.clone();
        let handle = handle.clone();
        async move {
            let result = register(&mut client, &format!("burst-{i}"), "a fine password").await;
            // How many hashes had finished when this answer arrived.
            (result, handle.hash_stats().completed)
        }
    });
    let results = join_all(burst).await;

    let ok = results.iter().filter(|(r, _)| r.is_ok()).count();
    let refused: Vec<_> = results
        .iter()
        .filter_map(|(r, done)| match r {
            Err(s) if s.code() == Code::ResourceExhausted => Some((s, *done)),
            _ => None,
        })
        .collect();
    assert_eq!(ok + refused.len(), 10, "{results:?}");
    assert!(
        ok <= 2,
        "one thread and a queue of one admit at most two: {ok}"
    );
    assert!(refused.len() >= 8);
    for (status, hashes_done) in refused {
        assert_eq!(hashes_done, 0, "refused at once, before any hash finished");
        assert!(retry_delay(status) > Duration::ZERO);
        assert!(status.metadata().get("retry-after").is_some(), "{status:?}");
    }
    assert!(handle.hash_stats().rejected >= 8);
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
    a_burst_beyond_the_hash_queue_is_refused_at_once,
    health_answers_while_every_hash_thread_is_busy,
    a_request_whose_deadline_passes_in_the_queue_is_never_hashed,
    requests_beyond_the_admission_cap_are_refused_but_probes_pass,
);
