//! Argon2id as the policy of new hashes (`AUTHD_PASSWORD_HASH=argon2id`), through the
//! real server on both backends: where its hashes are stored (the ext column, a
//! marker beside it), logins, the rehash when the policy changes either way, the
//! dummy verification of unknown users, and the start refused with a memory budget
//! below one hash.

use crate::helpers::{
    FAST_ITERATIONS, TestApp, TestDb, expect_code, metric_of, spawn_app_on, test_config,
};
use authd::{
    app::Application,
    config::{Config, DatabaseUrl, HashAlgorithm},
};
use base64::Engine as _;
use sqlx::{Connection, PgConnection, SqliteConnection, sqlite::SqliteConnectOptions};
use tonic::Code;

const PASSWORD: &str = "correct horse battery";

crate::backend_tests!(
    argon2id_users_are_stored_in_the_ext_column_behind_a_marker_and_log_in,
    a_user_is_rehashed_to_the_policy_in_force_at_their_next_login,
);

fn argon2id(config: &mut Config) {
    config.passwords.password_hash = HashAlgorithm::Argon2id;
}

fn pbkdf2(config: &mut Config) {
    config.passwords.password_hash = HashAlgorithm::Pbkdf2Sha256;
}

/// The start of the marker beside authd's own Argon2id hash, at the tests' PBKDF2
/// cost: its fixed salt (not the one beside another system's hash), in B64.
fn marker_prefix() -> String {
    let salt = base64::engine::general_purpose::STANDARD_NO_PAD.encode(b"authd:hash-ext:2");
    format!("$pbkdf2-sha256$i={FAST_ITERATIONS},l=32${salt}$")
}

const ARGON2ID_DEFAULTS: &str = "$argon2id$v=19$m=19456,t=2,p=1$";

/// `username`'s two hash columns, read straight from the database.
async fn columns(db: &TestDb, username: &str) -> (String, Option<String>) {
    const QUERY: &str = "SELECT password_hash, password_hash_ext FROM users WHERE username = $1";
    match &db.url {
        DatabaseUrl::Sqlite(path) => {
            let options = SqliteConnectOptions::new().filename(path).read_only(true);
            let mut conn = SqliteConnection::connect_with(&options).await.unwrap();
            let row = sqlx::query_as(QUERY)
                .bind(username)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            conn.close().await.ok();
            row
        }
        DatabaseUrl::Postgres(url) => {
            let mut conn = PgConnection::connect(url.expose()).await.unwrap();
            let row = sqlx::query_as(QUERY)
                .bind(username)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            conn.close().await.ok();
            row
        }
    }
}

fn counter(app: &TestApp, name: &str) -> f64 {
    metric_of(&app.handle.render_metrics(), name)
}

async fn argon2id_users_are_stored_in_the_ext_column_behind_a_marker_and_log_in(db: TestDb) {
    let mut app = spawn_app_on(&db, argon2id).await;
    app.register("ada", PASSWORD).await.unwrap();
    let (hash, ext) = columns(&db, "ada").await;
    assert!(hash.starts_with(&marker_prefix()), "{hash}");
    let ext = ext.expect("an Argon2id hash in the ext column");
    assert!(ext.starts_with(ARGON2ID_DEFAULTS), "{ext}");
    assert_eq!(counter(&app, "authd_hash_argon2_total"), 1.0);

    app.login("ada", PASSWORD).await.unwrap();
    expect_code(
        app.login("ada", "wrong horse battery").await,
        Code::Unauthenticated,
    );
    // At the policy already: the login rewrote nothing.
    assert_eq!(columns(&db, "ada").await, (hash.clone(), Some(ext.clone())));

    // An unknown user is verified against an Argon2id dummy, with no PBKDF2 at all.
    let rounds = counter(&app, "authd_hash_rounds_total");
    let argon2 = counter(&app, "authd_hash_argon2_total");
    expect_code(app.login("nobody", PASSWORD).await, Code::Unauthenticated);
    assert_eq!(counter(&app, "authd_hash_argon2_total"), argon2 + 1.0);
    assert_eq!(counter(&app, "authd_hash_rounds_total"), rounds);
    assert_eq!(counter(&app, "authd_hash_memory_in_use_bytes"), 0.0);
    assert_eq!(app.handle.hash_memory_in_use_kib(), 0);
    assert_eq!(
        counter(&app, "authd_hash_memory_budget_bytes"),
        256.0 * 1024.0 * 1024.0
    );

    // A new password is written the same way: a new marker and a new ext hash.
    app.client
        .change_password(authd::pb::ChangePasswordRequest {
            username: "ada".into(),
            current_password: PASSWORD.into(),
            new_password: "violet tractor at dawn".into(),
        })
        .await
        .unwrap();
    let (new_hash, new_ext) = columns(&db, "ada").await;
    assert!(new_hash.starts_with(&marker_prefix()) && new_hash != hash);
    let new_ext = new_ext.unwrap();
    assert!(new_ext.starts_with(ARGON2ID_DEFAULTS) && new_ext != ext);
    app.login("ada", "violet tractor at dawn").await.unwrap();
    expect_code(app.login("ada", PASSWORD).await, Code::Unauthenticated);
    app.stop().await.unwrap();
}

