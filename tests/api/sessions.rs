//! Sessions through the real server, on both backends: refresh-token rotation,
//! reuse detection, the retry rule, Logout, ChangePassword, concurrent refreshes,
//! revocation across replicas (PostgreSQL), and the schema upgrade.

use crate::helpers::{
    Backend, TEST_KEY, TEST_KID, TestApp, TestDb, expect_code, metric, spawn_app_on,
};
use authd::pb::{
    ChangePasswordRequest, LoginResponse, LogoutRequest, RefreshRequest, RefreshResponse,
    auth_service_client::AuthServiceClient,
};
use futures::future::join_all;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::{Code, Status, transport::Channel};

const PASSWORD: &str = "a fine password";
const NEW_PASSWORD: &str = "violet tractor at dawn";

crate::backend_tests!(
    login_starts_a_session_and_refresh_rotates_its_tokens,
    a_rotated_refresh_token_presented_again_ends_the_session,
    a_retry_within_the_grace_gets_the_same_answer_and_keeps_the_session,
    concurrent_refreshes_of_one_token_rotate_it_once,
    logout_by_refresh_token_ends_the_session_and_then_acts_no_more,
    logout_by_access_token_ends_the_session_and_then_acts_no_more,
    logout_of_all_sessions_ends_every_session_of_the_user_only,
    logout_with_a_rotated_refresh_token_ends_at_most_its_own_session,
    bad_tokens_are_unauthenticated_and_missing_ones_invalid,
    a_password_change_ends_every_session,
    a_password_change_checks_the_current_password_and_the_new_one,
    a_database_of_the_previous_schema_is_upgraded_in_place,
    refresh_tokens_of_the_earlier_form_keep_working,
    concurrent_refreshes_of_a_token_of_the_earlier_form_rotate_it_once,
);

async fn refresh(app: &mut TestApp, token: &str) -> Result<RefreshResponse, Status> {
    refresh_on(&mut app.client, token).await
}

