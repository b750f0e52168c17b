//! The second factor through the tonic client, on both backends: enrollment with a
//! code computed here by an RFC 6238 implementation of the tests' own (checked
//! against the RFC's vectors), Login's challenge and CompleteLogin, codes used once,
//! the skew allowed (time moved by the test's clock, never slept), recovery codes,
//! a challenge's limits, the throttle's scope of its own, `amr` in tokens (checked
//! by an independent JWT library), ValidateToken's second-factor requirement,
//! Refresh, turning the factor off, new recovery codes, a server without a data
//! key, the secret at rest and a data key rotation. The races are in `totp_races`.

use crate::helpers::{TEST_KEY, TestApp, TestDb, expect_code, spawn_app_on};
use authd::{
    ManualClock,
    config::{Config, DatabaseUrl},
    pb::{
        BeginTotpEnrollmentRequest, CompleteLoginRequest, CompleteLoginResponse,
        ConfirmTotpEnrollmentRequest, DisableTotpRequest, RefreshRequest,
        RegenerateRecoveryCodesRequest, ValidateTokenRequest, ValidateTokenResponse,
        auth_service_client::AuthServiceClient,
    },
};
use sqlx::Connection as _;
use std::{sync::Arc, time::Duration};
use tonic::{Code, Status, transport::Channel};

crate::backend_tests!(
    enrollment_login_and_tokens_that_say_how,
    a_code_works_once_one_step_of_skew_and_no_more,
    recovery_codes_work_once_and_can_be_replaced,
    turning_the_factor_off_needs_a_code,
    the_secret_is_sealed_at_rest_and_opens_after_a_key_rotation,
);

pub(crate) const PASSWORD: &str = "a fine password";
/// Two data keys (32 bytes each, base64).
pub(crate) const K1: &str = "k1:azEtZGF0YS1rZXktZm9yLXRlc3RzLTMyLWJ5dGVzISE=";
pub(crate) const K2: &str = "k2:azItZGF0YS1rZXktZm9yLXRlc3RzLTMyLWJ5dGVzISE=";

/// RFC 6238 with HMAC-SHA1, 6 digits, 30-second steps: the tests' own, not the
/// server's crate.
pub(crate) fn code_at(secret: &[u8], unix_seconds: u64) -> String {
    use hmac::{KeyInit, Mac};
    let mut mac = <hmac::Hmac<sha1::Sha1> as KeyInit>::new_from_slice(secret).unwrap();
    mac.update(&(unix_seconds / 30).to_be_bytes());
    let hash = mac.finalize().into_bytes();
    let at = usize::from(hash[hash.len() - 1] & 0x0f);
    let value = u32::from_be_bytes([hash[at] & 0x7f, hash[at + 1], hash[at + 2], hash[at + 3]]);
    format!("{:06}", value % 1_000_000)
}

/// RFC 4648 base32, without padding.
pub(crate) fn base32_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let (mut bits, mut value, mut out) = (0u32, 0u64, Vec::new());
    for c in text.trim_end_matches('=').bytes() {
        let digit = ALPHABET.iter().position(|a| *a == c).expect("base32") as u64;
        value = (value << 5) | digit;
        bits += 5;
        if bits >= 8 {
            bits -= 8;
            out.push((value >> bits) as u8);
        }
    }
    out
}

#[test]
fn the_tests_totp_follows_the_rfc_6238_vectors() {
    let secret = b"12345678901234567890";
    for (time, code) in [
        (59, "287082"),
        (1111111109, "081804"),
        (1111111111, "050471"),
        (1234567890, "005924"),
        (2000000000, "279037"),
        (20000000000, "353130"),
    ] {
        assert_eq!(code_at(secret, time), code, "{time}");
    }
    assert_eq!(base32_decode("GEZDGNBVGY3TQOJQ"), b"1234567890");
}

/// An app on `db` with the data keys `keys` (none for `""`) and the clock `clock`.
pub(crate) async fn app_on(
    db: &TestDb,
    keys: &str,
    clock: &Arc<ManualClock>,
    adjust: impl FnOnce(&mut Config),
) -> TestApp {
    let clock = clock.clone();
    let keys = keys.to_owned();
    spawn_app_on(db, move |c| {
        c.second_factor.data_keys = (!keys.is_empty()).then(|| keys.parse().unwrap());
        c.clock = Some(clock);
        adjust(c);
    })
    .await
}

