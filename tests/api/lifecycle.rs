//! What happens across restarts and shutdowns: durability, rehashing, draining.

use crate::helpers::{SLOW_ITERATIONS, TestDb, expect_code, register, spawn_app_on, wait_until};
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

async fn an_acknowledged_registration_is_already_in_the_database(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    app.register("judy", "a fine password").await.unwrap();
    // No shutdown, no flush: the acknowledgement came after the commit.
    let hash = db.stored_hash("judy").await.expect("the row is on disk");
    assert!(hash.starts_with("$pbkdf2-sha256$i=1000,l=32$"), "{hash}");
}

async fn data_survives_a_restart_on_the_same_database(db: TestDb) {
    let mut first = spawn_app_on(&db, |_| {}).await;
    let id = first.register("Kim", "a fine password").await.unwrap();
    let token = first
        .login("kim", "a fine password")
        .await
        .unwrap()
        .access_token;
    first.stop().await.expect("a clean stop");

    let mut second = spawn_app_on(&db, |_| {}).await;
    let session = second.login("KIM", "a fine password").await.unwrap();
    assert_eq!(session.user_id, id);
    // Same key ring: the token from before the restart is still valid.
    assert_eq!(second.validate(&token).await.unwrap().user_id, id);
    expect_code(
        second.register("kim", "another password").await,
        Code::AlreadyExists,
    );
}

async fn a_login_rehashes_a_password_stored_with_other_parameters(db: TestDb) {
    let mut first = spawn_app_on(&db, |c| c.passwords.pbkdf2_iterations = 1000).await;
    first.register("leo", "a fine password").await.unwrap();
    let before = db.stored_hash("leo").await.unwrap();
    assert!(before.starts_with("$pbkdf2-sha256$i=1000,"), "{before}");
    first.stop().await.unwrap();

    let mut second = spawn_app_on(&db, |c| c.passwords.pbkdf2_iterations = 2000).await;
    // A failed login changes nothing.
    expect_code(
        second.login("leo", "not the password").await,
        Code::Unauthenticated,
    );
    assert_eq!(db.stored_hash("leo").await.unwrap(), before);

    second.login("leo", "a fine password").await.unwrap();
    let after = db.stored_hash("leo").await.unwrap();
    assert!(after.starts_with("$pbkdf2-sha256$i=2000,l=32$"), "{after}");
    assert_ne!(after, before);
    // The new hash verifies, and is not replaced again.
    second.login("leo", "a fine password").await.unwrap();
    assert_eq!(db.stored_hash("leo").await.unwrap(), after);
}

async fn shutdown_reports_not_serving_refuses_new_work_and_finishes_work_in_flight(db: TestDb) {
    let mut app = spawn_app_on(&db, |c| {
        c.passwords.hash_threads = Some(1);
        c.passwords.pbkdf2_iterations = SLOW_ITERATIONS;
    })
    .await;
    assert_eq!(app.health_status("").await, ServingStatus::Serving);
    assert_eq!(
        app.health_status("auth.v1.AuthService").await,
        ServingStatus::Serving
    );
    assert_eq!(app.health_status("liveness").await, ServingStatus::Serving);

    let in_flight = tokio::spawn({
        let mut client = app.client.clone();
        async move { register(&mut client, "mallory", "a fine password").await }
    });
    let handle = app.handle.clone();
    wait_until("the registration is hashing", || {
        handle.hash_stats().running == 1
    })
    .await;

    app.begin_shutdown();
    wait_until("the drain has begun", || {
        !in_flight.is_finished() && handle.in_flight() == 1
    })
    .await;
    app.until_health_is("", ServingStatus::NotServing).await;
    assert_eq!(
        app.health_status("auth.v1.AuthService").await,
        ServingStatus::NotServing
    );
    // Draining is not dying: a liveness probe must not restart the process now.
    assert_eq!(app.health_status("liveness").await, ServingStatus::Serving);
    assert!(
        !in_flight.is_finished(),
        "the drain was observed while the request was in flight"
    );

    let refused = expect_code(
        app.login("mallory", "a fine password").await,
        Code::Unavailable,
    );
    assert!(refused.message().contains("shutting down"), "{refused:?}");

    in_flight
        .await
        .unwrap()
        .expect("the request in flight when shutdown began completes");
    app.stop().await.expect("a clean stop");
    assert!(
        db.stored_hash("mallory").await.is_some(),
        "the write was flushed"
    );
}

crate::backend_tests!(
    an_acknowledged_registration_is_already_in_the_database,
    data_survives_a_restart_on_the_same_database,
    a_login_rehashes_a_password_stored_with_other_parameters,
    shutdown_reports_not_serving_refuses_new_work_and_finishes_work_in_flight,
);
