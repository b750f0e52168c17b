//! Service accounts proven by an external issuer's token (RFC 7523's
//! `client_assertion`), against an issuer that is not authd: a discovery document
//! and a JWKS served by the test on a loopback port, in the shape a Kubernetes API
//! server publishes them (`/.well-known/openid-configuration`, `/openid/v1/jwks`),
//! from a key the test generates, and tokens in the shape of projected
//! service-account tokens. A bound token gets a service token (over HTTP and gRPC)
//! that ValidateToken and Check accept; the wrong issuer, audience, signature,
//! expiry or subject are refused; the keys are fetched once and again only for a
//! new key id, at most once per refresh period. A CA bundle for https issuers that
//! holds no certificate stops the start.

use crate::admin::{ADMIN_KEY, Admin, admin_app};
use crate::helpers::{TestDb, expect_code, metric};
use authd::pb::{
    IssueServiceTokenRequest,
    admin::{CreateServiceAccountRequest, JwtBinding},
};
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rcgen::KeyPair;
use serde_json::{Value, json};
use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use tonic::{Code, Request};

crate::backend_tests!(a_kubernetes_service_account_token_proves_its_account);

const AUDIENCE: &str = "https://authd.example";
const SUBJECT: &str = "system:serviceaccount:shop:orders";

/// A signing key of the test's issuer, with its id.
struct SigningKey {
    kid: String,
    pair: KeyPair,
}

impl SigningKey {
    fn new(kid: &str) -> Self {
        Self {
            kid: kid.into(),
            pair: KeyPair::generate().unwrap(),
        }
    }

    /// Its public JWK, as a Kubernetes API server lists an ES256 key.
    fn jwk(&self) -> Value {
        let raw = self.pair.public_key_raw();
        assert_eq!(raw[0], 4, "an uncompressed P-256 point");
        json!({
            "use": "sig",
            "kty": "EC",
            "kid": self.kid,
            "crv": "P-256",
            "alg": "ES256",
            "x": URL_SAFE_NO_PAD.encode(&raw[1..33]),
            "y": URL_SAFE_NO_PAD.encode(&raw[33..65]),
        })
    }

    /// A token with `claims`, signed with this key under `kid`.
    fn sign_as(&self, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(kid.into());
        let key = EncodingKey::from_ec_der(&self.pair.serialize_der());
        jsonwebtoken::encode(&header, claims, &key).unwrap()
    }

    fn sign(&self, claims: &Value) -> String {
        self.sign_as(&self.kid, claims)
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The claims of a projected service-account token of `issuer`.
fn projected(issuer: &str, audience: &str, subject: &str, exp: u64) -> Value {
    let iat = exp.saturating_sub(3600);
    json!({
        "aud": [audience],
        "exp": exp,
        "iat": iat,
        "iss": issuer,
        "jti": "6a1c1b34-1e3d-4c55-9c52-0d6f2f7b4b11",
        "kubernetes.io": {
            "namespace": "shop",
            "node": {"name": "node-1", "uid": "0c8d3a4e-2f7e-4d0a-9b57-5a1f9f1e9a10"},
            "pod": {"name": "orders-7d4b9c8f6d-x2k5q", "uid": "a7e3c9f2-6b1d-4e8a-8c3f-1d2e3f4a5b6c"},
            "serviceaccount": {"name": "orders", "uid": "3f2e1d0c-9b8a-4c7d-8e6f-5a4b3c2d1e0f"}
        },
        "nbf": iat,
        "sub": subject,
    })
}

/// The test's issuer: a discovery document and a JWKS on a loopback port.
struct Issuer {
    url: String,
    jwks: Arc<Mutex<Value>>,
    requests: Arc<Mutex<Vec<String>>>,
}

async fn issuer() -> Issuer {
    use axum::{Router, extract::State, http::Uri, routing::get};
    fn json_answer(value: Value) -> ([(&'static str, &'static str); 1], String) {
        ([("content-type", "application/json")], value.to_string())
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let url = format!("http://{addr}");
    let jwks = Arc::new(Mutex::new(json!({"keys": []})));
    let requests = Arc::new(Mutex::new(Vec::new()));
    #[derive(Clone)]
    struct Shared {
        url: String,
        jwks: Arc<Mutex<Value>>,
        requests: Arc<Mutex<Vec<String>>>,
    }
    let shared = Shared {
        url: url.clone(),
        jwks: jwks.clone(),
        requests: requests.clone(),
    };
    let router = Router::new()
        .route(
            "/.well-known/openid-configuration",
            get(|State(s): State<Shared>, uri: Uri| async move {
                s.requests.lock().unwrap().push(uri.path().to_owned());
                json_answer(json!({
                    "issuer": s.url,
                    "jwks_uri": format!("{}/openid/v1/jwks", s.url),
                    "response_types_supported": ["id_token"],
                    "subject_types_supported": ["public"],
                    "id_token_signing_alg_values_supported": ["ES256"],
                }))
            }),
        )
        .route(
            "/openid/v1/jwks",
            get(|State(s): State<Shared>, uri: Uri| async move {
                s.requests.lock().unwrap().push(uri.path().to_owned());
                json_answer(s.jwks.lock().unwrap().clone())
            }),
        )
        .with_state(shared);
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    Issuer {
        url,
        jwks,
        requests,
    }
}

impl Issuer {
    fn publish(&self, keys: &[&SigningKey]) {
        let keys: Vec<Value> = keys.iter().map(|k| k.jwk()).collect();
        *self.jwks.lock().unwrap() = json!({ "keys": keys });
    }

    fn jwks_fetches(&self) -> usize {
        let requests = self.requests.lock().unwrap();
        requests.iter().filter(|p| *p == "/openid/v1/jwks").count()
    }
}

fn with_key<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_KEY}").parse().unwrap(),
    );
    request
}

