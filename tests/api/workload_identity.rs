//! Service accounts proven by an external issuer's token (RFC 7523's
//! `client_assertion`), against an issuer that is not authd: a discovery document
//! and a JWKS served by the test on a loopback port, in the shape a Kubernetes API
//! server publishes them (`/.well-known/openid-configuration`, `/openid/v1/jwks`),
//! from a key the test generates, and tokens in the shape of projected
//! service-account tokens. A bound token gets a service token (over HTTP and gRPC)
//! that ValidateToken and Check accept; the wrong issuer, audience, signature,
//! expiry or subject are refused; the keys are fetched once and again only for a
//! new key id, at most once per refresh period. RS256 keys (what an API server
//! signs with by default) and ES256 keys verify their tokens, each only under its
//! own algorithm; an issuer served over https is trusted through
//! `AUTHD_JWT_ISSUER_CA` only, and grants answer UNAVAILABLE while its certificate
//! chains to no CA authd trusts. A CA bundle for https issuers that holds no
//! certificate stops the start.

use crate::admin::{ADMIN_KEY, Admin, admin_app};
use crate::helpers::{TestDb, expect_code, metric};
use crate::tls::Ca;
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
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use tokio_rustls::rustls;
use tonic::{Code, Request};

crate::backend_tests!(
    a_kubernetes_service_account_token_proves_its_account,
    rs256_and_es256_keys_each_verify_their_own_tokens,
    an_https_issuer_is_trusted_through_its_ca_only,
);

const AUDIENCE: &str = "https://authd.example";
const SUBJECT: &str = "system:serviceaccount:shop:orders";

/// The private half of a signing key.
enum Private {
    /// P-256, for ES256.
    Ec(KeyPair),
    /// RSA 2048, for RS256: what a Kubernetes API server signs with by default.
    Rsa(rsa::RsaPrivateKey),
}

/// A signing key of the test's issuer, with its id.
struct SigningKey {
    kid: String,
    private: Private,
}

impl SigningKey {
    /// A P-256 key (ES256).
    fn new(kid: &str) -> Self {
        Self {
            kid: kid.into(),
            private: Private::Ec(KeyPair::generate().unwrap()),
        }
    }