async fn refresh_on(
    client: &mut AuthServiceClient<Channel>,
    token: &str,
) -> Result<RefreshResponse, Status> {
    client
        .refresh(RefreshRequest {
            refresh_token: token.into(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn logout(
    app: &mut TestApp,
    refresh_token: &str,
    access_token: &str,
    all_sessions: bool,
) -> Result<u32, Status> {
    app.client
        .logout(LogoutRequest {
            refresh_token: refresh_token.into(),
            access_token: access_token.into(),
            all_sessions,
        })
        .await
        .map(|r| r.into_inner().sessions_ended)
}

async fn change_password(
    app: &mut TestApp,
    username: &str,
    current: &str,
    new: &str,
) -> Result<u32, Status> {
    app.client
        .change_password(ChangePasswordRequest {
            username: username.into(),
            current_password: current.into(),
            new_password: new.into(),
        })
        .await
        .map(|r| r.into_inner().sessions_ended)
}

/// A registered user, logged in once.
async fn user_with_session(app: &mut TestApp, name: &str) -> LoginResponse {
    app.register(name, PASSWORD).await.unwrap();
    app.login(name, PASSWORD).await.unwrap()
}

fn seconds(t: &Option<prost_types::Timestamp>) -> i64 {
    t.as_ref().expect("a timestamp").seconds
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn sessions_ended(app: &TestApp, reason: &str) -> f64 {
    let text = app.handle.render_metrics();
    metric(
        &text,
        &format!(r#"authd_sessions_ended_total{{reason="{reason}"}}"#),
    )
    .unwrap_or(0.0)
}

#[track_caller]
fn assert_unauthenticated<T: std::fmt::Debug>(result: Result<T, Status>) {
    let status = expect_code(result, Code::Unauthenticated);
    assert_eq!(status.message(), "invalid token");
}

async fn login_starts_a_session_and_refresh_rotates_its_tokens(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let login = user_with_session(&mut app, "rosa").await;
    assert_eq!(
        login.refresh_token.len(),
        51,
        "the time of issue and 256 bits in base64url"
    );
    assert!(
        login
            .refresh_token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    );
    assert!(uuid::Uuid::parse_str(&login.session_id).is_ok());
    let thirty_days = 30 * 24 * 3600;
    let refresh_end = seconds(&login.refresh_expires_at);
    assert!((refresh_end - unix_now() - thirty_days).abs() < 60);
    // Access tokens live 15 minutes by default.
    let access_end = seconds(&login.expires_at);
    assert!((access_end - unix_now() - 15 * 60).abs() < 60);
    let validated = app.validate(&login.access_token).await.unwrap();
    assert_eq!(validated.session_id, login.session_id);

    let first = refresh(&mut app, &login.refresh_token).await.unwrap();
    assert_eq!(first.session_id, login.session_id);
    assert_eq!(first.user_id, login.user_id);
    assert_eq!(first.token_type, "Bearer");
    assert_ne!(first.refresh_token, login.refresh_token);
    assert_ne!(first.access_token, login.access_token);
    // Refresh never extends the session.
    assert_eq!(seconds(&first.refresh_expires_at), refresh_end);
    let validated = app.validate(&first.access_token).await.unwrap();
    assert_eq!(
        (validated.session_id.as_str(), validated.username.as_str()),
        (login.session_id.as_str(), "rosa")
    );
    // The session goes on: its older access token is still valid.
    app.validate(&login.access_token).await.unwrap();

    let second = refresh(&mut app, &first.refresh_token).await.unwrap();
    assert_ne!(second.refresh_token, first.refresh_token);
    assert_eq!(second.session_id, login.session_id);
    let text = app.handle.render_metrics();
    assert_eq!(metric(&text, "authd_sessions_started_total"), Some(1.0));
    assert_eq!(metric(&text, "authd_sessions_refreshed_total"), Some(2.0));
}

async fn a_rotated_refresh_token_presented_again_ends_the_session(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let login = user_with_session(&mut app, "theo").await;
    let first = refresh(&mut app, &login.refresh_token).await.unwrap();
    let second = refresh(&mut app, &first.refresh_token).await.unwrap();
    app.validate(&second.access_token).await.unwrap();

    // The login's refresh token was rotated twice: presenting it is reuse.
    assert_unauthenticated(refresh(&mut app, &login.refresh_token).await);
    // The whole session has ended: every access token of it, and its refresh token.
    assert_unauthenticated(app.validate(&second.access_token).await);
    assert_unauthenticated(app.validate(&login.access_token).await);
    assert_unauthenticated(refresh(&mut app, &second.refresh_token).await);
    assert_eq!(sessions_ended(&app, "reuse"), 1.0);
    let text = app.handle.render_metrics();
    assert!(
        metric(&text, r#"authd_tokens_validated_total{outcome="revoked"}"#).unwrap() >= 2.0,
        "{text}"
    );
    // Another session of the same user is untouched.
    let other = app.login("theo", PASSWORD).await.unwrap();
    app.validate(&other.access_token).await.unwrap();
}

async fn a_retry_within_the_grace_gets_the_same_answer_and_keeps_the_session(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let login = user_with_session(&mut app, "uma").await;
    let first = refresh(&mut app, &login.refresh_token).await.unwrap();
    // The answer was lost; the client sends the same request again.
    let retried = refresh(&mut app, &login.refresh_token).await.unwrap();
    assert_eq!(retried.refresh_token, first.refresh_token);
    assert_eq!(retried.session_id, login.session_id);
    app.validate(&retried.access_token).await.unwrap();
    app.validate(&first.access_token).await.unwrap();
    // The session goes on from the token both answers carried.
    let next = refresh(&mut app, &retried.refresh_token).await.unwrap();
    app.validate(&next.access_token).await.unwrap();
    assert_eq!(sessions_ended(&app, "reuse"), 0.0);
    let text = app.handle.render_metrics();
    assert_eq!(metric(&text, "authd_sessions_refreshed_total"), Some(2.0));
}

async fn concurrent_refreshes_of_one_token_rotate_it_once(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let login = user_with_session(&mut app, "vera").await;
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(AuthServiceClient::new(app.channel().await));
    }
    refreshed_at_once_rotate_once(&mut app, &clients, &login.refresh_token, 16).await;
}

/// Sends `n` refreshes of `token` at once over `clients`: every one is answered, one
/// rotation won and every answer carries its refresh token, and the session goes on
/// from that token with no reuse. Returns that token.
async fn refreshed_at_once_rotate_once(
    app: &mut TestApp,
    clients: &[AuthServiceClient<Channel>],
    token: &str,
    n: usize,
) -> String {
    let attempts = (0..n).map(|i| {
        let mut client = clients[i % clients.len()].clone();
        async move { refresh_on(&mut client, token).await }
    });
    let answers: Vec<_> = join_all(attempts)
        .await
        .into_iter()
        .map(|r| r.expect("every request with the token just rotated gets the answer"))
        .collect();
    let text = app.handle.render_metrics();
    assert_eq!(metric(&text, "authd_sessions_refreshed_total"), Some(1.0));
    let winner = answers[0].refresh_token.clone();
    assert!(answers.iter().all(|a| a.refresh_token == winner));
    let next = refresh(app, &winner).await.unwrap();
    app.validate(&next.access_token).await.unwrap();
    assert_eq!(sessions_ended(app, "reuse"), 0.0);
    winner
}

async fn logout_by_refresh_token_ends_the_session_and_then_acts_no_more(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let login = user_with_session(&mut app, "walt").await;
    let other = app.login("walt", PASSWORD).await.unwrap();
    assert_eq!(
        logout(&mut app, &login.refresh_token, "", false)
            .await
            .unwrap(),
        1
    );
    assert_unauthenticated(app.validate(&login.access_token).await);
    assert_unauthenticated(refresh(&mut app, &login.refresh_token).await);
    // Again, even for all sessions: the token of an ended session ends nothing.
    for all in [false, true] {
        assert_unauthenticated(logout(&mut app, &login.refresh_token, "", all).await);
    }
    // The user's other session is untouched.
    app.validate(&other.access_token).await.unwrap();
    assert_eq!(sessions_ended(&app, "logout"), 1.0);
}

async fn logout_by_access_token_ends_the_session_and_then_acts_no_more(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let login = user_with_session(&mut app, "xena").await;
    let rotated = refresh(&mut app, &login.refresh_token).await.unwrap();
    assert_eq!(
        logout(&mut app, "", &rotated.access_token, false)
            .await
            .unwrap(),
        1
    );
    assert_unauthenticated(app.validate(&rotated.access_token).await);
    assert_unauthenticated(app.validate(&login.access_token).await);
    assert_unauthenticated(refresh(&mut app, &rotated.refresh_token).await);
    let other = app.login("xena", PASSWORD).await.unwrap();
    for all in [false, true] {
        assert_unauthenticated(logout(&mut app, "", &rotated.access_token, all).await);
        // Both tokens of the ended session, together: refused alike.
        assert_unauthenticated(
            logout(&mut app, &rotated.refresh_token, &rotated.access_token, all).await,
        );
    }
    // None of that ended the owner's new session.
    app.validate(&other.access_token).await.unwrap();
    // Both live tokens of one session end it, once.
    assert_eq!(
        logout(&mut app, &other.refresh_token, &other.access_token, false)
            .await
            .unwrap(),
        1
    );
    assert_unauthenticated(app.validate(&other.access_token).await);
    assert_eq!(sessions_ended(&app, "logout"), 2.0);
}

async fn logout_of_all_sessions_ends_every_session_of_the_user_only(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let one = user_with_session(&mut app, "yuri").await;
    let two = app.login("yuri", PASSWORD).await.unwrap();
    let three = app.login("yuri", PASSWORD).await.unwrap();
    let stranger = user_with_session(&mut app, "zoe").await;
    assert_eq!(
        logout(&mut app, "", &one.access_token, true).await.unwrap(),
        3
    );
    for token in [&one.access_token, &two.access_token, &three.access_token] {
        assert_unauthenticated(app.validate(token).await);
    }
    assert_unauthenticated(refresh(&mut app, &two.refresh_token).await);
    app.validate(&stranger.access_token).await.unwrap();
    // The ended sessions' credentials act no more: not on the owner's next session.
    let four = app.login("yuri", PASSWORD).await.unwrap();
    assert_unauthenticated(logout(&mut app, &three.refresh_token, "", true).await);
    assert_unauthenticated(logout(&mut app, "", &two.access_token, true).await);
    app.validate(&four.access_token).await.unwrap();
    // By a live refresh token, for all of them.
    assert_eq!(
        logout(&mut app, &four.refresh_token, "", true)
            .await
            .unwrap(),
        1
    );
    assert_eq!(sessions_ended(&app, "logout"), 4.0);
}

async fn logout_with_a_rotated_refresh_token_ends_at_most_its_own_session(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let first = user_with_session(&mut app, "vera").await;
    let other = app.login("vera", PASSWORD).await.unwrap();
    let second = refresh(&mut app, &first.refresh_token).await.unwrap();
    // Rotated moments ago (within the retry grace): refused, and nothing ends.
    assert_unauthenticated(logout(&mut app, &first.refresh_token, "", true).await);
    app.validate(&second.access_token).await.unwrap();
    // Rotated out before that: the reuse rule ends its own session, and only it.
    let third = refresh(&mut app, &second.refresh_token).await.unwrap();
    assert_unauthenticated(logout(&mut app, &first.refresh_token, "", true).await);
    assert_unauthenticated(app.validate(&third.access_token).await);
    app.validate(&other.access_token).await.unwrap();
    assert_eq!(sessions_ended(&app, "reuse"), 1.0);
    assert_eq!(sessions_ended(&app, "logout"), 0.0);
}

async fn bad_tokens_are_unauthenticated_and_missing_ones_invalid(db: TestDb) {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let mut app = spawn_app_on(&db, |_| {}).await;
    let login = user_with_session(&mut app, "abel").await;
    let (forged_refresh, forged_earlier) = ("A".repeat(51), "A".repeat(43));
    for bad in [
        "garbage",
        &forged_refresh,
        &forged_earlier,
        &"x".repeat(2000),
    ] {
        assert_unauthenticated(refresh(&mut app, bad).await);
        assert_unauthenticated(logout(&mut app, bad, "", false).await);
        assert_unauthenticated(logout(&mut app, bad, "", true).await);
    }
    let claims = |exp: i64, key: &[u8]| {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(TEST_KID.into());
        let body = serde_json::json!({
            "sub": login.user_id, "name": "abel", "iat": unix_now() - 7200, "exp": exp,
            "iss": "authd", "sid": login.session_id, "jti": "x",
        });
        jsonwebtoken::encode(&header, &body, &EncodingKey::from_secret(key)).unwrap()
    };
    // Expired beyond the clock skew allowed (30 s by default).
    let expired = claims(unix_now() - 3600, TEST_KEY);
    let forged = claims(unix_now() + 600, b"another key, 32 bytes or longer!");
    for bad in ["not.a.token", expired.as_str(), forged.as_str()] {
        assert_unauthenticated(logout(&mut app, "", bad, false).await);
        assert_unauthenticated(logout(&mut app, "", bad, true).await);
    }
    // A valid access token with a bad refresh token: nothing ends.
    assert_unauthenticated(logout(&mut app, "garbage", &login.access_token, false).await);
    app.validate(&login.access_token).await.unwrap();
    // Missing tokens are the caller's mistake.
    expect_code(refresh(&mut app, "").await, Code::InvalidArgument);
    expect_code(logout(&mut app, "", "", true).await, Code::InvalidArgument);
    // The refusals ended nothing.
    assert!(refresh(&mut app, &login.refresh_token).await.is_ok());
}

async fn a_password_change_ends_every_session(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let one = user_with_session(&mut app, "bert").await;
    let two = app.login("bert", PASSWORD).await.unwrap();
    let stranger = user_with_session(&mut app, "cleo").await;
    assert_eq!(
        change_password(&mut app, "BERT", PASSWORD, NEW_PASSWORD)
            .await
            .unwrap(),
        2
    );
    for token in [&one.access_token, &two.access_token] {
        assert_unauthenticated(app.validate(token).await);
    }
    assert_unauthenticated(refresh(&mut app, &one.refresh_token).await);
    app.validate(&stranger.access_token).await.unwrap();
    assert_eq!(sessions_ended(&app, "password_change"), 2.0);
    // The new password is the one that works now.
    expect_code(app.login("bert", PASSWORD).await, Code::Unauthenticated);
    let fresh = app.login("bert", NEW_PASSWORD).await.unwrap();
    app.validate(&fresh.access_token).await.unwrap();
}

async fn a_password_change_checks_the_current_password_and_the_new_one(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let session = user_with_session(&mut app, "dora").await;
    let login_refusal = expect_code(
        app.login("dora", "not the password").await,
        Code::Unauthenticated,
    );
    let wrong = expect_code(
        change_password(&mut app, "dora", "not the password", NEW_PASSWORD).await,
        Code::Unauthenticated,
    );
    assert_eq!(wrong.message(), login_refusal.message());
    let unknown = expect_code(
        change_password(&mut app, "nobody", PASSWORD, NEW_PASSWORD).await,
        Code::Unauthenticated,
    );
    assert_eq!(unknown.message(), login_refusal.message());
    for (new, why) in [
        ("password123", "common"),
        ("short", "at least 8"),
        ("dora", "at least 8"),
    ] {
        let status = expect_code(
            change_password(&mut app, "dora", PASSWORD, new).await,
            Code::InvalidArgument,
        );
        let details = tonic_types::StatusExt::get_error_details(&status);
        let violations = &details
            .bad_request()
            .expect("a BadRequest")
            .field_violations;
        assert_eq!(violations.len(), 1, "{status:?}");
        assert_eq!(violations[0].field, "new_password");
        assert!(
            violations[0].description.contains(why),
            "{new:?}: {}",
            violations[0].description
        );
        assert!(!status.message().contains(new), "{status:?}");
    }
    // Nothing changed: the old password works and the session lives.
    app.validate(&session.access_token).await.unwrap();
    app.login("dora", PASSWORD).await.unwrap();
}

async fn a_database_of_the_previous_schema_is_upgraded_in_place(db: TestDb) {
    // A database with a user, taken back to the schema before sessions.
    let app = spawn_app_on(&db, |_| {}).await;
    let mut client = app.client.clone();
    crate::helpers::register(&mut client, "egon", PASSWORD)
        .await
        .unwrap();
    app.stop().await.unwrap();
    // Everything from the sessions' migration on is undone.
    db.execute("DROP TABLE login_challenges").await;
    db.execute("DROP TABLE recovery_codes").await;
    db.execute("DROP TABLE totp_factors").await;
    db.execute("DROP TABLE user_cutoffs").await;
    db.execute("DROP INDEX IF EXISTS users_username_bytes")
        .await;
    db.execute("ALTER TABLE users DROP COLUMN disabled_at")
        .await;
    db.execute("ALTER TABLE users DROP COLUMN disabled_reason")
        .await;
    db.execute("ALTER TABLE users DROP COLUMN password_version")
        .await;
    db.execute("DROP TABLE retired_refresh_tokens").await;
    db.execute("DROP TABLE sessions").await;
    db.execute("DELETE FROM _sqlx_migrations WHERE version >= 20261210000000")
        .await;

    // The next start migrates it; the user logs in and has a session.
    let mut app = spawn_app_on(&db, |_| {}).await;
    let login = app.login("egon", PASSWORD).await.unwrap();
    let rotated = refresh(&mut app, &login.refresh_token).await.unwrap();
    app.validate(&rotated.access_token).await.unwrap();
    assert_eq!(
        logout(&mut app, &rotated.refresh_token, "", false)
            .await
            .unwrap(),
        1
    );
}

/// A refresh token as authd issued them before tokens carried their time of issue
/// (32 bytes, 43 characters), and the key the store kept for it: its SHA-256 digest.
const EARLIER_TOKEN: &str = "LegacyRefreshTokenFromBeforeTheTimeOfIssue0";
const EARLIER_DIGEST: &str = "892ec07e04edbcb4d4af5bbfb1073e49611a98a178f09806daf7d6aee50d61c3";
/// Makes every session's refresh token `EARLIER_TOKEN`, as a session begun before
/// the upgrade has (the statement must be static text: it spells `EARLIER_DIGEST`,
/// which `refresh_tokens_of_the_earlier_form_keep_working` checks it against).
const TO_THE_EARLIER_FORM: &str = "UPDATE sessions SET refresh_digest = \
     '892ec07e04edbcb4d4af5bbfb1073e49611a98a178f09806daf7d6aee50d61c3'";

async fn refresh_tokens_of_the_earlier_form_keep_working(db: TestDb) {
    use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
    use sha2::{Digest as _, Sha256};
    let bytes = URL_SAFE_NO_PAD.decode(EARLIER_TOKEN).unwrap();
    assert_eq!(hex::encode(Sha256::digest(&bytes)), EARLIER_DIGEST);

    let mut app = spawn_app_on(&db, |_| {}).await;
    let login = user_with_session(&mut app, "greta").await;
    // The session's token becomes one of the earlier form, as a session begun
    // before the upgrade has.
    assert!(TO_THE_EARLIER_FORM.contains(EARLIER_DIGEST));
    db.execute(TO_THE_EARLIER_FORM).await;
    let other = app.login("greta", PASSWORD).await.unwrap();
    assert_unauthenticated(refresh(&mut app, &login.refresh_token).await);

    // It refreshes, and its rotations keep its form.
    let first = refresh(&mut app, EARLIER_TOKEN).await.unwrap();
    assert_eq!(first.session_id, login.session_id);
    assert_eq!(first.refresh_token.len(), 43);
    // A retry within the grace gets the same token again.
    let retried = refresh(&mut app, EARLIER_TOKEN).await.unwrap();
    assert_eq!(retried.refresh_token, first.refresh_token);
    let second = refresh(&mut app, &first.refresh_token).await.unwrap();
    assert_eq!(second.refresh_token.len(), 43);
    app.validate(&second.access_token).await.unwrap();

    // Rotated twice, presented again: reuse ends its session, and only it.
    assert_unauthenticated(refresh(&mut app, EARLIER_TOKEN).await);
    assert_unauthenticated(app.validate(&second.access_token).await);
    assert_eq!(sessions_ended(&app, "reuse"), 1.0);
    app.validate(&other.access_token).await.unwrap();
    let rotated = refresh(&mut app, &other.refresh_token).await.unwrap();
    assert_eq!(rotated.refresh_token.len(), 51);
    assert_eq!(
        logout(&mut app, &rotated.refresh_token, "", false)
            .await
            .unwrap(),
        1
    );
}

/// Fifty refreshes at once of a token of the earlier form, over twenty connections
/// from addresses of their own: one rotation, one next token for all of them (still
/// of the earlier form), no reuse.
async fn concurrent_refreshes_of_a_token_of_the_earlier_form_rotate_it_once(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    user_with_session(&mut app, "hanna").await;
    db.execute(TO_THE_EARLIER_FORM).await;
    let mut clients = Vec::new();
    for n in 0..20u8 {
        let source = std::net::Ipv4Addr::new(127, 0, 0, 10 + n);
        clients.push(crate::helpers::connect_from(app.addr, source).await);
    }
    let winner = refreshed_at_once_rotate_once(&mut app, &clients, EARLIER_TOKEN, 50).await;
    assert_eq!(winner.len(), 43);
}

/// PostgreSQL: a session ended on one replica is refused by another sharing the
/// database, within the revocation delay (polled here with a generous timeout).
#[tokio::test]
async fn a_logout_on_one_replica_is_honoured_by_another() {
    let Some(db) = TestDb::new(Backend::Postgres, "logout_across_replicas").await else {
        return;
    };
    let delay = Duration::from_millis(200);
    let mut a = spawn_app_on(&db, |c| c.tokens.revocation_delay = delay).await;
    let mut b = spawn_app_on(&db, |c| c.tokens.revocation_delay = delay).await;
    let login = user_with_session(&mut a, "fritz").await;
    let rotated = refresh(&mut b, &login.refresh_token).await.unwrap();
    b.validate(&rotated.access_token).await.unwrap();
    let keep = a.login("fritz", PASSWORD).await.unwrap();

    assert_eq!(
        logout(&mut a, "", &rotated.access_token, false)
            .await
            .unwrap(),
        1
    );
    assert_unauthenticated(a.validate(&rotated.access_token).await);
    // Replica b refuses the token of a session ended on a.
    b.until_refused(&rotated.access_token).await;
    // A password change on b reaches a the same way; the other session was live until then.
    a.validate(&keep.access_token).await.unwrap();
    assert_eq!(
        change_password(&mut b, "fritz", PASSWORD, NEW_PASSWORD)
            .await
            .unwrap(),
        1
    );
    a.until_refused(&keep.access_token).await;
}