async fn a_user_is_rehashed_to_the_policy_in_force_at_their_next_login(db: TestDb) {
    // Registered under PBKDF2.
    let mut app = spawn_app_on(&db, pbkdf2).await;
    app.register("bob", PASSWORD).await.unwrap();
    let (pbkdf2_hash, ext) = columns(&db, "bob").await;
    assert!(pbkdf2_hash.starts_with("$pbkdf2-sha256$i=1000,l=32$"));
    assert!(!pbkdf2_hash.starts_with(&marker_prefix()));
    assert_eq!(ext, None);
    app.stop().await.unwrap();

    // Restarted under argon2id: the first login rehashes to Argon2id.
    let mut app = spawn_app_on(&db, argon2id).await;
    expect_code(
        app.login("bob", "wrong horse battery").await,
        Code::Unauthenticated,
    );
    assert_eq!(columns(&db, "bob").await, (pbkdf2_hash.clone(), None));
    app.login("bob", PASSWORD).await.unwrap();
    let (marker, ext) = columns(&db, "bob").await;
    assert!(marker.starts_with(&marker_prefix()), "{marker}");
    let ext = ext.expect("rehashed to Argon2id");
    assert!(ext.starts_with(ARGON2ID_DEFAULTS), "{ext}");
    // Once: the next login finds the hash at the policy.
    app.login("bob", PASSWORD).await.unwrap();
    assert_eq!(columns(&db, "bob").await, (marker, Some(ext.clone())));
    expect_code(
        app.login("bob", "wrong horse battery").await,
        Code::Unauthenticated,
    );
    app.stop().await.unwrap();

    // And back to PBKDF2: the ext column is cleared.
    let mut app = spawn_app_on(&db, pbkdf2).await;
    app.login("bob", PASSWORD).await.unwrap();
    let (hash, ext) = columns(&db, "bob").await;
    assert!(hash.starts_with("$pbkdf2-sha256$i=1000,l=32$"), "{hash}");
    assert!(!hash.starts_with(&marker_prefix()), "{hash}");
    assert_ne!(hash, pbkdf2_hash, "a new salt");
    assert_eq!(ext, None);
    app.login("bob", PASSWORD).await.unwrap();
    expect_code(
        app.login("bob", "wrong horse battery").await,
        Code::Unauthenticated,
    );
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_memory_budget_below_one_argon2id_hash_stops_the_start() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite, "")
        .await
        .unwrap();
    let mut config = test_config(db.url.clone());
    argon2id(&mut config);
    config.passwords.argon2_memory = 64 * 1024;
    config.passwords.argon2_memory_budget = 32;
    let Err(err) = Application::build(config).await else {
        panic!("the start went on with a budget below one hash");
    };
    let err = format!("{err:#}");
    assert!(
        err.contains(
            "--argon2-memory-budget (AUTHD_ARGON2_MEMORY_BUDGET) of 32 MiB is below the memory \
             of one Argon2id hash (--argon2-memory 65536 KiB)"
        ),
        "{err}"
    );
}