async fn grant_grpc(admin: &Admin, assertion: &str) -> Result<String, tonic::Status> {
    admin
        .app
        .client
        .clone()
        .issue_service_token(IssueServiceTokenRequest {
            client_assertion: assertion.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().access_token)
}

/// `POST /oauth2/token` with a client assertion: the status and the JSON answer.
async fn grant_http(addr: SocketAddr, assertion: &str) -> (u16, Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let body = format!(
        "grant_type=client_credentials&client_assertion_type=\
         urn%3Aietf%3Aparams%3Aoauth%3Aclient-assertion-type%3Ajwt-bearer\
         &client_assertion={assertion}"
    );
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "POST /oauth2/token HTTP/1.1\r\nHost: {addr}\r\nContent-Type: \
         application/x-www-form-urlencoded\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

async fn a_kubernetes_service_account_token_proves_its_account(db: TestDb) {
    let issuer = issuer().await;
    let key = SigningKey::new("k1");
    issuer.publish(&[&key]);
    let url = issuer.url.clone();
    let admin = admin_app(&db, |c| {
        c.oidc.jwt_issuers = vec![(url.clone(), AUDIENCE.into())];
        c.oidc.jwt_issuer_refresh = Duration::from_secs(3600);
    })
    .await;
    let mut admin = admin;
    let created = admin
        .client
        .create_service_account(with_key(CreateServiceAccountRequest {
            name: "orders".into(),
            audiences: vec!["billing".into()],
            jwt_bindings: vec![JwtBinding {
                issuer: issuer.url.clone(),
                subject: SUBJECT.into(),
            }],
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_inner();
    let account = created.account.unwrap();
    let later = now() + 3600;
    let good = key.sign(&projected(&issuer.url, AUDIENCE, SUBJECT, later));

    // gRPC and HTTP: a service token of the bound account.
    let token = grant_grpc(&admin, &good).await.unwrap();
    let valid = admin.app.validate(&token).await.unwrap();
    assert!(valid.service);
    assert_eq!(
        (valid.client_id.as_str(), valid.user_id.as_str()),
        ("orders", account.id.as_str())
    );
    let (status, body) = grant_http(admin.app.addr, &good).await;
    assert_eq!(status, 200, "{body}");
    let token = body["access_token"].as_str().unwrap();
    let authorization = format!("Bearer {token}");
    let checked = crate::extauthz::check(&admin.app, &[("authorization", &authorization)], &[])
        .await
        .unwrap();
    assert_eq!(checked.status.map(|s| s.code), Some(0));
    // One fetch of the keys for all of it.
    assert_eq!(issuer.jwks_fetches(), 1);

    // Refused, each as a wrong secret is.
    let other_key = SigningKey::new("k1");
    let refused = [
        // Another issuer.
        key.sign(&projected("http://127.0.0.1:1", AUDIENCE, SUBJECT, later)),
        // Another audience.
        key.sign(&projected(
            &issuer.url,
            "https://other.example",
            SUBJECT,
            later,
        )),
        // Another key under the same key id: a bad signature.
        other_key.sign(&projected(&issuer.url, AUDIENCE, SUBJECT, later)),
        // Expired.
        key.sign(&projected(&issuer.url, AUDIENCE, SUBJECT, now() - 600)),
        // A subject bound to no account.
        key.sign(&projected(
            &issuer.url,
            AUDIENCE,
            "system:serviceaccount:shop:stock",
            later,
        )),
        // Not a JWT.
        "not-a-token".to_owned(),
    ];
    for (i, assertion) in refused.iter().enumerate() {
        let status = expect_code(grant_grpc(&admin, assertion).await, Code::Unauthenticated);
        assert_eq!(status.message(), "invalid client credentials", "{i}");
        let (status, body) = grant_http(admin.app.addr, assertion).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (401, Some("invalid_client")),
            "{i}"
        );
    }
    // A key id it does not know: the keys are fetched again only after the refresh
    // period, however many such tokens come.
    let unknown = SigningKey::new("k9");
    for _ in 0..3 {
        let assertion = unknown.sign(&projected(&issuer.url, AUDIENCE, SUBJECT, later));
        expect_code(grant_grpc(&admin, &assertion).await, Code::Unauthenticated);
    }
    assert_eq!(
        issuer.jwks_fetches(),
        1,
        "no fetch within the refresh period"
    );

    // A rotated key: published, then used; an app whose refresh period has passed
    // fetches the new keys once and accepts it.
    let rotated = SigningKey::new("k2");
    issuer.publish(&[&key, &rotated]);
    let url = issuer.url.clone();
    let eager = admin_app(&db, |c| {
        c.oidc.jwt_issuers = vec![(url, AUDIENCE.into())];
        c.oidc.jwt_issuer_refresh = Duration::from_millis(1);
    })
    .await;
    let before = issuer.jwks_fetches();
    grant_grpc(&eager, &good).await.unwrap();
    let new = rotated.sign(&projected(&issuer.url, AUDIENCE, SUBJECT, later));
    grant_grpc(&eager, &new).await.unwrap();
    assert_eq!(
        issuer.jwks_fetches(),
        before + 1,
        "the new key came with the first fetch"
    );
    // A key published later: its first token fetches the keys again.
    let third = SigningKey::new("k3");
    issuer.publish(&[&rotated, &third]);
    let assertion = third.sign(&projected(&issuer.url, AUDIENCE, SUBJECT, later));
    grant_grpc(&eager, &assertion).await.unwrap();
    assert_eq!(issuer.jwks_fetches(), before + 2);
    let metrics = eager.app.handle.render_metrics();
    assert_eq!(
        metric(&metrics, r#"authd_jwt_issuer_fetches_total{outcome="ok"}"#),
        Some(2.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn an_issuer_ca_that_holds_no_certificate_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ca.crt");
    std::fs::write(&path, KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let db = TestDb::new(crate::helpers::Backend::Sqlite, "")
        .await
        .unwrap();
    let mut config = crate::helpers::test_config(db.url.clone());
    config.oidc.jwt_issuers = vec![("https://k8s.example".into(), AUDIENCE.into())];
    config.oidc.jwt_issuer_ca = Some(path.clone());
    let err = match authd::app::Application::build(config).await {
        Ok(_) => panic!("the start went on"),
        Err(e) => format!("{e:#}"),
    };
    assert_eq!(
        err,
        format!(
            "--jwt-issuer-ca (AUTHD_JWT_ISSUER_CA) {}: no PEM certificate in the file",
            path.display()
        )
    );
}
