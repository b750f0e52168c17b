//! Ed25519 tokens, the JWKS document and the key file reload, through the real
//! interface: an independent JWT library (jsonwebtoken) verifies authd's EdDSA tokens
//! with nothing but the document fetched over HTTP from the running server; forgeries
//! (an HMAC secret, the public key used as one) are refused; audiences and `nbf`;
//! rotation from HS256 to EdDSA and between Ed25519 keys by rewriting the key file.

use crate::helpers::{
    TEST_KEY, TEST_KID, TestApp, expect_code, http_get, key_spec, login, metric, spawn_app_with,
    wait_for, wait_until,
};
use authd::{KeyAlgorithm, generate_key_entry};
use base64::{
    Engine as _,
    engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD},
};
use jsonwebtoken::{
    Algorithm, DecodingKey, EncodingKey, Header, Validation,
    jwk::{AlgorithmParameters, JwkSet},
};
use serde_json::{Value, json};
use std::{
    net::SocketAddr,
    path::Path,
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use tonic::Code;

const PASSWORD: &str = "a fine password";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A new Ed25519 key entry (`KID:ed25519:BASE64`), and its PKCS#8 DER for the test's
/// own copy of the key.
fn ed25519(kid: &str) -> (String, Vec<u8>) {
    let entry = generate_key_entry(KeyAlgorithm::EdDsa, kid).unwrap();
    let der = STANDARD.decode(entry.rsplit(':').next().unwrap()).unwrap();
    (entry, der)
}

/// The value of the header `name` (case-insensitive) in `head`.
fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim())
}

/// The JWKS document as a verifier fetches it: the parsed set and the raw JSON.
async fn fetch_jwks(app: &TestApp) -> (JwkSet, Value) {
    let addr = app.handle.metrics_addr().expect("the HTTP port is on");
    let (head, body) = http_get(addr, "/.well-known/jwks.json", "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(header(&head, "content-type"), Some("application/json"));
    let raw: Value = serde_json::from_str(&body).expect("JSON");
    (serde_json::from_str(&body).expect("a JWK Set"), raw)
}

/// Verifies `token` as an independent service would: the key is the JWKS entry of the
/// token's kid, the algorithm the one that key declares, never the token's choice.
fn verify_with_jwks(jwks: &JwkSet, token: &str) -> jsonwebtoken::errors::Result<Value> {
    let kid = jsonwebtoken::decode_header(token)?.kid.unwrap_or_default();
    let jwk = jwks
        .find(&kid)
        .ok_or(jsonwebtoken::errors::ErrorKind::InvalidKeyFormat)?;
    assert!(matches!(
        jwk.algorithm,
        AlgorithmParameters::OctetKeyPair(_)
    ));
    let mut validation = Validation::new(Algorithm::EdDSA);
    validation.set_issuer(&["authd"]);
    validation.set_required_spec_claims(&["exp", "iss", "sub", "nbf"]);
    validation.validate_aud = false;
    let key = DecodingKey::from_jwk(jwk)?;
    Ok(jsonwebtoken::decode::<Value>(token, &key, &validation)?.claims)
}

async fn login_token(app: &mut TestApp, user: &str) -> String {
    app.login(user, PASSWORD).await.unwrap().access_token
}

async fn validate_for(
    app: &mut TestApp,
    token: &str,
    audience: &str,
) -> Result<authd::pb::ValidateTokenResponse, tonic::Status> {
    app.client
        .validate_token(authd::pb::ValidateTokenRequest {
            access_token: token.into(),
            audience: audience.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner())
}

fn claims(name: &str) -> Value {
    json!({"sub": "some-user", "name": name, "iat": now(), "nbf": now(),
           "exp": now() + 600, "iss": "authd"})
}

fn sign_hs256(claims: &Value, kid: &str, secret: &[u8]) -> String {
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(secret)).unwrap()
}

fn sign_eddsa(claims: &Value, kid: &str, der: &[u8]) -> String {
    let mut header = Header::new(Algorithm::EdDSA);
    header.kid = Some(kid.into());
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_ed_der(der)).unwrap()
}

