//! Every row of the error table a client can reach without load: the code, the
//! message, and the machine-readable details.

use crate::helpers::{expect_code, spawn_app, stored_hash};
use tonic::Code;
use tonic_types::StatusExt;

fn violated_fields(status: &tonic::Status) -> Vec<String> {
    let details = status.check_error_details().expect("error details decode");
    let bad_request = details
        .bad_request()
        .expect("a google.rpc.BadRequest detail");
    bad_request
        .field_violations
        .iter()
        .map(|v| v.field.clone())
        .collect()
}

#[tokio::test]
async fn malformed_usernames_are_invalid_arguments_naming_the_field() {
    let mut app = spawn_app().await;
    for bad in ["", "ab", "has space", "emoji😀", &"x".repeat(65)] {
        let status = expect_code(
            app.register(bad, "a fine password").await,
            Code::InvalidArgument,
        );
        assert_eq!(violated_fields(&status), ["username"], "{bad:?}");
        let status = expect_code(
            app.login(bad, "a fine password").await,
            Code::InvalidArgument,
        );
        assert_eq!(violated_fields(&status), ["username"], "{bad:?}");
    }
}

#[tokio::test]
async fn malformed_passwords_are_invalid_arguments_that_never_echo_the_password() {
    let mut app = spawn_app().await;
    let too_long = "p".repeat(1025);
    for bad in ["", "seven77", too_long.as_str()] {
        let status = expect_code(app.register("alice", bad).await, Code::InvalidArgument);
        assert_eq!(violated_fields(&status), ["password"]);
        if !bad.is_empty() {
            assert!(!status.message().contains(bad), "{}", status.message());
        }
    }
    // Both fields wrong: both reported at once.
    let status = expect_code(app.register("x", "short").await, Code::InvalidArgument);
    assert_eq!(violated_fields(&status), ["username", "password"]);
}

#[tokio::test]
async fn an_empty_token_is_an_invalid_argument() {
    let mut app = spawn_app().await;
    let status = expect_code(app.validate("").await, Code::InvalidArgument);
    assert_eq!(violated_fields(&status), ["access_token"]);
}

#[tokio::test]
async fn taken_usernames_are_already_exists_whatever_the_case() {
    let mut app = spawn_app().await;
    app.register("Bob", "a fine password").await.unwrap();
    expect_code(
        app.register("bob", "another password").await,
        Code::AlreadyExists,
    );
    expect_code(
        app.register("BOB", "another password").await,
        Code::AlreadyExists,
    );
    // The original password still logs in, with any letter case of the name.
    let session = app.login("bOb", "a fine password").await.unwrap();
    assert_eq!(
        app.validate(&session.access_token).await.unwrap().username,
        "bob"
    );
}

#[tokio::test]
async fn unknown_user_and_wrong_password_are_indistinguishable() {
    let mut app = spawn_app().await;
    app.register("carol", "a fine password").await.unwrap();
    let unknown = expect_code(
        app.login("nobody", "a fine password").await,
        Code::Unauthenticated,
    );
    let wrong = expect_code(
        app.login("carol", "not her password").await,
        Code::Unauthenticated,
    );
    assert_eq!(unknown.message(), wrong.message());
    assert_eq!(unknown.details(), wrong.details());
    // The unknown user cost a (dummy) hash verification too: two logins, two hashes.
    let before = app.handle.hash_stats().completed;
    let _ = app.login("nobody2", "a fine password").await;
    assert_eq!(app.handle.hash_stats().completed, before + 1);
}

#[tokio::test]
async fn oversized_requests_are_refused_and_the_server_carries_on() {
    let mut app = spawn_app().await;
    let huge = "u".repeat(8 * 1024);
    let status = app.register(&huge, "a fine password").await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    app.register("dave", "a fine password").await.unwrap();
}

#[tokio::test]
async fn unexpected_failures_are_internal_with_a_generic_message() {
    let mut app = spawn_app().await;
    app.register("erin", "a fine password").await.unwrap();
    // Corrupt the stored hash behind authd's back.
    {
        use sqlx::{Connection, SqliteConnection, sqlite::SqliteConnectOptions};
        let mut conn =
            SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(&app.db_path))
                .await
                .unwrap();
        sqlx::query("UPDATE users SET password_hash = 'not a PHC string' WHERE username = 'erin'")
            .execute(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
    }
    assert_eq!(
        stored_hash(&app.db_path, "erin").await.unwrap(),
        "not a PHC string"
    );
    let status = expect_code(app.login("erin", "a fine password").await, Code::Internal);
    assert_eq!(status.message(), "internal error");
}
