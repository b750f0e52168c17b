//! PostgreSQL only: several replicas on one database, and a database that stops
//! answering and comes back.

use crate::equal_cost::rounds_of_a_failed_login;
use crate::helpers::{
    Backend, TestDb, expect_code, login, ok_and_taken, register, spawn_app_behind_proxy,
    spawn_app_on, wait_for, wait_until,
};
use futures::future::join_all;
use std::time::Duration;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

#[tokio::test]
async fn two_replicas_on_one_database_agree_on_users_and_tokens() {
    let Some(db) = TestDb::new(Backend::Postgres, "two_replicas").await else {
        return;
    };
    // Each replica has its own pool; both share the key ring.
    let mut a = spawn_app_on(&db, |_| ()).await;
    let mut b = spawn_app_on(&db, |_| ()).await;

    let attempts = (0..50).map(|i| {
        let mut client = if i % 2 == 0 {
            a.client.clone()
        } else {
            b.client.clone()
        };
        async move { register(&mut client, "Contested", &format!("password number {i}")).await }
    });
    let results = join_all(attempts).await;
    assert_eq!(ok_and_taken(&results), (1, 49), "{results:?}");

    let id = a.register("Rita", "a fine password").await.unwrap();
    let session = b.login("rita", "a fine password").await.unwrap();
    assert_eq!(session.user_id, id);
    let token = a
        .login("RITA", "a fine password")
        .await
        .unwrap()
        .access_token;
    assert_eq!(b.validate(&token).await.unwrap().user_id, id);
    assert_eq!(
        a.validate(&session.access_token).await.unwrap().username,
        "rita"
    );
}

#[tokio::test]
async fn an_unreachable_database_gives_unavailable_and_not_serving_until_it_returns() {
    let Some(db) = TestDb::new(Backend::Postgres, "unreachable_database").await else {
        return;
    };
    let acquire_timeout = Duration::from_secs(1);
    let (mut app, proxy) = spawn_app_behind_proxy(&db, |c| {
        c.store.db_acquire_timeout = acquire_timeout;
        c.server.health_interval = Duration::from_millis(100);
    })
    .await;
    app.register("sam", "a fine password").await.unwrap();
    assert_eq!(app.health_status("").await, ServingStatus::Serving);

    proxy.cut();
    // Given up on at the acquire timeout, as UNAVAILABLE.
    let status = expect_code(app.login("sam", "a fine password").await, Code::Unavailable);
    assert!(
        status.message().contains("database"),
        "the message says what is unavailable: {status:?}"
    );
    (app.until_health_is("auth.v1.AuthService", ServingStatus::NotServing)).await;

    // The database comes back: no restart needed.
    proxy.restore();
    app.until_health_is("", ServingStatus::Serving).await;
    let handle = app.handle.clone();
    wait_until("nothing is left in flight", || handle.in_flight() == 0).await;
    app.login("sam", "a fine password").await.unwrap();
    let mut client = app.client.clone();
    login(&mut client, "SAM", "a fine password").await.unwrap();
}

#[tokio::test]
async fn a_replica_learns_the_hash_costs_other_replicas_store() {
    let Some(db) = TestDb::new(Backend::Postgres, "replica_hash_costs").await else {
        return;
    };
    let mut cheap = spawn_app_on(&db, |c| {
        c.passwords.pbkdf2_iterations = 1000;
        c.server.health_interval = Duration::from_millis(100);
    })
    .await;
    let mut dear = spawn_app_on(&db, |c| c.passwords.pbkdf2_iterations = 20_000).await;
    assert_eq!(rounds_of_a_failed_login(&mut cheap, "nobody").await, 1000);

    // Another replica stores a dearer hash: the next readiness probe reads it, and
    // from then on this replica's failures cost as much as that user's would.
    dear.register("dear", "a fine password").await.unwrap();
    let cheap = tokio::sync::Mutex::new(cheap);
    wait_for("the replica learns the dearer stored cost", || async {
        let rounds = rounds_of_a_failed_login(&mut *cheap.lock().await, "nobody").await;
        (rounds == 20_000).then_some(())
    })
    .await;
    let mut cheap = cheap.into_inner();
    assert_eq!(rounds_of_a_failed_login(&mut cheap, "dear").await, 20_000);
}