#[tokio::test]
async fn eddsa_tokens_verify_with_an_independent_library_from_the_jwks_alone() {
    let (entry, _) = ed25519("ed-1");
    // An HMAC key in the ring too: it must never be published.
    let ring = format!("{entry},{}", key_spec(TEST_KID, TEST_KEY));
    let mut app = spawn_app_with(|c| c.tokens.token_keys = Some(ring.parse().unwrap())).await;
    let user_id = app.register("olivia", PASSWORD).await.unwrap();
    let token = login_token(&mut app, "olivia").await;
    let header = jsonwebtoken::decode_header(&token).unwrap();
    assert_eq!(header.alg, Algorithm::EdDSA);
    assert_eq!(header.kid.as_deref(), Some("ed-1"));

    let (jwks, raw) = fetch_jwks(&app).await;
    let claims = verify_with_jwks(&jwks, &token).expect("jsonwebtoken verifies with the JWKS");
    assert_eq!(claims["sub"], user_id.as_str());
    assert_eq!(claims["name"], "olivia");
    assert_eq!(claims["nbf"], claims["iat"]);
    assert!(claims.get("aud").is_none(), "no audience configured");
    // Exactly the public Ed25519 key: no HMAC key, no `k`, no `d`, nothing else.
    let keys = raw["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1, "{raw}");
    let fields: Vec<&String> = keys[0].as_object().unwrap().keys().collect();
    assert_eq!(fields.len(), 6, "{raw}");
    for (field, value) in [
        ("kty", "OKP"),
        ("crv", "Ed25519"),
        ("kid", "ed-1"),
        ("alg", "EdDSA"),
        ("use", "sig"),
    ] {
        assert_eq!(keys[0][field], value, "{raw}");
    }
    assert!(!raw.to_string().contains(&STANDARD.encode(TEST_KEY)));
    assert!(!raw.to_string().contains(&URL_SAFE_NO_PAD.encode(TEST_KEY)));
    assert!(!raw.to_string().contains(entry.rsplit(':').next().unwrap()));

    // gRPC-only clients get the same document, and the keys as fields.
    let response = app
        .client
        .get_signing_keys(authd::pb::GetSigningKeysRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serde_json::from_str::<Value>(&response.jwks_json).unwrap(),
        raw
    );
    assert_eq!(response.keys.len(), 1);
    let key = &response.keys[0];
    assert_eq!(
        (key.kid.as_str(), key.kty.as_str(), key.crv.as_str()),
        ("ed-1", "OKP", "Ed25519")
    );
    assert_eq!((key.alg.as_str(), key.r#use.as_str()), ("EdDSA", "sig"));
    assert_eq!(key.x, keys[0]["x"]);
    // And authd itself accepts the token.
    assert_eq!(app.validate(&token).await.unwrap().user_id, user_id);
    app.stop().await.unwrap();
}

#[tokio::test]
async fn the_jwks_document_is_cacheable_and_empty_for_an_hmac_ring() {
    let app = spawn_app_with(|_| {}).await;
    let addr = app.handle.metrics_addr().unwrap();
    let (head, body) = http_get(addr, "/.well-known/jwks.json", "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(body, r#"{"keys":[]}"#);
    assert_eq!(
        header(&head, "cache-control"),
        Some(format!("public, max-age={}", 300).as_str())
    );
    let etag = header(&head, "etag").expect("an ETag").to_owned();
    assert!(etag.starts_with('"') && etag.ends_with('"'), "{etag}");
    // Revalidation: the same document is not sent again.
    let (head, body) = http_get(
        addr,
        "/.well-known/jwks.json",
        &format!("If-None-Match: {etag}\r\n"),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 304"), "{head}");
    assert!(body.is_empty());
    let (head, _) = http_get(
        addr,
        "/.well-known/jwks.json",
        "If-None-Match: \"another\"\r\n",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // /metrics is still served on the same port.
    let (head, _) = http_get(addr, "/metrics", "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    app.stop().await.unwrap();
}

#[tokio::test]
async fn hmac_forgeries_and_algorithm_confusion_are_refused() {
    let (entry, der) = ed25519("ed-1");
    let ring = format!("{entry},{}", key_spec(TEST_KID, TEST_KEY));
    let mut app = spawn_app_with(|c| c.tokens.token_keys = Some(ring.parse().unwrap())).await;
    let (jwks, raw) = fetch_jwks(&app).await;
    let x = raw["keys"][0]["x"].as_str().unwrap().to_owned();
    let public = URL_SAFE_NO_PAD.decode(&x).unwrap();
    let c = claims("admin");

    // Genuine: signed with the test's own copy of the Ed25519 key.
    let genuine = sign_eddsa(&c, "ed-1", &der);
    app.validate(&genuine).await.unwrap();
    verify_with_jwks(&jwks, &genuine).unwrap();

    let (_, other_der) = ed25519("ed-1");
    let forgeries = [
        // The classic confusion: HS256 under the Ed25519 kid, the public key as the
        // HMAC secret (raw bytes, and the JWK's x text as a library might take it).
        ("HS256 with the public key", sign_hs256(&c, "ed-1", &public)),
        (
            "HS256 with the x value",
            sign_hs256(&c, "ed-1", x.as_bytes()),
        ),
        // A shared secret someone holds, under the Ed25519 kid.
        (
            "HS256 with an HMAC secret",
            sign_hs256(&c, "ed-1", TEST_KEY),
        ),
        // EdDSA under the HMAC key's kid.
        ("EdDSA under an HMAC kid", sign_eddsa(&c, TEST_KID, &der)),
        // Another Ed25519 key claiming the kid.
        ("EdDSA by another key", sign_eddsa(&c, "ed-1", &other_der)),
        // HMAC secret under a kid nobody knows.
        ("HS256 unknown kid", sign_hs256(&c, "nobody", TEST_KEY)),
    ];
    for (what, token) in &forgeries {
        let status = expect_code(app.validate(token).await, Code::Unauthenticated);
        assert_eq!(status.message(), "invalid token", "{what}");
        // A verifier that follows the JWKS refuses them too.
        assert!(verify_with_jwks(&jwks, token).is_err(), "{what}");
    }
    let metrics = app.handle.render_metrics();
    for (outcome, n) in [
        ("algorithm_mismatch", 4.0),
        ("bad_signature", 1.0),
        ("unknown_key", 1.0),
    ] {
        let series = format!(r#"authd_tokens_validated_total{{outcome="{outcome}"}}"#);
        assert_eq!(metric(&metrics, &series), Some(n), "{series}\n{metrics}");
    }
    app.stop().await.unwrap();
}

#[tokio::test]
async fn tokens_carry_the_audience_and_validate_only_for_it() {
    let mut app = spawn_app_with(|c| c.tokens.token_audience = vec!["orders".into()]).await;
    app.register("peggy", PASSWORD).await.unwrap();
    let token = login_token(&mut app, "peggy").await;
    let payload: Value = serde_json::from_slice(
        &URL_SAFE_NO_PAD
            .decode(token.split('.').nth(1).unwrap())
            .unwrap(),
    )
    .unwrap();
    assert_eq!(payload["aud"], "orders");
    assert_eq!(
        validate_for(&mut app, &token, "orders")
            .await
            .unwrap()
            .username,
        "peggy"
    );
    // No audience asked for: not checked.
    app.validate(&token).await.unwrap();
    let status = expect_code(
        validate_for(&mut app, &token, "billing").await,
        Code::Unauthenticated,
    );
    assert_eq!(status.message(), "invalid token");
    // A token without aud is not meant for anyone in particular: refused when one is asked.
    let no_aud = sign_hs256(&claims("peggy"), TEST_KID, TEST_KEY);
    expect_code(
        validate_for(&mut app, &no_aud, "orders").await,
        Code::Unauthenticated,
    );
    let mut many = claims("peggy");
    many["aud"] = json!(["billing", "orders"]);
    let many = sign_hs256(&many, TEST_KID, TEST_KEY);
    validate_for(&mut app, &many, "orders").await.unwrap();
    validate_for(&mut app, &many, "billing").await.unwrap();
    expect_code(
        validate_for(&mut app, &many, "shipping").await,
        Code::Unauthenticated,
    );
    let huge = "a".repeat(257);
    let status = expect_code(
        validate_for(&mut app, &token, &huge).await,
        Code::InvalidArgument,
    );
    assert!(!status.message().contains(&huge));
    let metrics = app.handle.render_metrics();
    let series = r#"authd_tokens_validated_total{outcome="wrong_audience"}"#;
    assert_eq!(metric(&metrics, series), Some(3.0), "{metrics}");
    app.stop().await.unwrap();
}

#[tokio::test]
async fn nbf_and_iat_in_the_future_are_refused_beyond_the_clock_skew() {
    let (entry, der) = ed25519("ed-1");
    let mut app = spawn_app_with(|c| {
        c.tokens.token_keys = Some(entry.parse().unwrap());
        c.tokens.token_clock_skew = Duration::from_secs(30);
    })
    .await;
    let with = |field: &str, value: u64| {
        let mut c = claims("quentin");
        c[field] = value.into();
        sign_eddsa(&c, "ed-1", &der)
    };
    // Well within the 30 s allowed (a slow machine has 20 s to spare), then far beyond.
    for (what, token) in [
        ("nbf 10 s ahead", with("nbf", now() + 10)),
        ("iat 10 s ahead", with("iat", now() + 10)),
        ("exp 10 s ago", with("exp", now() - 10)),
    ] {
        app.validate(&token)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    }
    for (what, token) in [
        ("nbf an hour ahead", with("nbf", now() + 3600)),
        ("iat an hour ahead", with("iat", now() + 3600)),
        ("exp a minute ago", with("exp", now() - 90)),
    ] {
        let status = expect_code(app.validate(&token).await, Code::Unauthenticated);
        assert_eq!(status.message(), "invalid token", "{what}");
    }
    let metrics = app.handle.render_metrics();
    for (outcome, n) in [("not_yet_valid", 2.0), ("expired", 1.0)] {
        let series = format!(r#"authd_tokens_validated_total{{outcome="{outcome}"}}"#);
        assert_eq!(metric(&metrics, &series), Some(n), "{series}\n{metrics}");
    }
    app.stop().await.unwrap();

    // With no skew allowed, 10 s ahead is too early.
    let mut strict = spawn_app_with(|c| {
        c.tokens.token_keys = Some(entry.parse().unwrap());
        c.tokens.token_clock_skew = Duration::ZERO;
    })
    .await;
    expect_code(
        strict.validate(&with("nbf", now() + 10)).await,
        Code::Unauthenticated,
    );
    strict.stop().await.unwrap();
}

fn write_keys(path: &Path, entries: &[&str]) {
    // Written beside and renamed, as a Secret volume swaps its files.
    let tmp = path.with_extension("new");
    std::fs::write(
        &tmp,
        format!("# authd token keys\n{}\n", entries.join("\n")),
    )
    .unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test]
async fn rotation_from_hs256_to_eddsa_by_editing_the_key_file_never_refuses_a_valid_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let old = key_spec("old-hs", b"the old key, thirty-two bytes ok");
    let (new, _) = ed25519("new-ed");
    write_keys(&path, &[&old]);
    let mut app = spawn_app_with(|c| {
        c.tokens.token_keys = None;
        c.tokens.token_keys_file = Some(path.clone());
        // Only the explicit reloads below: the test decides when the file is read.
        c.tokens.token_keys_reload = Duration::from_secs(3600);
    })
    .await;
    app.register("rupert", PASSWORD).await.unwrap();
    let hs_token = login_token(&mut app, "rupert").await;
    assert_eq!(
        jsonwebtoken::decode_header(&hs_token).unwrap().alg,
        Algorithm::HS256
    );
    assert_eq!(app.handle.reload_token_keys().await, Ok(false));

    // Step 1: the new key is listed second; verifiers see it in the JWKS, HS256 signs.
    write_keys(&path, &[&old, &new]);
    assert_eq!(app.handle.reload_token_keys().await, Ok(true));
    let (jwks, _) = fetch_jwks(&app).await;
    assert!(jwks.find("new-ed").is_some());
    let still_hs = login_token(&mut app, "rupert").await;
    assert_eq!(
        jsonwebtoken::decode_header(&still_hs).unwrap().alg,
        Algorithm::HS256
    );

    // Step 2: the new key moves first: EdDSA tokens, which the JWKS fetched after step 1
    // already verifies; the old key's tokens still validate.
    write_keys(&path, &[&new, &old]);
    assert_eq!(app.handle.reload_token_keys().await, Ok(true));
    let ed_token = login_token(&mut app, "rupert").await;
    let header = jsonwebtoken::decode_header(&ed_token).unwrap();
    assert_eq!(
        (header.alg, header.kid.as_deref()),
        (Algorithm::EdDSA, Some("new-ed"))
    );
    verify_with_jwks(&jwks, &ed_token).expect("the JWKS of step 1 verifies step 2's tokens");
    app.validate(&hs_token).await.unwrap();
    app.validate(&ed_token).await.unwrap();
    let metrics = app.handle.render_metrics();
    let series = r#"authd_token_signing_key{alg="EdDSA",kid="new-ed"}"#;
    assert_eq!(metric(&metrics, series), Some(1.0), "{metrics}");

    // Step 3, once the old tokens have expired: the old key goes.
    write_keys(&path, &[&new]);
    assert_eq!(app.handle.reload_token_keys().await, Ok(true));
    expect_code(app.validate(&hs_token).await, Code::Unauthenticated);
    app.validate(&ed_token).await.unwrap();
    let series = r#"authd_token_keys_reloads_total{outcome="ok"}"#;
    assert_eq!(metric(&app.handle.render_metrics(), series), Some(3.0));
    app.stop().await.unwrap();
}

#[tokio::test]
async fn the_key_file_is_reloaded_on_its_own_and_a_bad_file_keeps_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let (first, _) = ed25519("first");
    let (second, _) = ed25519("second");
    write_keys(&path, &[&first]);
    let mut app = spawn_app_with(|c| {
        c.tokens.token_keys = None;
        c.tokens.token_keys_file = Some(path.clone());
        c.tokens.token_keys_reload = Duration::from_millis(20);
    })
    .await;
    app.register("sybil", PASSWORD).await.unwrap();
    let first_token = login_token(&mut app, "sybil").await;

    // A file that does not parse: refused, the ring in use stays.
    let broken = "second:ed25519:bm90IGEga2V5IGF0IGFsbCwgYnV0IHNlY3JldA==";
    write_keys(&path, &[&second, broken]);
    let handle = app.handle.clone();
    let series = r#"authd_token_keys_reloads_total{outcome="error"}"#;
    wait_until("the bad file is refused", || {
        metric(&handle.render_metrics(), series) == Some(1.0)
    })
    .await;
    let why = app.handle.reload_token_keys().await;
    assert_eq!(why, Ok(false), "the same bad content is not news");
    let token = login_token(&mut app, "sybil").await;
    assert_eq!(
        jsonwebtoken::decode_header(&token).unwrap().kid.as_deref(),
        Some("first")
    );
    app.validate(&first_token).await.unwrap();

    // A good file: the periodic reload puts it in use; the old key's tokens no longer verify.
    write_keys(&path, &[&second]);
    let client = app.client.clone();
    wait_for("the new key signs", || {
        let mut client = client.clone();
        async move {
            let token = (login(&mut client, "sybil", PASSWORD).await.unwrap()).access_token;
            let kid = jsonwebtoken::decode_header(&token).unwrap().kid;
            (kid.as_deref() == Some("second")).then_some(())
        }
    })
    .await;
    expect_code(app.validate(&first_token).await, Code::Unauthenticated);
    let (jwks, _) = fetch_jwks(&app).await;
    assert!(jwks.find("second").is_some() && jwks.find("first").is_none());
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_bad_key_file_is_logged_without_its_content() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    let (good, _) = ed25519("good");
    write_keys(&path, &[&good]);
    let running = crate::cli::spawn_authd(
        dir.path(),
        &[
            ("AUTHD_TOKEN_KEYS_FILE", path.display().to_string()),
            ("AUTHD_TOKEN_KEYS_RELOAD", "20ms".into()),
        ],
    );
    let secret = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0";
    write_keys(&path, &[&format!("bad:ed25519:{secret}")]);
    // The refusal is counted, then the log read at exit.
    let metrics_addr: SocketAddr = running.metrics_addr.parse().unwrap();
    wait_for("the bad file is refused", || async {
        let (_, body) = http_get(metrics_addr, "/metrics", "").await;
        let refused = metric(&body, r#"authd_token_keys_reloads_total{outcome="error"}"#);
        (refused == Some(1.0)).then_some(())
    })
    .await;
    let (status, log) = running.terminate().await;
    assert!(status.success());
    let refusal = log
        .iter()
        .find(|l| l.contains("token keys file refused"))
        .expect("the refusal is logged");
    let event: Value = serde_json::from_str(refusal).unwrap();
    assert_eq!(event["level"], "ERROR");
    assert!(refusal.contains(r#"\"bad\""#), "{refusal}");
    for line in &log {
        assert!(!line.contains(secret), "{line}");
        assert!(!line.contains(good.rsplit(':').next().unwrap()), "{line}");
    }
}

#[tokio::test]
async fn keygen_prints_keys_that_authd_accepts() {
    for (alg, prefix) in [("ed25519", "k1:ed25519:"), ("hs256", "k1:hs256:")] {
        let out = crate::helpers::authd_command()
            .args(["keygen", "--alg", alg, "--kid", "k1"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(out.stderr.is_empty(), "nothing on stderr: {out:?}");
        let entry = String::from_utf8(out.stdout).unwrap();
        let entry = entry.trim_end();
        assert!(entry.starts_with(prefix), "{entry}");
        assert_eq!(entry.lines().count(), 1);
        // The server's own configuration parsing takes it.
        let ring: authd::KeyRing = entry.parse().unwrap();
        assert_eq!(ring.signing_kid(), "k1");
    }
    // Without --alg: Ed25519, with a dated kid; two runs never repeat a key.
    let run = || {
        let out = crate::helpers::authd_command()
            .arg("keygen")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap().trim_end().to_owned()
    };
    let (a, b) = (run(), run());
    assert_ne!(a, b);
    assert!(a.split(':').nth(1) == Some("ed25519"), "{a}");
    // And a started authd signs with it and publishes its public half.
    let dir = tempfile::tempdir().unwrap();
    let running = crate::cli::spawn_authd(dir.path(), &[("AUTHD_TOKEN_KEYS", a.clone())]);
    let kid = a.split(':').next().unwrap();
    let (head, body) = http_get(
        running.metrics_addr.parse().unwrap(),
        "/.well-known/jwks.json",
        "",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let jwks: JwkSet = serde_json::from_str(&body).unwrap();
    assert!(jwks.find(kid).is_some(), "{body}");
    let (status, _) = running.terminate().await;
    assert!(status.success());

    let out = crate::helpers::authd_command()
        .args(["keygen", "--kid", "not a kid"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
}
