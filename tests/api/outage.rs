//! A database that is locked, black-holed or cut: every request answers UNAVAILABLE
//! within a bound (never hangs, never says the hash queue is full), readiness turns
//! NOT_SERVING on what requests see and recovers by probing, and liveness stays
//! SERVING throughout.

use crate::helpers::{
    Backend, TestApp, TestDb, expect_code, login, metric, register, spawn_app_behind_proxy,
    spawn_app_on, wait_for, wait_until,
};
use authd::config::DatabaseUrl;
use futures::future::join_all;
use sqlx::{Connection, PgConnection, SqliteConnection, sqlite::SqliteConnectOptions};
use std::time::Duration;
use tonic::Code;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

const PASSWORD: &str = "a fine password";
/// Long enough that no periodic probe runs during a test: only a request's failure
/// (or the recovery probing it starts) can change readiness.
const NO_POLLING: Duration = Duration::from_secs(3600);
/// Far beyond every timeout of the store's: a request not answered by then hangs.
/// What the tests check is the answer (UNAVAILABLE, from the store), not its time.
const HANG: Duration = Duration::from_secs(30);

/// Waits until readiness is `status`.
async fn until_ready_is(app: &mut TestApp, status: ServingStatus) {
    app.until_health_is("", status).await
}

/// A test connection to the database, behind authd's back.
async fn pg(db: &TestDb) -> PgConnection {
    let DatabaseUrl::Postgres(url) = &db.url else {
        unreachable!("a PostgreSQL test database")
    };
    PgConnection::connect(url.expose()).await.unwrap()
}

/// Holds an ACCESS EXCLUSIVE lock on the users table until the transaction ends.
async fn lock_users(db: &TestDb) -> PgConnection {
    let mut conn = pg(db).await;
    sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
    sqlx::query("LOCK TABLE users IN ACCESS EXCLUSIVE MODE")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

#[tokio::test]
async fn a_locked_users_table_gives_unavailable_in_bounded_time_and_not_serving() {
    let Some(db) = TestDb::new(Backend::Postgres, "locked_users_table").await else {
        return;
    };
    let mut app = spawn_app_on(&db, |c| {
        c.store.db_statement_timeout = Duration::from_millis(300);
        c.server.health_interval = NO_POLLING;
    })
    .await;
    app.register("sam", PASSWORD).await.unwrap();

    let mut locker = lock_users(&db).await;
    // What the old readiness probe asked still answers; real queries wait.
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut pg(&db).await)
        .await
        .unwrap();
    assert_eq!(one, 1);
    let logins = join_all((0..8).map(|_| {
        let mut client = app.client.clone();
        async move { login(&mut client, "sam", PASSWORD).await }
    }));
    // Each gives up at the statement timeout: UNAVAILABLE, from the store.
    let results = tokio::time::timeout(HANG, logins)
        .await
        .expect("every login answers while the table is locked");
    for result in results {
        let status = expect_code(result, Code::Unavailable);
        assert!(status.message().contains("database"), "{status:?}");
    }
    assert_eq!(app.health_status("").await, ServingStatus::NotServing);
    assert_eq!(
        app.health_status("auth.v1.AuthService").await,
        ServingStatus::NotServing
    );
    // The gauge the AuthdReplicaNotServing alert reads says the same.
    assert!(app.handle.render_metrics().contains("\nauthd_serving 0\n"));
    assert_eq!(app.health_status("liveness").await, ServingStatus::Serving);
    // Probing keeps finding the table locked.
    let failed = failed_probes(&app);
    wait_until("a probe finds the table locked", || {
        failed_probes(&app) > failed
    })
    .await;
    assert_eq!(app.health_status("").await, ServingStatus::NotServing);

    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    until_ready_is(&mut app, ServingStatus::Serving).await;
    assert!(app.handle.render_metrics().contains("\nauthd_serving 1\n"));
    app.login("sam", PASSWORD).await.unwrap();
}

/// Waits until authd's query is waiting for a lock in PostgreSQL.
async fn until_a_query_waits_for_a_lock(db: &TestDb) {
    let conn = tokio::sync::Mutex::new(pg(db).await);
    wait_for("a query of authd waits for the lock", || async {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = 'authd' AND wait_event_type = 'Lock'",
        )
        .fetch_one(&mut *conn.lock().await)
        .await
        .unwrap();
        (waiting > 0).then_some(())
    })
    .await
}

/// The store's readiness probes that found PostgreSQL unavailable so far.
fn failed_probes(app: &TestApp) -> f64 {
    let series =
        r#"authd_store_errors_total{backend="postgres",kind="unavailable",operation="probe"}"#;
    metric(&app.handle.render_metrics(), series).unwrap_or(0.0)
}

