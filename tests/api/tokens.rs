//! Tokens are standard JWTs: an independent library (jsonwebtoken) verifies what
//! authd issues, and authd refuses everything that is not a valid token of its own,
//! with one message whatever the reason (the reason goes to the metrics and the log).

use crate::helpers::{
    TEST_KEY, TEST_KID, TestDb, expect_code, key_spec, spawn_app_on, spawn_app_with,
};
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};
use tonic::Code;

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    name: String,
    iat: u64,
    exp: u64,
    iss: String,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn validation() -> Validation {
    let mut v = Validation::new(Algorithm::HS256);
    v.set_issuer(&["authd"]);
    v.set_required_spec_claims(&["exp", "iss", "sub"]);
    v.leeway = 0;
    v
}

fn sign(claims: &Claims, kid: Option<&str>, key: &[u8]) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(key)).unwrap()
}

async fn issued_tokens_verify_with_an_independent_jwt_library(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let user_id = app.register("Frank", "a fine password").await.unwrap();
    let session = app.login("frank", "a fine password").await.unwrap();
    assert_eq!(session.token_type, "Bearer");
    assert_eq!(session.user_id, user_id);

    let decoded = jsonwebtoken::decode::<Claims>(
        &session.access_token,
        &DecodingKey::from_secret(TEST_KEY),
        &validation(),
    )
    .expect("jsonwebtoken accepts authd's token");
    assert_eq!(decoded.header.alg, Algorithm::HS256);
    assert_eq!(decoded.header.kid.as_deref(), Some(TEST_KID));
    assert_eq!(decoded.header.typ.as_deref(), Some("JWT"));
    assert_eq!(decoded.claims.sub, user_id);
    assert_eq!(decoded.claims.name, "frank");
    assert_eq!(decoded.claims.iss, "authd");
    assert_eq!(
        decoded.claims.exp - decoded.claims.iat,
        15 * 60,
        "the default lifetime is 15m"
    );
    let expires_at = session.expires_at.expect("expires_at is set");
    assert_eq!(expires_at.seconds as u64, decoded.claims.exp);

    let validated = app.validate(&session.access_token).await.unwrap();
    assert_eq!(validated.user_id, user_id);
    assert_eq!(validated.username, "frank");
    assert_eq!(validated.expires_at, Some(expires_at));
}

async fn tokens_from_an_independent_library_with_the_shared_key_validate(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    let claims = Claims {
        sub: "some-user-id".into(),
        name: "grace".into(),
        iat: now(),
        exp: now() + 600,
        iss: "authd".into(),
    };
    let token = sign(&claims, Some(TEST_KID), TEST_KEY);
    let validated = app.validate(&token).await.unwrap();
    assert_eq!(validated.user_id, "some-user-id");
    assert_eq!(validated.username, "grace");
}