/// The clock's time, in Unix seconds.
pub(crate) fn now(clock: &ManualClock) -> u64 {
    clock.unix_millis() / 1000
}

/// A user with the factor on.
pub(crate) struct Enrolled {
    pub user_id: String,
    pub secret: Vec<u8>,
    pub secret_base32: String,
    pub recovery: Vec<String>,
    /// An access token of a password-only session.
    pub token: String,
}

/// Registers `name`, enrolls it with a code of the clock's step, and moves the
/// clock to the next step (the code of the confirmation's step is used).
pub(crate) async fn enroll(app: &mut TestApp, clock: &ManualClock, name: &str) -> Enrolled {
    let user_id = app.register(name, PASSWORD).await.unwrap();
    let token = app.login(name, PASSWORD).await.unwrap().access_token;
    let begun = (app.client)
        .begin_totp_enrollment(BeginTotpEnrollmentRequest {
            access_token: token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let secret = base32_decode(&begun.secret);
    assert_eq!(secret.len(), 20);
    let recovery = (app.client)
        .confirm_totp_enrollment(ConfirmTotpEnrollmentRequest {
            access_token: token.clone(),
            code: code_at(&secret, now(clock)),
        })
        .await
        .unwrap()
        .into_inner()
        .recovery_codes;
    clock.advance(Duration::from_secs(30));
    Enrolled {
        user_id,
        secret,
        secret_base32: begun.secret,
        recovery,
        token,
    }
}

/// Logs `name` in and returns the challenge the answer carries (and no token).
pub(crate) async fn challenge(client: &mut AuthServiceClient<Channel>, name: &str) -> String {
    let answer = crate::helpers::login(client, name, PASSWORD).await.unwrap();
    assert!(answer.second_factor_required, "{answer:?}");
    assert!(answer.access_token.is_empty() && answer.refresh_token.is_empty());
    assert!(answer.session_id.is_empty() && answer.expires_at.is_none());
    assert!(answer.challenge_expires_at.is_some());
    answer.challenge
}

pub(crate) async fn complete(
    client: &mut AuthServiceClient<Channel>,
    challenge: &str,
    code: &str,
) -> Result<CompleteLoginResponse, Status> {
    client
        .complete_login(CompleteLoginRequest {
            challenge: challenge.into(),
            code: code.into(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn validate(
    app: &mut TestApp,
    token: &str,
    require_second_factor: bool,
) -> Result<ValidateTokenResponse, Status> {
    (app.client)
        .validate_token(ValidateTokenRequest {
            access_token: token.into(),
            require_second_factor,
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

/// The `amr` claim as an independent JWT library reads it.
fn amr_claim(token: &str) -> Vec<String> {
    #[derive(serde::Deserialize)]
    struct Claims {
        amr: Vec<String>,
    }
    let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::HS256);
    validation.set_issuer(&["authd"]);
    validation.set_required_spec_claims(&["exp", "iss", "sub"]);
    let key = jsonwebtoken::DecodingKey::from_secret(TEST_KEY);
    (jsonwebtoken::decode::<Claims>(token, &key, &validation).expect("a valid JWT"))
        .claims
        .amr
}

async fn enrollment_login_and_tokens_that_say_how(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let mut app = app_on(&db, K1, &clock, |_| {}).await;
    // Without a factor nothing changes: tokens at once, amr ["pwd"].
    app.register("plain", PASSWORD).await.unwrap();
    let plain = app.login("plain", PASSWORD).await.unwrap();
    assert!(!plain.second_factor_required && plain.challenge.is_empty());
    assert_eq!(amr_claim(&plain.access_token), ["pwd"]);
    let validated = validate(&mut app, &plain.access_token, false)
        .await
        .unwrap();
    assert_eq!(validated.amr, ["pwd"]);
    let refused = expect_code(
        validate(&mut app, &plain.access_token, true).await,
        Code::PermissionDenied,
    );
    assert_eq!(refused.message(), "a second factor is required");

    // Enrollment: the URI an app scans, then a code of the secret confirms it.
    let user_id = app.register("Olga", PASSWORD).await.unwrap();
    let token = app.login("olga", PASSWORD).await.unwrap().access_token;
    let begun = (app.client)
        .begin_totp_enrollment(BeginTotpEnrollmentRequest {
            access_token: token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        begun.otpauth_uri,
        format!(
            "otpauth://totp/authd:olga?secret={}&issuer=authd&algorithm=SHA1&digits=6&period=30",
            begun.secret
        )
    );
    // Pending: Login still answers tokens.
    assert!(
        !app.login("olga", PASSWORD)
            .await
            .unwrap()
            .second_factor_required
    );
    let secret = base32_decode(&begun.secret);
    let wrong = format!(
        "{:06}",
        (code_at(&secret, now(&clock)).parse::<u32>().unwrap() + 1) % 1_000_000
    );
    let confirm = |code: String| ConfirmTotpEnrollmentRequest {
        access_token: token.clone(),
        code,
    };
    expect_code(
        app.client.confirm_totp_enrollment(confirm(wrong)).await,
        Code::Unauthenticated,
    );
    let recovery = (app.client)
        .confirm_totp_enrollment(confirm(code_at(&secret, now(&clock))))
        .await
        .unwrap()
        .into_inner()
        .recovery_codes;
    assert_eq!(recovery.len(), 10);
    assert!(
        recovery
            .iter()
            .all(|c| c.len() == 19 && c.matches('-').count() == 3)
    );
    // On now: a second enrollment is refused until it is turned off.
    let again = BeginTotpEnrollmentRequest {
        access_token: token.clone(),
    };
    expect_code(
        app.client.begin_totp_enrollment(again).await,
        Code::FailedPrecondition,
    );

    // Login asks for the factor; CompleteLogin answers the tokens.
    clock.advance(Duration::from_secs(30));
    let challenge = challenge(&mut app.client, "OLGA").await;
    let session = complete(&mut app.client, &challenge, &code_at(&secret, now(&clock)))
        .await
        .unwrap();
    assert_eq!(session.user_id, user_id);
    assert_eq!(session.token_type, "Bearer");
    assert_eq!(amr_claim(&session.access_token), ["pwd", "otp"]);
    let validated = validate(&mut app, &session.access_token, true)
        .await
        .unwrap();
    assert_eq!(
        (validated.user_id.as_str(), validated.amr.as_slice()),
        (user_id.as_str(), &["pwd".to_owned(), "otp".to_owned()][..])
    );
    // The token of the password-only session from before is refused where a
    // second factor is required.
    expect_code(
        validate(&mut app, &token, true).await,
        Code::PermissionDenied,
    );
    // Refresh keeps the session's amr.
    let refreshed = (app.client)
        .refresh(RefreshRequest {
            refresh_token: session.refresh_token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(amr_claim(&refreshed.access_token), ["pwd", "otp"]);
    assert!(
        validate(&mut app, &refreshed.access_token, true)
            .await
            .is_ok()
    );
    // The challenge worked once.
    clock.advance(Duration::from_secs(30));
    let used = complete(&mut app.client, &challenge, &code_at(&secret, now(&clock))).await;
    expect_code(used, Code::Unauthenticated);
    // Bad input: clear statuses, nothing echoed.
    let bad = expect_code(
        complete(&mut app.client, &challenge, "12ab").await,
        Code::InvalidArgument,
    );
    assert!(!bad.message().contains("12ab"), "{bad:?}");
    expect_code(
        complete(&mut app.client, "", "123456").await,
        Code::InvalidArgument,
    );
    expect_code(
        complete(&mut app.client, "not-a-challenge", "123456").await,
        Code::Unauthenticated,
    );
    // A wrong password never reveals the factor.
    let wrong = crate::helpers::login(&mut app.client, "olga", "a wrong password").await;
    let wrong = expect_code(wrong, Code::Unauthenticated);
    assert_eq!(wrong.message(), "invalid username or password");
}

async fn a_code_works_once_one_step_of_skew_and_no_more(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let mut app = app_on(&db, K1, &clock, |_| {}).await;
    let user = enroll(&mut app, &clock, "stepan").await;
    let code = code_at(&user.secret, now(&clock));
    let first = challenge(&mut app.client, "stepan").await;
    complete(&mut app.client, &first, &code).await.unwrap();
    // The same code again, within its window: refused, and the challenge lives on.
    let second = challenge(&mut app.client, "stepan").await;
    let again = expect_code(
        complete(&mut app.client, &second, &code).await,
        Code::Unauthenticated,
    );
    assert_eq!(again.message(), "invalid code");
    // A code one step old is accepted, once its step was not used.
    clock.advance(Duration::from_secs(60));
    let old = code_at(&user.secret, now(&clock) - 30);
    complete(&mut app.client, &second, &old).await.unwrap();
    // Two steps old: refused.
    clock.advance(Duration::from_secs(60));
    let third = challenge(&mut app.client, "stepan").await;
    let too_old = code_at(&user.secret, now(&clock) - 60);
    expect_code(
        complete(&mut app.client, &third, &too_old).await,
        Code::Unauthenticated,
    );
    // One step ahead is accepted, and then the current one (behind it) is not.
    let ahead = code_at(&user.secret, now(&clock) + 30);
    complete(&mut app.client, &third, &ahead).await.unwrap();
    let fourth = challenge(&mut app.client, "stepan").await;
    let current = code_at(&user.secret, now(&clock));
    expect_code(
        complete(&mut app.client, &fourth, &current).await,
        Code::Unauthenticated,
    );
}

async fn recovery_codes_work_once_and_can_be_replaced(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let mut app = app_on(&db, K1, &clock, |_| {}).await;
    let user = enroll(&mut app, &clock, "rosa").await;
    let first = challenge(&mut app.client, "rosa").await;
    // Letter case and dashes do not matter.
    let typed = user.recovery[0].replace('-', "").to_uppercase();
    let session = complete(&mut app.client, &first, &typed).await.unwrap();
    assert_eq!(amr_claim(&session.access_token), ["pwd", "otp"]);
    let second = challenge(&mut app.client, "rosa").await;
    expect_code(
        complete(&mut app.client, &second, &user.recovery[0]).await,
        Code::Unauthenticated,
    );
    complete(&mut app.client, &second, &user.recovery[1])
        .await
        .unwrap();
    // New codes after a current code: the old ones stop working.
    let regenerate = |code: String| RegenerateRecoveryCodesRequest {
        access_token: user.token.clone(),
        code,
    };
    expect_code(
        app.client
            .regenerate_recovery_codes(regenerate(user.recovery[2].clone()))
            .await,
        Code::InvalidArgument,
    );
    let fresh = (app.client)
        .regenerate_recovery_codes(regenerate(code_at(&user.secret, now(&clock))))
        .await
        .unwrap()
        .into_inner()
        .recovery_codes;
    assert_eq!(fresh.len(), 10);
    let third = challenge(&mut app.client, "rosa").await;
    expect_code(
        complete(&mut app.client, &third, &user.recovery[2]).await,
        Code::Unauthenticated,
    );
    complete(&mut app.client, &third, &fresh[0]).await.unwrap();
    // A user's recovery code is no other user's.
    let other = enroll(&mut app, &clock, "oskar").await;
    let theirs = challenge(&mut app.client, "oskar").await;
    expect_code(
        complete(&mut app.client, &theirs, &fresh[1]).await,
        Code::Unauthenticated,
    );
    complete(&mut app.client, &theirs, &other.recovery[0])
        .await
        .unwrap();
}

async fn turning_the_factor_off_needs_a_code(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let mut app = app_on(&db, K1, &clock, |_| {}).await;
    let user = enroll(&mut app, &clock, "dora").await;
    let disable = |code: &str| DisableTotpRequest {
        access_token: user.token.clone(),
        code: code.into(),
    };
    expect_code(
        app.client.disable_totp(disable("000000")).await,
        Code::Unauthenticated,
    );
    expect_code(
        app.client
            .disable_totp(DisableTotpRequest {
                access_token: "x.y.z".into(),
                code: "000000".into(),
            })
            .await,
        Code::Unauthenticated,
    );
    app.client
        .disable_totp(disable(&code_at(&user.secret, now(&clock))))
        .await
        .unwrap();
    // Off: the password alone signs in again, and its tokens say so.
    let session = app.login("dora", PASSWORD).await.unwrap();
    assert!(!session.second_factor_required);
    assert_eq!(amr_claim(&session.access_token), ["pwd"]);
    clock.advance(Duration::from_secs(30));
    let code = code_at(&user.secret, now(&clock));
    expect_code(
        app.client.disable_totp(disable(&code)).await,
        Code::FailedPrecondition,
    );
    // Enrolled again, it is turned off with a recovery code too.
    let token = session.access_token;
    let begun = (app.client)
        .begin_totp_enrollment(BeginTotpEnrollmentRequest {
            access_token: token.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let secret = base32_decode(&begun.secret);
    let recovery = (app.client)
        .confirm_totp_enrollment(ConfirmTotpEnrollmentRequest {
            access_token: token.clone(),
            code: code_at(&secret, now(&clock)),
        })
        .await
        .unwrap()
        .into_inner()
        .recovery_codes;
    // The first enrollment's recovery codes are gone with it.
    let old = DisableTotpRequest {
        access_token: token.clone(),
        code: user.recovery[0].clone(),
    };
    expect_code(app.client.disable_totp(old).await, Code::Unauthenticated);
    let by_recovery = DisableTotpRequest {
        access_token: token,
        code: recovery[0].clone(),
    };
    app.client.disable_totp(by_recovery).await.unwrap();
    assert!(
        !app.login("dora", PASSWORD)
            .await
            .unwrap()
            .second_factor_required
    );
}

/// The sealed secret of `user_id`, read straight from the database.
pub(crate) async fn stored_secret(db: &TestDb, user_id: &str) -> String {
    const QUERY: &str = "SELECT secret FROM totp_factors WHERE user_id = $1";
    match &db.url {
        DatabaseUrl::Sqlite(path) => {
            let options = sqlx::sqlite::SqliteConnectOptions::new()
                .filename(path)
                .read_only(true);
            let mut conn = sqlx::SqliteConnection::connect_with(&options)
                .await
                .unwrap();
            let secret: String = sqlx::query_scalar(QUERY)
                .bind(user_id)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            conn.close().await.ok();
            secret
        }
        DatabaseUrl::Postgres(url) => {
            let mut conn = sqlx::PgConnection::connect(url.expose()).await.unwrap();
            let secret: String = sqlx::query_scalar(QUERY)
                .bind(user_id)
                .fetch_one(&mut conn)
                .await
                .unwrap();
            conn.close().await.ok();
            secret
        }
    }
}

async fn the_secret_is_sealed_at_rest_and_opens_after_a_key_rotation(db: TestDb) {
    let clock = Arc::new(ManualClock::new());
    let mut app = app_on(&db, K1, &clock, |_| {}).await;
    let user = enroll(&mut app, &clock, "sven").await;
    let stored = stored_secret(&db, &user.user_id).await;
    assert!(stored.starts_with("k1:"), "sealed under the first key");
    use base64::Engine as _;
    let raw = &user.secret;
    for shown in [
        user.secret_base32.clone(),
        user.secret_base32.to_lowercase(),
        base64::engine::general_purpose::STANDARD.encode(raw),
        hex::encode(raw),
    ] {
        assert!(
            !stored.contains(&shown[..16]),
            "the secret is not stored in the clear"
        );
    }
    let sealed = base64::engine::general_purpose::STANDARD
        .decode(&stored[3..])
        .unwrap();
    assert!(!sealed.windows(raw.len()).any(|w| w == raw.as_slice()));
    app.stop().await.unwrap();

    // A new key first, the old one kept: the secret still opens; new ones use k2.
    let mut app = app_on(&db, &format!("{K2},{K1}"), &clock, |_| {}).await;
    let first = challenge(&mut app.client, "sven").await;
    complete(&mut app.client, &first, &code_at(&user.secret, now(&clock)))
        .await
        .unwrap();
    let other = enroll(&mut app, &clock, "vera").await;
    assert!(stored_secret(&db, &other.user_id).await.starts_with("k2:"));
    app.stop().await.unwrap();

    // Without the key that sealed it, a secret does not open: refused, never a token.
    let mut app = app_on(&db, K2, &clock, |_| {}).await;
    clock.advance(Duration::from_secs(30));
    let second = challenge(&mut app.client, "sven").await;
    let status = complete(
        &mut app.client,
        &second,
        &code_at(&user.secret, now(&clock)),
    )
    .await;
    expect_code(status, Code::Internal);
}

#[tokio::test]
async fn without_a_data_key_no_secret_is_stored_and_the_factor_is_still_required() {
    let db = TestDb::new(crate::helpers::Backend::Sqlite, "")
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::new());
    let mut app = app_on(&db, "", &clock, |_| {}).await;
    app.register("nora", PASSWORD).await.unwrap();
    let token = app.login("nora", PASSWORD).await.unwrap().access_token;
    let refused = expect_code(
        (app.client)
            .begin_totp_enrollment(BeginTotpEnrollmentRequest {
                access_token: token,
            })
            .await,
        Code::FailedPrecondition,
    );
    assert_eq!(
        refused.message(),
        "second factor is not configured on this server"
    );
    app.stop().await.unwrap();

    // Enrolled while a key was configured, then served without one: the password
    // alone gets no token; a code cannot be checked; a recovery code works.
    let mut app = app_on(&db, K1, &clock, |_| {}).await;
    let user = enroll(&mut app, &clock, "nils").await;
    app.stop().await.unwrap();
    let mut app = app_on(&db, "", &clock, |_| {}).await;
    let challenge = challenge(&mut app.client, "nils").await;
    let code = code_at(&user.secret, now(&clock));
    let refused = expect_code(
        complete(&mut app.client, &challenge, &code).await,
        Code::FailedPrecondition,
    );
    assert_eq!(
        refused.message(),
        "second factor is not configured on this server"
    );
    let session = complete(&mut app.client, &challenge, &user.recovery[0])
        .await
        .unwrap();
    assert_eq!(amr_claim(&session.access_token), ["pwd", "otp"]);
}

#[tokio::test]
async fn a_challenge_dies_after_its_attempts_and_at_its_end() {
    let clock = Arc::new(ManualClock::new());
    let db = TestDb::new(crate::helpers::Backend::Sqlite, "")
        .await
        .unwrap();
    let mut app = app_on(&db, K1, &clock, |c| {
        // Only the challenge's own limit here (the throttle has its test).
        c.limits.login_failures = 0;
        c.second_factor.login_challenge_ttl = Duration::from_secs(120);
    })
    .await;
    let user = enroll(&mut app, &clock, "carl").await;
    let right = || code_at(&user.secret, now(&clock));
    let wrong = |right: String| format!("{:06}", (right.parse::<u32>().unwrap() + 7) % 1_000_000);
    let tired = challenge(&mut app.client, "carl").await;
    for _ in 0..5 {
        expect_code(
            complete(&mut app.client, &tired, &wrong(right())).await,
            Code::Unauthenticated,
        );
    }
    let gone = expect_code(
        complete(&mut app.client, &tired, &right()).await,
        Code::Unauthenticated,
    );
    assert_eq!(gone.message(), "invalid or expired challenge");
    // At its end (the clock moved, no sleep): refused; just before it: fine.
    let late = challenge(&mut app.client, "carl").await;
    clock.advance(Duration::from_secs(120));
    let expired = expect_code(
        complete(&mut app.client, &late, &right()).await,
        Code::Unauthenticated,
    );
    assert_eq!(expired.message(), "invalid or expired challenge");
    let in_time = challenge(&mut app.client, "carl").await;
    clock.advance(Duration::from_secs(119));
    complete(&mut app.client, &in_time, &right()).await.unwrap();
}

#[tokio::test]
async fn wrong_codes_are_throttled_under_their_own_scope_even_at_once() {
    let clock = Arc::new(ManualClock::new());
    let db = TestDb::new(crate::helpers::Backend::Sqlite, "")
        .await
        .unwrap();
    let mut app = app_on(&db, K1, &clock, |_| {}).await;
    let user = enroll(&mut app, &clock, "tilda").await;
    let right = code_at(&user.secret, now(&clock));
    let wrong = format!("{:06}", (right.parse::<u32>().unwrap() + 3) % 1_000_000);
    // Twenty wrong codes at once, each on a challenge of its own: five are checked
    // (the throttle's failures, the default), the rest refused before.
    let mut challenges = Vec::new();
    for _ in 0..21 {
        challenges.push(challenge(&mut app.client, "tilda").await);
    }
    let attempts = challenges[..20].iter().map(|c| {
        let (mut client, wrong) = (app.client.clone(), wrong.clone());
        async move { complete(&mut client, c, &wrong).await.map(drop) }
    });
    let answers = futures::future::join_all(attempts).await;
    let count = |code: Code| {
        answers
            .iter()
            .filter(|a| matches!(a, Err(s) if s.code() == code))
            .count()
    };
    assert_eq!(count(Code::Unauthenticated), 5, "{answers:?}");
    assert_eq!(count(Code::ResourceExhausted), 15, "{answers:?}");
    // Refused before it is checked, even the right code: the scope is the codes'.
    let status = expect_code(
        complete(&mut app.client, &challenges[20], &right).await,
        Code::ResourceExhausted,
    );
    use tonic_types::StatusExt as _;
    let details = status.get_error_details();
    let quota = details.quota_failure().expect("a QuotaFailure");
    assert_eq!(quota.violations[0].subject, "second-factor-throttle:client");
    assert!(details.retry_info().is_some());
    // The password's own count is untouched: Login still answers a challenge.
    challenge(&mut app.client, "tilda").await;
    let text = app.handle.render_metrics();
    let metric = |series: &str| crate::helpers::metric(&text, series).unwrap_or(0.0);
    assert_eq!(
        metric(r#"authd_second_factor_codes_total{outcome="wrong"}"#),
        5.0
    );
    assert_eq!(
        metric(r#"authd_second_factor_codes_total{outcome="throttled"}"#),
        16.0
    );
    // A second client is not held by this one's count.
    let mut other = crate::helpers::connect_from(app.addr, "127.0.0.7".parse().unwrap()).await;
    let fresh = challenge(&mut other, "tilda").await;
    complete(&mut other, &fresh, &right).await.unwrap();
}

#[tokio::test]
async fn an_administrator_removes_a_lost_factor() {
    use authd::pb::admin::{RemoveSecondFactorsRequest, UserSelector, user_selector::Selector};
    let db = TestDb::new(crate::helpers::Backend::Sqlite, "")
        .await
        .unwrap();
    let clock = Arc::new(ManualClock::new());
    let keys = K1.parse().unwrap();
    let admin_clock = clock.clone();
    let mut admin = crate::admin::admin_app(&db, move |c| {
        c.second_factor.data_keys = Some(keys);
        c.clock = Some(admin_clock);
    })
    .await;
    let user = enroll(&mut admin.app, &clock, "lotte").await;
    let remove = || {
        let mut request = tonic::Request::new(RemoveSecondFactorsRequest {
            user: Some(UserSelector {
                selector: Some(Selector::Username("lotte".into())),
            }),
        });
        let key = format!("Bearer {}", crate::admin::ADMIN_KEY);
        request
            .metadata_mut()
            .insert("authorization", key.parse().unwrap());
        request
    };
    let removed = admin
        .client
        .remove_second_factors(remove())
        .await
        .unwrap()
        .into_inner();
    assert!(removed.changed);
    assert_eq!(removed.user.unwrap().id, user.user_id);
    // The password alone signs in again; nothing is left to remove.
    assert!(
        !admin
            .app
            .login("lotte", PASSWORD)
            .await
            .unwrap()
            .second_factor_required
    );
    let again = admin
        .client
        .remove_second_factors(remove())
        .await
        .unwrap()
        .into_inner();
    assert!(!again.changed);
}