#[tokio::test]
async fn a_black_holed_database_gives_unavailable_not_a_hang() {
    let Some(db) = TestDb::new(Backend::Postgres, "black_holed_database").await else {
        return;
    };
    let (mut app, proxy) = spawn_app_behind_proxy(&db, |c| {
        c.store.db_statement_timeout = Duration::from_secs(1);
        c.store.db_acquire_timeout = Duration::from_secs(1);
        c.server.health_interval = NO_POLLING;
    })
    .await;
    app.register("sam", PASSWORD).await.unwrap();

    // A query already sent when the database goes silent: it waits for a lock, the
    // proxy stops forwarding, the lock goes and PostgreSQL's answer never arrives.
    let mut locker = lock_users(&db).await;
    let in_flight = tokio::spawn({
        let mut client = app.client.clone();
        async move { login(&mut client, "sam", PASSWORD).await }
    });
    until_a_query_waits_for_a_lock(&db).await;
    proxy.stall();
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    let result = tokio::time::timeout(HANG, in_flight)
        .await
        .expect("a query sent before the database went silent is given up on")
        .unwrap();
    expect_code(result, Code::Unavailable);

    // New requests while it stays silent: given up on too.
    for _ in 0..3 {
        let result = tokio::time::timeout(HANG, app.login("sam", PASSWORD))
            .await
            .expect("a login answers while the database is silent");
        expect_code(result, Code::Unavailable);
    }
    assert_eq!(app.health_status("").await, ServingStatus::NotServing);
    assert_eq!(app.health_status("liveness").await, ServingStatus::Serving);

    proxy.restore();
    until_ready_is(&mut app, ServingStatus::Serving).await;
    // Connections given up on were closed, not left to clog the pool.
    let logins = join_all((0..16).map(|_| {
        let mut client = app.client.clone();
        async move { login(&mut client, "sam", PASSWORD).await }
    }))
    .await;
    for result in logins {
        result.expect("the app serves again");
    }
}

#[tokio::test]
async fn an_outage_under_a_burst_is_unavailable_never_resource_exhausted() {
    let Some(db) = TestDb::new(Backend::Postgres, "outage_under_a_burst").await else {
        return;
    };
    let (mut app, proxy) = spawn_app_behind_proxy(&db, |c| {
        c.passwords.hash_threads = Some(1);
        c.store.db_acquire_timeout = Duration::from_secs(1);
        c.store.db_statement_timeout = Duration::from_millis(300);
    })
    .await;
    app.register("sam", PASSWORD).await.unwrap();

    proxy.stall();
    let burst = (0..40).map(|i| {
        let mut client = app.client.clone();
        async move {
            if i % 4 == 0 {
                register(&mut client, &format!("new-{i}"), PASSWORD)
                    .await
                    .map(|_| ())
            } else {
                login(&mut client, "sam", PASSWORD).await.map(|_| ())
            }
        }
    });
    let results = tokio::time::timeout(Duration::from_secs(20), join_all(burst))
        .await
        .expect("the burst is answered");
    let codes: Vec<Code> = results
        .iter()
        .map(|r| r.as_ref().err().map_or(Code::Ok, |s| s.code()))
        .collect();
    assert!(
        codes.iter().all(|c| *c == Code::Unavailable),
        "every request failed for the database, and said so: {codes:?}"
    );

    proxy.restore();
    until_ready_is(&mut app, ServingStatus::Serving).await;
    app.login("sam", PASSWORD).await.unwrap();
}

#[tokio::test]
async fn a_request_that_cannot_reach_the_database_turns_readiness_not_serving_at_once() {
    let Some(db) = TestDb::new(Backend::Postgres, "readiness_follows_requests").await else {
        return;
    };
    let (mut app, proxy) = spawn_app_behind_proxy(&db, |c| {
        c.store.db_acquire_timeout = Duration::from_secs(1);
        c.server.health_interval = NO_POLLING;
    })
    .await;
    app.register("sam", PASSWORD).await.unwrap();
    let mut watch = app
        .health
        .clone()
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut next = async || {
        let message = tokio::time::timeout(Duration::from_secs(10), watch.message())
            .await
            .expect("readiness changes")
            .unwrap()
            .expect("the watch goes on");
        ServingStatus::try_from(message.status).unwrap()
    };
    assert_eq!(next().await, ServingStatus::Serving);

    proxy.cut();
    expect_code(app.login("sam", PASSWORD).await, Code::Unavailable);
    // No probe ran (the interval is an hour): the failure itself turned it.
    assert_eq!(next().await, ServingStatus::NotServing);
    assert_eq!(app.health_status("").await, ServingStatus::NotServing);
    assert_eq!(app.health_status("liveness").await, ServingStatus::Serving);

    // Back by probing, without a request and without the hourly poll.
    proxy.restore();
    assert_eq!(next().await, ServingStatus::Serving);
    app.login("sam", PASSWORD).await.unwrap();
}

#[tokio::test]
async fn a_write_locked_sqlite_database_gives_unavailable_not_a_hang() {
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut app = spawn_app_on(&db, |c| {
        c.store.db_statement_timeout = Duration::from_millis(300);
        c.server.health_interval = NO_POLLING;
    })
    .await;
    app.register("first", PASSWORD).await.unwrap();
    let token = app.login("first", PASSWORD).await.unwrap().access_token;
    let DatabaseUrl::Sqlite(path) = &db.url else {
        unreachable!()
    };
    // Another process holding the write lock (SQLite's busy timeout is 5 s).
    let mut locker = SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(path))
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut locker)
        .await
        .unwrap();

    // Given up on at the statement timeout, as UNAVAILABLE.
    let result = tokio::time::timeout(HANG, app.register("second", PASSWORD))
        .await
        .expect("the registration answers");
    expect_code(result, Code::Unavailable);
    assert_eq!(app.health_status("").await, ServingStatus::NotServing);
    assert_eq!(app.health_status("liveness").await, ServingStatus::Serving);
    // Validation needs no database; a login now writes its session, so it waits
    // for the writer like a registration.
    app.validate(&token).await.unwrap();
    expect_code(app.login("first", PASSWORD).await, Code::Unavailable);

    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    until_ready_is(&mut app, ServingStatus::Serving).await;
    app.register("third", PASSWORD).await.unwrap();
}
