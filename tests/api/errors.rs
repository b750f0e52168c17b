//! Every row of the error table a client can reach without load: the code, the
//! message, and the machine-readable details.

use crate::helpers::{TestDb, expect_code, spawn_app_on};
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

async fn malformed_usernames_are_invalid_arguments_naming_the_field(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
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

async fn malformed_passwords_are_invalid_arguments_that_never_echo_the_password(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
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

async fn an_empty_token_is_an_invalid_argument(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let status = expect_code(app.validate("").await, Code::InvalidArgument);
    assert_eq!(violated_fields(&status), ["access_token"]);
}

async fn taken_usernames_are_already_exists_whatever_the_case(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
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

async fn unknown_user_and_wrong_password_are_indistinguishable(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
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

async fn oversized_requests_are_refused_and_the_server_carries_on(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let huge = "u".repeat(8 * 1024);
    let status = app.register(&huge, "a fine password").await.unwrap_err();
    assert_eq!(status.code(), Code::OutOfRange, "{status:?}");
    app.register("dave", "a fine password").await.unwrap();
}

async fn unexpected_failures_are_internal_with_a_generic_message(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    app.register("erin", "a fine password").await.unwrap();
    // Corrupt the stored hash behind authd's back.
    db.execute("UPDATE users SET password_hash = 'not a PHC string' WHERE username = 'erin'")
        .await;
    assert_eq!(db.stored_hash("erin").await.unwrap(), "not a PHC string");
    let status = expect_code(app.login("erin", "a fine password").await, Code::Internal);
    assert_eq!(status.message(), "internal error");
}

crate::backend_tests!(
    malformed_usernames_are_invalid_arguments_naming_the_field,
    malformed_passwords_are_invalid_arguments_that_never_echo_the_password,
    an_empty_token_is_an_invalid_argument,
    taken_usernames_are_already_exists_whatever_the_case,
    unknown_user_and_wrong_password_are_indistinguishable,
    oversized_requests_are_refused_and_the_server_carries_on,
    unexpected_failures_are_internal_with_a_generic_message,
);