    /// An RSA key (RS256).
    fn rsa(kid: &str) -> Self {
        let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).unwrap();
        Self {
            kid: kid.into(),
            private: Private::Rsa(key),
        }
    }

    /// The algorithm its JWK names.
    fn algorithm(&self) -> Algorithm {
        match self.private {
            Private::Ec(_) => Algorithm::ES256,
            Private::Rsa(_) => Algorithm::RS256,
        }
    }

    /// Its public JWK, as a Kubernetes API server lists its keys.
    fn jwk(&self) -> Value {
        match &self.private {
            Private::Ec(pair) => {
                let raw = pair.public_key_raw();
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
            Private::Rsa(key) => {
                use rsa::traits::PublicKeyParts as _;
                json!({
                    "use": "sig",
                    "kty": "RSA",
                    "kid": self.kid,
                    "alg": "RS256",
                    "n": URL_SAFE_NO_PAD.encode(key.n().to_bytes_be()),
                    "e": URL_SAFE_NO_PAD.encode(key.e().to_bytes_be()),
                })
            }
        }
    }

    fn encoding_key(&self) -> EncodingKey {
        match &self.private {
            Private::Ec(pair) => EncodingKey::from_ec_der(&pair.serialize_der()),
            Private::Rsa(key) => {
                use rsa::pkcs1::EncodeRsaPrivateKey as _;
                EncodingKey::from_rsa_der(key.to_pkcs1_der().unwrap().as_bytes())
            }
        }
    }

    /// A token with `claims`, signed with this key by `algorithm` under `kid`.
    fn sign_with(&self, algorithm: Algorithm, kid: &str, claims: &Value) -> String {
        let mut header = Header::new(algorithm);
        header.kid = Some(kid.into());
        jsonwebtoken::encode(&header, claims, &self.encoding_key()).unwrap()
    }

    /// A token with `claims`, signed with this key under `kid`.
    fn sign_as(&self, kid: &str, claims: &Value) -> String {
        self.sign_with(self.algorithm(), kid, claims)
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

/// The issuer over plain http.
async fn issuer() -> Issuer {
    issuer_on(None).await
}

/// The issuer over https with `tls` when given (its URL `https://127.0.0.1:PORT`,
/// as an API server is reached by address), else over plain http.
async fn issuer_on(tls: Option<Arc<rustls::ServerConfig>>) -> Issuer {
    use axum::{Router, extract::State, http::Uri, routing::get};
    fn json_answer(value: Value) -> ([(&'static str, &'static str); 1], String) {
        ([("content-type", "application/json")], value.to_string())
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{addr}");
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
                let jwks = s.jwks.lock().unwrap().clone();
                let algorithms: Vec<Value> = (jwks["keys"].as_array().unwrap().iter())
                    .map(|key| key["alg"].clone())
                    .collect();
                json_answer(json!({
                    "issuer": s.url,
                    "jwks_uri": format!("{}/openid/v1/jwks", s.url),
                    "response_types_supported": ["id_token"],
                    "subject_types_supported": ["public"],
                    "id_token_signing_alg_values_supported": algorithms,
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
    match tls {
        None => {
            tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        }
        Some(tls) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(tls);
            tokio::spawn(async move {
                while let Ok((tcp, _)) = listener.accept().await {
                    let (acceptor, router) = (acceptor.clone(), router.clone());
                    tokio::spawn(async move {
                        // A client that does not trust the certificate ends here.
                        let Ok(stream) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let io = hyper_util::rt::TokioIo::new(stream);
                        let service = hyper_util::service::TowerToHyperService::new(router);
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(io, service)
                            .await;
                    });
                }
            });
        }
    }
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

    /// Requests it answered, of either document.
    fn requests(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

/// An app that trusts `issuer`'s tokens (its keys fetched at most once an hour),
/// and the issuer's certificate when it chains to the CAs of `ca`.
async fn app_for(db: &TestDb, issuer: &Issuer, ca: Option<PathBuf>) -> Admin {
    let url = issuer.url.clone();
    admin_app(db, |c| {
        c.oidc.jwt_issuers = vec![(url, AUDIENCE.into())];
        c.oidc.jwt_issuer_ca = ca;
        c.oidc.jwt_issuer_refresh = Duration::from_secs(3600);
    })
    .await
}

/// The account `orders`, bound to `SUBJECT` of `issuer`; its id.
async fn bind_orders(admin: &mut Admin, issuer: &Issuer) -> String {
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
    created.account.unwrap().id
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
    let account = bind_orders(&mut admin, &issuer).await;
    let later = now() + 3600;
    let good = key.sign(&projected(&issuer.url, AUDIENCE, SUBJECT, later));

    // gRPC and HTTP: a service token of the bound account.
    let token = grant_grpc(&admin, &good).await.unwrap();
    let valid = admin.app.validate(&token).await.unwrap();
    assert!(valid.service);
    assert_eq!(
        (valid.client_id.as_str(), valid.user_id.as_str()),
        ("orders", account.as_str())
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

/// RS256 is what a Kubernetes API server signs projected tokens with by default;
/// ES256 keys sit beside RSA ones in one JWKS. Each key verifies its own tokens
/// under the algorithm it names, and no other: a token naming an RSA key's id with
/// ES256, PS256, RS512 or HS256 (its public modulus as the HMAC secret) is refused.
async fn rs256_and_es256_keys_each_verify_their_own_tokens(db: TestDb) {
    let issuer = issuer().await;
    let rsa = SigningKey::rsa("rsa-1");
    let ec = SigningKey::new("ec-1");
    issuer.publish(&[&rsa, &ec]);
    let mut admin = app_for(&db, &issuer, None).await;
    let account = bind_orders(&mut admin, &issuer).await;
    let claims = projected(&issuer.url, AUDIENCE, SUBJECT, now() + 3600);

    // RS256, over gRPC and HTTP.
    let token = grant_grpc(&admin, &rsa.sign(&claims)).await.unwrap();
    let valid = admin.app.validate(&token).await.unwrap();
    assert!(valid.service);
    assert_eq!(
        (valid.client_id.as_str(), valid.user_id.as_str()),
        ("orders", account.as_str())
    );
    let (status, body) = grant_http(admin.app.addr, &rsa.sign(&claims)).await;
    assert_eq!(status, 200, "{body}");
    admin
        .app
        .validate(body["access_token"].as_str().unwrap())
        .await
        .unwrap();
    // ES256 beside it.
    let token = grant_grpc(&admin, &ec.sign(&claims)).await.unwrap();
    assert!(admin.app.validate(&token).await.unwrap().service);

    // The key fixes the algorithm, never the token.
    let modulus = {
        use rsa::traits::PublicKeyParts as _;
        let Private::Rsa(key) = &rsa.private else {
            unreachable!()
        };
        URL_SAFE_NO_PAD.encode(key.n().to_bytes_be())
    };
    let mut hmac = Header::new(Algorithm::HS256);
    hmac.kid = Some("rsa-1".into());
    let refused = [
        // The EC key's signature under the RSA key's id.
        ec.sign_as("rsa-1", &claims),
        // The RSA key under other RSA algorithms.
        rsa.sign_with(Algorithm::PS256, "rsa-1", &claims),
        rsa.sign_with(Algorithm::RS512, "rsa-1", &claims),
        // The RSA key's published modulus as an HMAC secret.
        jsonwebtoken::encode(
            &hmac,
            &claims,
            &EncodingKey::from_secret(modulus.as_bytes()),
        )
        .unwrap(),
        // Another RSA key under the same id.
        SigningKey::rsa("rsa-1").sign(&claims),
    ];
    for (i, assertion) in refused.iter().enumerate() {
        let status = expect_code(grant_grpc(&admin, assertion).await, Code::Unauthenticated);
        assert_eq!(status.message(), "invalid client credentials", "{i}");
    }
    // Every key came with the one fetch.
    assert_eq!(issuer.jwks_fetches(), 1);
}

/// An API server serves its discovery document and JWKS over https, with a
/// certificate of the cluster's own CA: authd fetches them trusting the CAs of
/// `AUTHD_JWT_ISSUER_CA`. Without it (the Mozilla roots) or with another CA, the
/// handshake fails, no document is read, and a grant with the issuer's token
/// answers UNAVAILABLE (over HTTP 503), so the service retries.
async fn an_https_issuer_is_trusted_through_its_ca_only(db: TestDb) {
    let cluster = Ca::new("kubernetes");
    let issuer = issuer_on(Some(cluster.server(2040).server_config())).await;
    assert!(
        issuer.url.starts_with("https://127.0.0.1:"),
        "{}",
        issuer.url
    );
    let key = SigningKey::rsa("k1");
    issuer.publish(&[&key]);
    let files = tempfile::tempdir().unwrap();
    let trusted = files.path().join("ca.crt");
    std::fs::write(&trusted, cluster.pem()).unwrap();
    let other = files.path().join("other-ca.crt");
    std::fs::write(&other, Ca::new("another cluster").pem()).unwrap();
    let assertion = key.sign(&projected(&issuer.url, AUDIENCE, SUBJECT, now() + 3600));

    let mut admin = app_for(&db, &issuer, Some(trusted)).await;
    let account = bind_orders(&mut admin, &issuer).await;
    let token = grant_grpc(&admin, &assertion).await.unwrap();
    let valid = admin.app.validate(&token).await.unwrap();
    assert_eq!(
        (valid.client_id.as_str(), valid.user_id.as_str()),
        ("orders", account.as_str())
    );
    let (status, body) = grant_http(admin.app.addr, &assertion).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(issuer.jwks_fetches(), 1);
    let series =
        |outcome: &str| format!(r#"authd_jwt_issuer_fetches_total{{outcome="{outcome}"}}"#);
    let metrics = admin.app.handle.render_metrics();
    assert_eq!(metric(&metrics, &series("ok")), Some(1.0), "{metrics}");

    let answered = issuer.requests();
    for ca in [None, Some(other)] {
        let shown = format!("{ca:?}");
        let refusing = app_for(&db, &issuer, ca).await;
        let status = expect_code(grant_grpc(&refusing, &assertion).await, Code::Unavailable);
        assert_eq!(
            status.message(),
            "service unavailable: the external issuer's keys cannot be fetched",
            "{shown}"
        );
        let (status, body) = grant_http(refusing.app.addr, &assertion).await;
        assert_eq!(
            (status, body["error"].as_str()),
            (503, Some("temporarily_unavailable")),
            "{shown}"
        );
        // The one fetch failed at the handshake: nothing was read, and the next
        // grant did not ask again within the refresh period.
        let metrics = refusing.app.handle.render_metrics();
        assert_eq!(
            metric(&metrics, &series("error")),
            Some(1.0),
            "{shown}: {metrics}"
        );
        assert_eq!(metric(&metrics, &series("ok")), None, "{shown}");
    }
    assert_eq!(
        issuer.requests(),
        answered,
        "no request past a refused handshake"
    );
}