async fn forged_expired_and_foreign_tokens_are_unauthenticated(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    app.register("heidi", "a fine password").await.unwrap();
    let token = app
        .login("heidi", "a fine password")
        .await
        .unwrap()
        .access_token;
    let parts: Vec<&str> = token.split('.').collect();

    // Tampered payload: another subject, the original signature.
    let mut claims: serde_json::Value =
        serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
    claims["sub"] = "someone-else".into();
    let forged_payload = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(serde_json::to_vec(&claims).unwrap()),
        parts[2]
    );
    // Tampered signature: one bit flipped.
    let mut signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
    signature[0] ^= 1;
    let forged_signature = format!(
        "{}.{}.{}",
        parts[0],
        parts[1],
        URL_SAFE_NO_PAD.encode(signature)
    );
    // alg "none", no signature.
    let none_header = URL_SAFE_NO_PAD.encode(br#"{"alg":"none","typ":"JWT","kid":"test"}"#);
    let alg_none = format!("{none_header}.{}.", parts[1]);
    // HS512 with the right key: only HS256 is accepted.
    let mut hs512 = Header::new(Algorithm::HS512);
    hs512.kid = Some(TEST_KID.into());
    let valid_claims = Claims {
        sub: "x".into(),
        name: "heidi".into(),
        iat: now(),
        exp: now() + 600,
        iss: "authd".into(),
    };
    let wrong_alg =
        jsonwebtoken::encode(&hs512, &valid_claims, &EncodingKey::from_secret(TEST_KEY)).unwrap();
    // The right key under a kid authd does not know; a known kid with another key.
    let unknown_kid = sign(&valid_claims, Some("retired"), TEST_KEY);
    let no_kid = sign(&valid_claims, None, TEST_KEY);
    let wrong_key = sign(
        &valid_claims,
        Some(TEST_KID),
        b"another key, 32 bytes long......",
    );
    // Expired, otherwise perfect.
    let expired = sign(
        &Claims {
            iat: now() - 7200,
            exp: now() - 3600,
            ..valid_claims
        },
        Some(TEST_KID),
        TEST_KEY,
    );

    // Someone else's issuer, signed with the right key.
    let foreign = sign(
        &Claims {
            iss: "someone-else".into(),
            ..valid_claims_again()
        },
        Some(TEST_KID),
        TEST_KEY,
    );

    let mut refusals = Vec::new();
    for (what, bad) in [
        ("tampered payload", forged_payload.as_str()),
        ("tampered signature", &forged_signature),
        ("alg none", &alg_none),
        ("alg HS512", &wrong_alg),
        ("unknown kid", &unknown_kid),
        ("no kid", &no_kid),
        ("wrong key", &wrong_key),
        ("expired", &expired),
        ("foreign issuer", &foreign),
        ("garbage", "not.a.token"),
        ("two parts", "abc.def"),
    ] {
        let status = expect_code(app.validate(bad).await, Code::Unauthenticated);
        refusals.push((what, status));
    }
    // One answer for every forgery: nothing tells a prober which guess was closer.
    for (what, status) in &refusals {
        assert_eq!(status.message(), "invalid token", "{what}: {status:?}");
        assert!(status.details().is_empty(), "{what}: {status:?}");
        assert!(status.metadata().get("grpc-status-details-bin").is_none());
    }
    // The reasons are counted, each under its own label.
    let metrics = app.handle.render_metrics();
    for (outcome, n) in [
        ("bad_signature", 3),
        ("unsupported_algorithm", 2),
        ("unknown_key", 2),
        ("expired", 1),
        ("wrong_issuer", 1),
        ("malformed", 2),
    ] {
        let line = format!(r#"authd_tokens_validated_total{{outcome="{outcome}"}} {n}"#);
        assert!(metrics.contains(&line), "{line} missing in:\n{metrics}");
    }
    // The genuine token still passes.
    app.validate(&token).await.unwrap();
}

fn valid_claims_again() -> Claims {
    Claims {
        sub: "x".into(),
        name: "heidi".into(),
        iat: now(),
        exp: now() + 600,
        iss: "authd".into(),
    }
}

async fn validly_signed_tokens_from_beyond_year_9999_are_refused_without_a_panic(db: TestDb) {
    let mut app = spawn_app_on(&db, |_| {}).await;
    app.register("judy", "a fine password").await.unwrap();
    let genuine = app
        .login("judy", "a fine password")
        .await
        .unwrap()
        .access_token;
    let far = |iat: u64, exp: u64| {
        sign(
            &Claims {
                sub: "x".into(),
                name: "judy".into(),
                iat,
                exp,
                iss: "authd".into(),
            },
            Some(TEST_KID),
            TEST_KEY,
        )
    };
    let year_10000 = 253_402_300_800;
    for (what, token) in [
        ("exp 2^63", far(now(), 1 << 63)),
        ("exp u64::MAX", far(now(), u64::MAX)),
        ("exp in year 10000", far(now(), year_10000)),
        ("iat 2^63", far(1 << 63, now() + 600)),
    ] {
        // The independent library agrees that the signature is good: only the time is absurd.
        let mut lenient = validation();
        lenient.validate_exp = false;
        jsonwebtoken::decode::<Claims>(&token, &DecodingKey::from_secret(TEST_KEY), &lenient)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let status = expect_code(app.validate(&token).await, Code::Unauthenticated);
        assert_eq!(status.message(), "invalid token", "{what}: {status:?}");
        // The same connection still answers: the handler did not panic.
        assert_eq!(
            app.validate(&genuine).await.unwrap().username,
            "judy",
            "{what}"
        );
    }
    let metrics = app.handle.render_metrics();
    let line = r#"authd_tokens_validated_total{outcome="malformed"} 4"#;
    assert!(metrics.contains(line), "{line} missing in:\n{metrics}");
}

/// The reason of a refusal is in the log, at info, with the request's id.
#[tokio::test]
async fn the_reason_of_a_refusal_is_logged_with_the_request_id() {
    let dir = tempfile::tempdir().unwrap();
    let running = crate::cli::spawn_authd(
        dir.path(),
        &[("AUTHD_TOKEN_KEYS", key_spec(TEST_KID, TEST_KEY))],
    );
    let mut client = authd::pb::auth_service_client::AuthServiceClient::connect(format!(
        "http://{}",
        running.addr
    ))
    .await
    .unwrap();
    let claims = valid_claims_again();
    let mut request_ids = Vec::new();
    for token in [
        sign(&claims, Some("retired"), TEST_KEY),
        sign(&claims, Some(TEST_KID), b"another key, 32 bytes long......"),
    ] {
        let mut request = tonic::Request::new(authd::pb::ValidateTokenRequest {
            access_token: token,
            ..Default::default()
        });
        let id = crate::helpers::unique_name("probe");
        request
            .metadata_mut()
            .insert("x-request-id", id.parse().unwrap());
        let status = expect_code(
            client.validate_token(request).await.map(|r| r.into_inner()),
            Code::Unauthenticated,
        );
        assert_eq!(status.message(), "invalid token");
        request_ids.push(id);
    }
    let (status, log) = running.terminate().await;
    assert!(status.success());
    let refusals: Vec<serde_json::Value> = log
        .iter()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|e| e["message"] == "token refused")
        .collect();
    let found: Vec<(String, String, String)> = refusals
        .iter()
        .map(|e| {
            (
                e["level"].as_str().unwrap_or_default().to_owned(),
                e["request_id"].as_str().unwrap_or_default().to_owned(),
                e["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        found,
        [
            (
                "INFO".to_owned(),
                request_ids[0].clone(),
                "unknown_key".to_owned()
            ),
            (
                "INFO".to_owned(),
                request_ids[1].clone(),
                "bad_signature".to_owned()
            ),
        ],
        "{log:#?}"
    );
}

#[tokio::test]
async fn a_token_lifetime_at_the_limit_issues_tokens_that_validate() {
    let mut app = spawn_app_with(|c| c.tokens.token_ttl = authd::MAX_TTL).await;
    app.register("kate", "a fine password").await.unwrap();
    let session = app.login("kate", "a fine password").await.unwrap();
    let claims = jsonwebtoken::decode::<Claims>(
        &session.access_token,
        &DecodingKey::from_secret(TEST_KEY),
        &validation(),
    )
    .unwrap()
    .claims;
    assert_eq!(claims.exp - claims.iat, 7 * 24 * 3600);
    app.validate(&session.access_token).await.unwrap();
}

async fn tokens_signed_by_a_rotated_out_key_still_verify_while_it_is_listed(db: TestDb) {
    let old_key = b"the old key, thirty-two bytes ok";
    let new_key = b"the new key, thirty-two bytes ok";
    let mut before = spawn_app_on(&db, |c| {
        c.tokens.token_keys = Some(key_spec("old", old_key).parse().unwrap())
    })
    .await;
    before.register("ivan", "a fine password").await.unwrap();
    let old_token = before
        .login("ivan", "a fine password")
        .await
        .unwrap()
        .access_token;

    // The next deployment signs with "new" and still lists "old".
    let ring = format!("{},{}", key_spec("new", new_key), key_spec("old", old_key));
    before.stop().await.unwrap();
    let mut after = spawn_app_on(&db, |c| c.tokens.token_keys = Some(ring.parse().unwrap())).await;
    assert_eq!(after.validate(&old_token).await.unwrap().username, "ivan");
    let new_token = after
        .login("ivan", "a fine password")
        .await
        .unwrap()
        .access_token;
    let header = jsonwebtoken::decode_header(&new_token).unwrap();
    assert_eq!(header.kid.as_deref(), Some("new"));

    // Once "old" is dropped from the ring, its tokens stop verifying.
    after.stop().await.unwrap();
    let mut last = spawn_app_on(&db, |c| {
        c.tokens.token_keys = Some(key_spec("new", new_key).parse().unwrap())
    })
    .await;
    expect_code(last.validate(&old_token).await, Code::Unauthenticated);
    last.validate(&new_token).await.unwrap();
}

crate::backend_tests!(
    issued_tokens_verify_with_an_independent_jwt_library,
    tokens_from_an_independent_library_with_the_shared_key_validate,
    forged_expired_and_foreign_tokens_are_unauthenticated,
    validly_signed_tokens_from_beyond_year_9999_are_refused_without_a_panic,
    tokens_signed_by_a_rotated_out_key_still_verify_while_it_is_listed,
);

#[tokio::test]
async fn a_token_from_before_amr_reads_as_a_password_sign_in() {
    let mut app = spawn_app_with(|_| {}).await;
    // Validly signed, without amr (nor sid), as tokens were before the second factor.
    let old = sign(&valid_claims_again(), Some(TEST_KID), TEST_KEY);
    assert_eq!(app.validate(&old).await.unwrap().amr, ["pwd"]);
    let require = authd::pb::ValidateTokenRequest {
        access_token: old,
        require_second_factor: true,
        ..Default::default()
    };
    expect_code(
        app.client.validate_token(require).await,
        Code::PermissionDenied,
    );
}
