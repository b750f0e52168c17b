//! TLS and mutual TLS on the gRPC port, with certificates made here (rcgen): the
//! services over TLS, refused handshakes, the client identity in rate limits, logs,
//! the allow-list and trusted callers, live rotation of the certificate files, bad files.

use crate::{
    cli::refused_start,
    helpers::{Backend, Started, TestDb, metric, start, test_config, wait_until},
};
use authd::{
    app::Application,
    config::Config,
    pb::{ValidateTokenRequest, auth_service_client::AuthServiceClient},
};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use std::{net::SocketAddr, path::PathBuf, time::Duration};
use tonic::{
    Code,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// A certificate authority of the test's own.
pub(crate) struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, PEM.
#[derive(Clone)]
pub(crate) struct Pair {
    pub(crate) cert: String,
    pub(crate) key: String,
}

impl Pair {
    /// A TLS server's configuration presenting this certificate, for the HTTPS
    /// servers the tests run (webhook endpoints, token issuers).
    pub(crate) fn server_config(&self) -> std::sync::Arc<tokio_rustls::rustls::ServerConfig> {
        use tokio_rustls::rustls::{
            ServerConfig,
            crypto::ring::default_provider,
            pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _},
        };
        let chain = CertificateDer::pem_slice_iter(self.cert.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_slice(self.key.as_bytes()).unwrap();
        let config = ServerConfig::builder_with_provider(std::sync::Arc::new(default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        std::sync::Arc::new(config)
    }
}

impl Ca {
    pub(crate) fn new(name: &str) -> Self {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Self { issuer }
    }

    pub(crate) fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `localhost`, expiring at the start of `year`.
    pub(crate) fn server(&self, year: i32) -> Pair {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_after = rcgen::date_time_ymd(year, 1, 1);
        self.sign(params)
    }

    /// A client certificate whose first URI SAN is `uri`.
    fn client(&self, uri: &str) -> Pair {
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, "client");
        params.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    pub(crate) fn sign(&self, params: CertificateParams) -> Pair {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Pair {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// Unix seconds of the start of `year` (as `Ca::server` sets `notAfter`).
fn start_of(year: i32) -> i64 {
    rcgen::date_time_ymd(year, 1, 1).unix_timestamp()
}

/// The TLS files of a server, in a directory of their own.
struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    fn new(server: &Pair, client_ca: Option<&Ca>) -> Self {
        let files = Self {
            dir: tempfile::tempdir().unwrap(),
        };
        files.write("cert.pem", &server.cert);
        files.write("key.pem", &server.key);
        if let Some(ca) = client_ca {
            files.write("client-ca.pem", &ca.pem());
        }
        files
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Replaces a file whole (a new file renamed over it), as Kubernetes swaps a
    /// Secret's files.
    fn write(&self, name: &str, content: &str) {
        let next = self.path(&format!(".{name}.next"));
        std::fs::write(&next, content).unwrap();
        std::fs::rename(&next, self.path(name)).unwrap();
    }

    fn configure(&self, config: &mut Config, mutual: bool) {
        config.tls.tls_cert = Some(self.path("cert.pem"));
        config.tls.tls_key = Some(self.path("key.pem"));
        if mutual {
            config.tls.tls_client_ca = Some(self.path("client-ca.pem"));
        }
        config.tls.tls_reload = Duration::from_millis(20);
    }
}

/// authd serving TLS on 127.0.0.1:0.
struct TlsApp {
    app: Started,
    _db: TestDb,
}

impl std::ops::Deref for TlsApp {
    type Target = Started;

    fn deref(&self) -> &Started {
        &self.app
    }
}

async fn spawn_tls(files: &Files, mutual: bool, adjust: impl FnOnce(&mut Config)) -> TlsApp {
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut config = test_config(db.url.clone());
    files.configure(&mut config, mutual);
    adjust(&mut config);
    TlsApp {
        app: start(config).await,
        _db: db,
    }
}

impl TlsApp {
    fn metrics(&self) -> String {
        self.handle.render_metrics()
    }

    fn reloads(&self, outcome: &str) -> f64 {
        let series = format!("authd_tls_reloads_total{{outcome=\"{outcome}\"}}");
        metric(&self.metrics(), &series).unwrap_or(0.0)
    }

    fn expiry(&self) -> Option<f64> {
        metric(
            &self.metrics(),
            "authd_tls_certificate_expiry_timestamp_seconds{certificate=\"server\"}",
        )
    }

    async fn stop(self) {
        self.app.stop().await.unwrap();
    }
}

/// A lazy TLS channel to `addr` trusting `ca`, presenting `identity` if given.
fn tls_channel(addr: SocketAddr, ca: &str, identity: Option<&Pair>) -> Channel {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(pair) = identity {
        tls = tls.identity(Identity::from_pem(&pair.cert, &pair.key));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .unwrap()
        .tls_config(tls)
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect_lazy()
}

/// Why a call on `channel` fails: its code and its whole error chain, in words.
async fn failure(channel: &Channel) -> (Code, String) {
    let mut client = AuthServiceClient::new(channel.clone());
    let request = ValidateTokenRequest {
        access_token: "not-a-token".into(),
        ..Default::default()
    };
    let status = client.validate_token(request).await.unwrap_err();
    let mut chain = status.message().to_owned();
    let mut source = std::error::Error::source(&status);
    while let Some(e) = source {
        chain.push_str(&format!(": {e}"));
        source = e.source();
    }
    (status.code(), chain)
}

/// One ValidateToken call (with a token that is not one): UNAUTHENTICATED means
/// the request went through TLS and every layer to the handler.
async fn validate(channel: &Channel) -> Code {
    let mut client = AuthServiceClient::new(channel.clone());
    let request = ValidateTokenRequest {
        access_token: "not-a-token".into(),
        ..Default::default()
    };
    match client.validate_token(request).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn tls_serves_the_api_health_and_reflection_on_one_port() {
    let ca = Ca::new("server-ca");
    let files = Files::new(&ca.server(2040), None);
    let app = spawn_tls(&files, false, |_| {}).await;
    let channel = tls_channel(app.addr, &ca.pem(), None);

    let mut client = AuthServiceClient::new(channel.clone());
    crate::helpers::register(&mut client, "tls-user", "correct horse battery")
        .await
        .unwrap();
    let token = crate::helpers::login(&mut client, "tls-user", "correct horse battery")
        .await
        .unwrap()
        .access_token;
    let valid = client
        .validate_token(ValidateTokenRequest {
            access_token: token,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(valid.username, "tls-user");

    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, 1, "SERVING");

    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::iter([request]))
        .await
        .unwrap()
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("{answer:?}");
    };
    let names: Vec<_> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"auth.v1.AuthService"), "{names:?}");

    // Plaintext to the TLS port is refused; the health-only port stays plaintext.
    let plain = Endpoint::from_shared(format!("http://{}", app.addr))
        .unwrap()
        .connect_lazy();
    let (code, chain) = failure(&plain).await;
    assert!(
        matches!(code, Code::Unavailable | Code::Unknown),
        "{code:?} {chain}"
    );
    let probe = Channel::from_shared(format!("http://{}", app.handle.health_addr().unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let status = HealthClient::new(probe)
        .check(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner()
        .status;
    assert_eq!(status, 1);

    assert_eq!(app.expiry(), Some(start_of(2040) as f64));
    app.stop().await;
}

#[tokio::test]
async fn mutual_tls_refuses_clients_without_a_certificate_of_the_client_ca() {
    let server_ca = Ca::new("server-ca");
    let client_ca = Ca::new("client-ca");
    let other_ca = Ca::new("other-ca");
    let files = Files::new(&server_ca.server(2040), Some(&client_ca));
    let app = spawn_tls(&files, true, |_| {}).await;

    let trusted = client_ca.client("spiffe://corp/ns/web/sa/api");
    let good = tls_channel(app.addr, &server_ca.pem(), Some(&trusted));
    assert_eq!(validate(&good).await, Code::Unauthenticated);

    let without = tls_channel(app.addr, &server_ca.pem(), None);
    let untrusted = other_ca.client("spiffe://corp/ns/web/sa/api");
    let other = tls_channel(app.addr, &server_ca.pem(), Some(&untrusted));
    for (channel, alert) in [(without, "CertificateRequired"), (other, "UnknownCA")] {
        let (code, chain) = failure(&channel).await;
        assert!(
            matches!(code, Code::Unavailable | Code::Unknown),
            "{code:?} {chain}"
        );
        assert!(chain.contains(alert), "{chain}");
    }

    // The server counts a failed handshake once it has sent its alert: soon after.
    wait_until("both failed handshakes are counted", || {
        metric(&app.metrics(), "authd_tls_handshake_errors_total") >= Some(2.0)
    })
    .await;
    // The one that got in still works.
    assert_eq!(validate(&good).await, Code::Unauthenticated);
    app.stop().await;
}

#[tokio::test]
async fn the_client_identity_is_a_rate_limit_key() {
    let server_ca = Ca::new("server-ca");
    let client_ca = Ca::new("client-ca");
    let files = Files::new(&server_ca.server(2040), Some(&client_ca));
    // A long window: nothing here depends on the clock.
    let app = spawn_tls(&files, true, |c| {
        c.limits.rate_limits = Some("*:client-cert=2/1h".parse().unwrap());
    })
    .await;
    let a = tls_channel(
        app.addr,
        &server_ca.pem(),
        Some(&client_ca.client("spiffe://corp/a")),
    );
    let b = tls_channel(
        app.addr,
        &server_ca.pem(),
        Some(&client_ca.client("spiffe://corp/b")),
    );
    assert_eq!(validate(&a).await, Code::Unauthenticated);
    assert_eq!(validate(&a).await, Code::Unauthenticated);
    assert_eq!(validate(&a).await, Code::ResourceExhausted);
    // Another identity from the same address has a count of its own.
    assert_eq!(validate(&b).await, Code::Unauthenticated);
    assert_eq!(validate(&b).await, Code::Unauthenticated);
    assert_eq!(validate(&b).await, Code::ResourceExhausted);
    // A second connection with the first identity shares its count.
    let a2 = tls_channel(
        app.addr,
        &server_ca.pem(),
        Some(&client_ca.client("spiffe://corp/a")),
    );
    assert_eq!(validate(&a2).await, Code::ResourceExhausted);
    app.stop().await;
}

/// One ValidateToken call naming `forwarded` in `x-forwarded-for`: its code.
async fn validate_forwarded(channel: &Channel, forwarded: &str) -> Code {
    let mut client = AuthServiceClient::new(channel.clone());
    let mut request = tonic::Request::new(ValidateTokenRequest {
        access_token: "not-a-token".into(),
        ..Default::default()
    });
    (request.metadata_mut()).insert("x-forwarded-for", forwarded.parse().unwrap());
    match client.validate_token(request).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn a_trusted_identity_s_forwarded_end_users_are_the_clients() {
    let server_ca = Ca::new("server-ca");
    let client_ca = Ca::new("client-ca");
    let files = Files::new(&server_ca.server(2040), Some(&client_ca));
    // One call an hour per client: nothing here depends on the clock.
    let app = spawn_tls(&files, true, |c| {
        c.limits.trusted_callers = Some("spiffe://corp/ns/signup/sa/signup".parse().unwrap());
        c.limits.rate_limits = Some("ValidateToken:peer=1/1h".parse().unwrap());
    })
    .await;
    let signup = tls_channel(
        app.addr,
        &server_ca.pem(),
        Some(&client_ca.client("spiffe://corp/ns/signup/sa/signup")),
    );
    let other = tls_channel(
        app.addr,
        &server_ca.pem(),
        Some(&client_ca.client("spiffe://corp/ns/web/sa/other")),
    );
    // The trusted identity's end users each have their own count.
    for user in ["203.0.113.1", "203.0.113.2", "[2001:db8::1]:443"] {
        assert_eq!(
            validate_forwarded(&signup, user).await,
            Code::Unauthenticated
        );
    }
    assert_eq!(
        validate_forwarded(&signup, "203.0.113.1").await,
        Code::ResourceExhausted
    );
    // Another identity from the same address is counted by that address, whatever
    // it forwards (the trusted one's calls never counted for it).
    assert_eq!(
        validate_forwarded(&other, "203.0.113.3").await,
        Code::Unauthenticated
    );
    assert_eq!(
        validate_forwarded(&other, "203.0.113.4").await,
        Code::ResourceExhausted
    );
    app.stop().await;
}

#[tokio::test]
async fn the_allow_list_refuses_other_identities_with_permission_denied() {
    let server_ca = Ca::new("server-ca");
    let client_ca = Ca::new("client-ca");
    let files = Files::new(&server_ca.server(2040), Some(&client_ca));
    let app = spawn_tls(&files, true, |c| {
        c.tls.tls_allow = Some(
            "Register:spiffe://corp/ns/web/sa/signup,ValidateToken:spiffe://corp/ns/web/sa/signup"
                .parse()
                .unwrap(),
        );
    })
    .await;
    let signup = tls_channel(
        app.addr,
        &server_ca.pem(),
        Some(&client_ca.client("spiffe://corp/ns/web/sa/signup")),
    );
    let other = tls_channel(
        app.addr,
        &server_ca.pem(),
        Some(&client_ca.client("spiffe://corp/ns/web/sa/other")),
    );
    let mut signup_client = AuthServiceClient::new(signup.clone());
    let mut other_client = AuthServiceClient::new(other.clone());
    crate::helpers::register(&mut signup_client, "allowed", "correct horse battery")
        .await
        .unwrap();
    let denied = crate::helpers::register(&mut other_client, "denied", "correct horse battery")
        .await
        .unwrap_err();
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    assert!(!denied.message().contains("other"), "{denied:?}");
    assert_eq!(validate(&other).await, Code::PermissionDenied);
    // Login is not on the list: open to every client certificate.
    crate::helpers::login(&mut other_client, "allowed", "correct horse battery")
        .await
        .unwrap();
    // Health and reflection are never restricted.
    HealthClient::new(other)
        .check(HealthCheckRequest::default())
        .await
        .unwrap();
    assert_eq!(validate(&signup).await, Code::Unauthenticated);
    app.stop().await;
}

/// The certificate a new TLS connection to `addr` is shown (trusting `ca`).
async fn presented_certificate(addr: SocketAddr, ca: &str) -> Result<Vec<u8>, std::io::Error> {
    use tokio_rustls::rustls::{self, pki_types::CertificateDer, pki_types::pem::PemObject};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.as_bytes()).unwrap())
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, tcp).await?;
    let (_, connection) = tls.get_ref();
    assert_eq!(connection.alpn_protocol(), Some(&b"h2"[..]));
    Ok(connection.peer_certificates().unwrap()[0].to_vec())
}

fn der_of(pem: &str) -> Vec<u8> {
    use tokio_rustls::rustls::pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

#[tokio::test]
async fn a_new_certificate_serves_new_connections_and_open_ones_stay() {
    let old_ca = Ca::new("old-ca");
    let new_ca = Ca::new("new-ca");
    let old = old_ca.server(2040);
    let files = Files::new(&old, None);
    let app = spawn_tls(&files, false, |_| {}).await;
    // This client trusts only the old CA: after the rotation it could not connect
    // again, so its calls succeeding means its connection was kept.
    let kept = tls_channel(app.addr, &old_ca.pem(), None);
    assert_eq!(validate(&kept).await, Code::Unauthenticated);
    assert_eq!(
        presented_certificate(app.addr, &old_ca.pem())
            .await
            .unwrap(),
        der_of(&old.cert)
    );

    let new = new_ca.server(2041);
    files.write("key.pem", &new.key);
    files.write("cert.pem", &new.cert);
    wait_until("the new certificate is in force", || {
        app.expiry() == Some(start_of(2041) as f64)
    })
    .await;
    assert!(app.reloads("ok") >= 1.0);

    assert_eq!(validate(&kept).await, Code::Unauthenticated);
    assert_eq!(
        presented_certificate(app.addr, &new_ca.pem())
            .await
            .unwrap(),
        der_of(&new.cert)
    );
    assert!(
        presented_certificate(app.addr, &old_ca.pem())
            .await
            .is_err()
    );
    let fresh = tls_channel(app.addr, &new_ca.pem(), None);
    assert_eq!(validate(&fresh).await, Code::Unauthenticated);
    let stale = tls_channel(app.addr, &old_ca.pem(), None);
    assert_eq!(validate(&stale).await, Code::Unavailable);
    assert_eq!(validate(&kept).await, Code::Unauthenticated);
    app.stop().await;
}

#[tokio::test]
async fn a_bad_new_file_is_refused_and_the_old_certificate_stays() {
    let ca = Ca::new("server-ca");
    let old = ca.server(2040);
    let files = Files::new(&old, None);
    let app = spawn_tls(&files, false, |_| {}).await;

    files.write(
        "cert.pem",
        "-----BEGIN CERTIFICATE-----\nnot base64 %%%\n-----END CERTIFICATE-----\n",
    );
    wait_until("the corrupt file is refused", || {
        app.reloads("error") >= 1.0
    })
    .await;
    assert_eq!(
        presented_certificate(app.addr, &ca.pem()).await.unwrap(),
        der_of(&old.cert)
    );

    // A certificate whose key is not the one in the key file: refused too.
    let other = ca.server(2041);
    files.write("cert.pem", &other.cert);
    wait_until("the mismatched pair is refused", || {
        app.reloads("error") >= 2.0
    })
    .await;
    assert_eq!(
        presented_certificate(app.addr, &ca.pem()).await.unwrap(),
        der_of(&old.cert)
    );
    assert_eq!(app.expiry(), Some(start_of(2040) as f64));
    assert_eq!(app.reloads("ok"), 0.0);

    // Its key arrives: now the pair is good and in force.
    files.write("key.pem", &other.key);
    wait_until("the good pair is in force", || app.reloads("ok") >= 1.0).await;
    assert_eq!(
        presented_certificate(app.addr, &ca.pem()).await.unwrap(),
        der_of(&other.cert)
    );
    app.stop().await;
}

#[tokio::test]
async fn a_bad_file_at_start_stops_the_start_naming_the_option() {
    let ca = Ca::new("server-ca");
    let good = ca.server(2040);
    let other = ca.server(2040);
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let cases: [(&str, &str, &str); 3] = [
        ("garbage", &good.key, "--tls-cert (AUTHD_TLS_CERT)"),
        (&good.cert, "garbage", "--tls-key (AUTHD_TLS_KEY)"),
        (&good.cert, &other.key, "--tls-key (AUTHD_TLS_KEY)"),
    ];
    for (cert, key, option) in cases {
        let files = Files::new(
            &Pair {
                cert: cert.into(),
                key: key.into(),
            },
            None,
        );
        let mut config = test_config(db.url.clone());
        files.configure(&mut config, false);
        let err = match Application::build(config).await {
            Ok(_) => panic!("{option}: the start went on"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.starts_with(option), "{err}");
        assert!(!err.contains('\n'), "{err}");
        assert!(!err.contains("PRIVATE KEY"), "{err}");
    }

    // The binary: one line, exit 1.
    let files = Files::new(
        &Pair {
            cert: good.cert.clone(),
            key: other.key.clone(),
        },
        None,
    );
    let out = crate::helpers::authd_command()
        .env("AUTHD_LISTEN", "127.0.0.1:0")
        .env("AUTHD_METRICS_LISTEN", "")
        .env(
            "AUTHD_DATABASE_URL",
            format!("sqlite://{}", files.path("a.db").display()),
        )
        .env("AUTHD_TLS_CERT", files.path("cert.pem"))
        .env("AUTHD_TLS_KEY", files.path("key.pem"))
        .output()
        .unwrap();
    let (stderr, last) = refused_start(out);
    let last = last.as_str();
    assert!(
        last.starts_with("authd: error: --tls-key (AUTHD_TLS_KEY) ")
            && last.ends_with("the key does not match the certificate of --tls-cert"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_client_that_sends_no_client_hello_is_closed_at_the_handshake_timeout() {
    use tokio::io::AsyncReadExt as _;
    let ca = Ca::new("server-ca");
    let files = Files::new(&ca.server(2040), None);
    let app = spawn_tls(&files, false, |c| {
        // Long enough for a real handshake on a busy machine.
        c.server.handshake_timeout = Duration::from_secs(2);
        // One connection from this address at a time: the silent one holds it.
        c.server.max_connections_per_client = Some(1);
    })
    .await;
    let mut silent = tokio::net::TcpStream::connect(app.addr).await.unwrap();
    let series = "authd_connections_open{listener=\"grpc\"}";
    wait_until("the silent connection is open", || {
        metric(&app.metrics(), series) == Some(1.0)
    })
    .await;
    // Meanwhile, a TLS client from the same address is turned away at once.
    let refused = presented_certificate(app.addr, &ca.pem()).await;
    assert!(refused.is_err());

    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf))
        .await
        .expect("closed by the server, not left open");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    let timeouts = metric(
        &app.metrics(),
        "authd_connections_handshake_timeouts_total{listener=\"grpc\"}",
    );
    assert_eq!(timeouts, Some(1.0));
    // The slot is free again once the connection's task has ended.
    crate::helpers::wait_for("the slot is free again", || async {
        presented_certificate(app.addr, &ca.pem()).await.ok()
    })
    .await;
    app.stop().await;
}

#[tokio::test]
async fn authd_health_checks_a_tls_port() {
    let server_ca = Ca::new("server-ca");
    let client_ca = Ca::new("client-ca");
    let files = Files::new(&server_ca.server(2040), Some(&client_ca));
    files.write("ca.pem", &server_ca.pem());
    let client = client_ca.client("spiffe://corp/probe");
    files.write("client.pem", &client.cert);
    files.write("client.key", &client.key);
    let app = spawn_tls(&files, true, |_| {}).await;
    let addr = app.addr.to_string();
    let (ca, cert, key) = (
        files.path("ca.pem"),
        files.path("client.pem"),
        files.path("client.key"),
    );
    let run = move |with_cert: bool| {
        let mut command = crate::helpers::authd_command();
        command
            .arg("health")
            .args(["--addr", &addr])
            .arg("--tls-ca")
            .arg(&ca)
            .args(["--tls-server-name", "localhost"]);
        if with_cert {
            command
                .arg("--tls-cert")
                .arg(&cert)
                .arg("--tls-key")
                .arg(&key);
        }
        command.output().unwrap()
    };
    let (ok, without) = tokio::task::spawn_blocking(move || (run(true), run(false)))
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(stdout.ends_with("(server): SERVING\n"), "{stdout}");
    // The server asks for a client certificate: without one, no answer.
    assert_eq!(without.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert!(stderr.contains("unreachable"), "{stderr}");
    app.stop().await;
}

#[tokio::test]
async fn authd_admin_speaks_tls_to_the_admin_port() {
    let server_ca = Ca::new("server-ca");
    let client_ca = Ca::new("client-ca");
    let files = Files::new(&server_ca.server(2040), Some(&client_ca));
    files.write("ca.pem", &server_ca.pem());
    let client = client_ca.client("spiffe://corp/oncall");
    files.write("client.pem", &client.cert);
    files.write("client.key", &client.key);
    let keys = crate::admin::keys_file();
    let keys_path = keys.path().to_owned();
    let app = spawn_tls(&files, true, |c| {
        c.admin.admin_listen = "127.0.0.1:0".parse().unwrap();
        c.admin.admin_keys_file = Some(keys_path);
    })
    .await;
    let addr = app.handle.admin_addr().unwrap().to_string();
    let path = |name: &str| files.path(name).display().to_string();
    let with_ca: [String; 4] = [
        "--tls-ca".into(),
        path("ca.pem"),
        "--tls-server-name".into(),
        "localhost".into(),
    ];
    let with_cert: [String; 4] = [
        "--tls-cert".into(),
        path("client.pem"),
        "--tls-key".into(),
        path("client.key"),
    ];
    let runs = [
        [&with_ca[..], &with_cert[..]].concat(),
        // Plaintext to a TLS port.
        vec![],
        // A server certificate of a CA not trusted (the Mozilla roots by default).
        vec!["--tls-server-name".into(), "localhost".into()],
        // No client certificate for a server with mutual TLS.
        with_ca.to_vec(),
    ];
    let outputs = tokio::task::spawn_blocking(move || {
        runs.map(|tls| {
            (crate::helpers::authd_command())
                .args(["admin", "users", "list", "--json", "--addr", &addr])
                .args(&tls)
                .env("AUTHD_ADMIN_KEY", crate::admin::ADMIN_KEY)
                .output()
                .unwrap()
        })
    })
    .await
    .unwrap();
    let [ok, refused @ ..] = outputs;
    let stdout = String::from_utf8_lossy(&ok.stdout);
    assert!(
        ok.status.success(),
        "{stdout} {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let page: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(page["users"], serde_json::json!([]));
    // No answer to the call: exit status 3, one line.
    for refused in refused {
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert_eq!(refused.status.code(), Some(3), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("no answer") || stderr.contains("cannot connect"),
            "{stderr}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn the_request_log_names_the_client_identity() {
    let server_ca = Ca::new("server-ca");
    let client_ca = Ca::new("client-ca");
    let files = Files::new(&server_ca.server(2040), Some(&client_ca));
    let envs = [
        (
            "AUTHD_TLS_CERT",
            files.path("cert.pem").display().to_string(),
        ),
        ("AUTHD_TLS_KEY", files.path("key.pem").display().to_string()),
        (
            "AUTHD_TLS_CLIENT_CA",
            files.path("client-ca.pem").display().to_string(),
        ),
        (
            "AUTHD_TOKEN_KEYS",
            crate::helpers::key_spec(crate::helpers::TEST_KID, crate::helpers::TEST_KEY),
        ),
    ];
    let running = crate::cli::spawn_authd(files.dir.path(), &envs);
    let addr: SocketAddr = running.addr.parse().unwrap();
    let channel = tls_channel(
        addr,
        &server_ca.pem(),
        Some(&client_ca.client("spiffe://corp/ns/web/sa/logged")),
    );
    assert_eq!(validate(&channel).await, Code::Unauthenticated);
    drop(channel);
    let (status, log) = running.terminate().await;
    assert!(status.success());
    let request = log
        .iter()
        .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
        .find(|event| event["message"] == "request" && event["method"] == "ValidateToken")
        .expect("the request is logged");
    assert_eq!(request["client"], "spiffe://corp/ns/web/sa/logged");
    assert_eq!(request["code"], "UNAUTHENTICATED");
    let serving = log.iter().find(|l| l.contains("authd is serving")).unwrap();
    assert!(serving.contains(r#""tls":"mutual""#), "{serving}");
}

/// The admin port under mutual TLS: a client certificate on the admin allow-list
/// acts with its role, another one is PERMISSION_DENIED, and an admin key still
/// works from any certificate.
#[tokio::test]
async fn the_admin_port_takes_the_client_certificates_of_its_allow_list() {
    use authd::pb::admin::{
        DisableUserRequest, GetUserRequest, UserSelector, admin_service_client::AdminServiceClient,
        user_selector::Selector,
    };
    let server_ca = Ca::new("server-ca");
    let client_ca = Ca::new("client-ca");
    let files = Files::new(&server_ca.server(2040), Some(&client_ca));
    let app = spawn_tls(&files, true, |c| {
        c.admin.admin_listen = "127.0.0.1:0".parse().unwrap();
        c.admin.admin_allow = vec![
            (
                authd::config::AdminRole::Admin,
                "spiffe://corp/ns/ops/sa/oncall".into(),
            ),
            (
                authd::config::AdminRole::Read,
                "spiffe://corp/ns/ops/sa/auditor".into(),
            ),
        ];
    })
    .await;
    let admin_addr = app.handle.admin_addr().unwrap();
    let as_identity = |uri: &str| {
        AdminServiceClient::new(tls_channel(
            admin_addr,
            &server_ca.pem(),
            Some(&client_ca.client(uri)),
        ))
    };
    let mut oncall = as_identity("spiffe://corp/ns/ops/sa/oncall");
    let mut auditor = as_identity("spiffe://corp/ns/ops/sa/auditor");
    let mut stranger = as_identity("spiffe://corp/ns/web/sa/signup");
    let mut users = AuthServiceClient::new(tls_channel(
        app.addr,
        &server_ca.pem(),
        Some(&client_ca.client("spiffe://corp/ns/web/sa/signup")),
    ));
    crate::helpers::register(&mut users, "lena", "correct horse battery")
        .await
        .unwrap();
    let lena = || {
        Some(UserSelector {
            selector: Some(Selector::Username("lena".into())),
        })
    };
    let get = || GetUserRequest { user: lena() };
    let disable = || DisableUserRequest {
        user: lena(),
        reason: "test".into(),
    };

    let found = auditor.get_user(get()).await.unwrap().into_inner();
    assert_eq!(found.user.unwrap().username, "lena");
    let status = auditor.disable_user(disable()).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let status = stranger.get_user(get()).await.unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    assert!(!status.message().contains("signup"), "{status:?}");
    let done = oncall.disable_user(disable()).await.unwrap().into_inner();
    assert!(done.changed);
    let refused = crate::helpers::login(&mut users, "lena", "correct horse battery")
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    app.stop().await;
}

#[tokio::test]
async fn json_and_grpc_web_over_tls_with_http1_and_http2() {
    use crate::http_json::{Version, send_with};
    use http_body_util::Full;
    use tokio_rustls::rustls::{self, pki_types::CertificateDer, pki_types::pem::PemObject};
    let ca = Ca::new("server-ca");
    let files = Files::new(&ca.server(2040), None);
    let app = spawn_tls(&files, false, |_| {}).await;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem().as_bytes()).unwrap())
        .unwrap();
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let config = std::sync::Arc::new(config);
    for (version, name) in [(Version::H1, "tlsjsonone"), (Version::H2, "tlsjsontwo")] {
        let body = serde_json::json!({ "username": name, "password": "correct horse battery" });
        let request = http::Request::post("https://localhost/auth.v1.AuthService/Register")
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(body.to_string())))
            .unwrap();
        let reply = send_with(app.addr, version, Some(config.clone()), request).await;
        assert_eq!(reply.status, 200, "{version:?}: {reply:?}");
        assert!(reply.json()["userId"].as_str().is_some());
    }
    app.stop().await;
}

/// A service account proves itself with its client certificate: a bound identity
/// gets a token with neither client id nor secret; an unbound one, and the bound
/// one once its credential is removed, are refused as a wrong secret is, and the
/// token issued for the removed identity is refused.
#[tokio::test]
async fn a_bound_certificate_identity_gets_a_service_token_until_it_is_removed() {
    use authd::pb::{
        IssueServiceTokenRequest,
        admin::{
            CreateServiceAccountRequest, RemoveServiceCredentialRequest, ServiceAccountSelector,
            admin_service_client::AdminServiceClient, service_account_selector::Selector,
        },
    };
    let server_ca = Ca::new("server-ca");
    let client_ca = Ca::new("client-ca");
    let files = Files::new(&server_ca.server(2040), Some(&client_ca));
    let app = spawn_tls(&files, true, |c| {
        c.admin.admin_listen = "127.0.0.1:0".parse().unwrap();
        c.admin.admin_allow = vec![(
            authd::config::AdminRole::Admin,
            "spiffe://corp/ns/ops/sa/oncall".into(),
        )];
    })
    .await;
    let admin_addr = app.handle.admin_addr().unwrap();
    let mut oncall = AdminServiceClient::new(tls_channel(
        admin_addr,
        &server_ca.pem(),
        Some(&client_ca.client("spiffe://corp/ns/ops/sa/oncall")),
    ));
    let orders_identity = "spiffe://corp/ns/shop/sa/orders";
    let created = oncall
        .create_service_account(CreateServiceAccountRequest {
            name: "orders".into(),
            audiences: vec!["billing".into()],
            mtls_identities: vec![orders_identity.into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(created.client_secret.is_empty(), "no secret was asked for");
    let account = created.account.unwrap();
    let as_identity = |uri: &str| {
        AuthServiceClient::new(tls_channel(
            app.addr,
            &server_ca.pem(),
            Some(&client_ca.client(uri)),
        ))
    };
    let mut orders = as_identity(orders_identity);
    let granted = orders
        .issue_service_token(IssueServiceTokenRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(granted.audiences, ["billing"]);
    let valid = orders
        .validate_token(ValidateTokenRequest {
            access_token: granted.access_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(valid.service);
    assert_eq!(valid.client_id, "orders");
    assert_eq!(valid.user_id, account.id);

    let mut stranger = as_identity("spiffe://corp/ns/shop/sa/stock");
    let refused = stranger
        .issue_service_token(IssueServiceTokenRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

    // The identity removed from the account: refused, and its token too.
    oncall
        .remove_service_credential(RemoveServiceCredentialRequest {
            account: Some(ServiceAccountSelector {
                selector: Some(Selector::Name("orders".into())),
            }),
            credential_id: account.credentials[0].id.clone(),
        })
        .await
        .unwrap();
    let refused = orders
        .issue_service_token(IssueServiceTokenRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    let refused = orders
        .validate_token(ValidateTokenRequest {
            access_token: granted.access_token,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    app.stop().await;
}
