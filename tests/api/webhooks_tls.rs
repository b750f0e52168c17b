//! Webhooks to HTTPS endpoints through the real server, on both backends: loopback
//! endpoints served here over TLS with certificates of a CA made here (rcgen), which
//! authd trusts through AUTHD_WEBHOOK_CA. An endpoint of that CA receives the
//! events, signed; one whose certificate chains elsewhere or names another host
//! receives nothing, its refused handshakes counted as failed deliveries and
//! retried, while a plain endpoint beside it gets every event in order; once it
//! presents a good certificate, it gets every event it missed. A CA file that
//! cannot be read or holds no certificate stops the start, naming the file only.

use crate::{
    cli::refused_start,
    helpers::{Backend, TestApp, TestDb, metric, spawn_app_on, test_config, wait_for, wait_until},
    tls::{Ca, Pair},
    webhooks::{Endpoint, Received, position, secret, verify, verify_in_python, webhooks},
};
use authd::app::Application;
use rcgen::{CertificateParams, ExtendedKeyUsagePurpose};
use std::path::Path;

crate::backend_tests!(
    an_https_endpoint_of_the_configured_ca_receives_the_events_signed,
    an_endpoint_whose_certificate_is_refused_receives_nothing_and_holds_up_no_other,
);

/// A server certificate of `ca` for `name` only (no IP address).
fn certificate_for(ca: &Ca, name: &str) -> Pair {
    let mut params = CertificateParams::new(vec![name.to_owned()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    ca.sign(params)
}

/// `ca`'s certificate in a PEM file of its own.
fn ca_file(ca: &Ca) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), ca.pem()).unwrap();
    file
}

/// authd delivering to `endpoints`, trusting the CAs of `ca_file`.
async fn app(db: &TestDb, endpoints: Vec<String>, ca_file: &Path) -> TestApp {
    let ca_file = ca_file.to_owned();
    spawn_app_on(db, move |c| {
        webhooks(endpoints)(c);
        c.events.webhook_ca = Some(ca_file);
    })
    .await
}

async fn register(app: &mut TestApp, prefix: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for i in 0..n {
        let id = app
            .register(&format!("{prefix}{i}"), "a fine password")
            .await
            .unwrap();
        ids.push(id);
    }
    ids
}

/// The users of `delivered`, which must be in position order and signed.
fn users_in_order(delivered: &[Received]) -> Vec<String> {
    let positions: Vec<u64> = delivered.iter().map(position).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    (delivered.iter())
        .map(|r| {
            verify(r);
            let body: serde_json::Value = serde_json::from_str(&r.body).unwrap();
            assert_eq!(body["type"], "user.registered");
            body["user_id"].as_str().unwrap().to_owned()
        })
        .collect()
}

fn deliveries(app: &TestApp, outcome: &str) -> f64 {
    let series = format!("authd_webhook_deliveries_total{{outcome=\"{outcome}\"}}");
    metric(&app.handle.render_metrics(), &series).unwrap_or(0.0)
}

/// Waits until `n` deliveries came to `outcome` (an endpoint sees a request before
/// authd counts its answer), and checks there are no more.
async fn counted(app: &TestApp, outcome: &str, n: f64) {
    wait_for(&format!("{n} deliveries {outcome}"), || {
        std::future::ready((deliveries(app, outcome) >= n).then_some(()))
    })
    .await;
    assert_eq!(deliveries(app, outcome), n, "{outcome}");
}

async fn an_https_endpoint_of_the_configured_ca_receives_the_events_signed(db: TestDb) {
    let ca = Ca::new("internal webhook CA");
    let ca_file = ca_file(&ca);
    let endpoint = Endpoint::start_tls(0, &ca.server(2040)).await;
    assert!(endpoint.url().starts_with("https://127.0.0.1:"));
    let mut app = app(&db, vec![endpoint.url()], ca_file.path()).await;
    let ids = register(&mut app, "secure", 3).await;
    wait_until("three deliveries over TLS", || {
        endpoint.delivered().len() == 3
    })
    .await;
    let delivered = endpoint.delivered();
    assert_eq!(users_in_order(&delivered), ids);
    assert_eq!(endpoint.received().len(), 3, "each accepted at once");
    assert_eq!(endpoint.refused(), 0);
    counted(&app, "delivered", 3.0).await;
    assert_eq!(deliveries(&app, "failed"), 0.0);
    app.stop().await.unwrap();
    verify_in_python(
        "an_https_endpoint_of_the_configured_ca_receives_the_events_signed",
        &delivered,
    );
}

async fn an_endpoint_whose_certificate_is_refused_receives_nothing_and_holds_up_no_other(
    db: TestDb,
) {
    let ca = Ca::new("internal webhook CA");
    let ca_file = ca_file(&ca);
    // A certificate of another CA (one the Mozilla roots do not have either).
    let stranger = Endpoint::start_tls(0, &Ca::new("another CA").server(2040)).await;
    // A certificate of the trusted CA, for another host than the URL's.
    let misnamed = Endpoint::start_tls(0, &certificate_for(&ca, "other.example")).await;
    let plain = Endpoint::start(0).await;
    let urls = vec![stranger.url(), misnamed.url(), plain.url()];
    let mut app = app(&db, urls, ca_file.path()).await;
    let ids = register(&mut app, "refused", 3).await;

    wait_until("the plain endpoint has all three", || {
        plain.delivered().len() == 3
    })
    .await;
    assert_eq!(users_in_order(&plain.delivered()), ids);
    // Each refused endpoint is retried: several handshakes, each refused by authd,
    // each a failed delivery.
    wait_until("three refused handshakes at each", || {
        stranger.refused() >= 3 && misnamed.refused() >= 3
    })
    .await;
    wait_for("six failed deliveries", || {
        std::future::ready((deliveries(&app, "failed") >= 6.0).then_some(()))
    })
    .await;
    assert!(stranger.received().is_empty() && misnamed.received().is_empty());
    // The plain endpoint's.
    counted(&app, "delivered", 3.0).await;

    // The other CA's endpoint is given a certificate of the trusted one: its next
    // retry delivers every event it missed, from the first, in order.
    stranger.present(&ca.server(2040));
    let more = register(&mut app, "later", 1).await;
    let everyone: Vec<String> = ids.iter().chain(&more).cloned().collect();
    wait_until("four deliveries at each", || {
        stranger.delivered().len() == 4 && plain.delivered().len() == 4
    })
    .await;
    assert_eq!(users_in_order(&stranger.delivered()), everyone);
    assert_eq!(users_in_order(&plain.delivered()), everyone);
    assert_eq!(stranger.received().len(), 4, "nothing twice");
    assert!(misnamed.received().is_empty());
    counted(&app, "delivered", 8.0).await;
    app.stop().await.unwrap();
}

#[tokio::test]
async fn a_webhook_ca_that_cannot_be_read_or_holds_no_certificate_stops_the_start() {
    const OPTION: &str = "--webhook-ca (AUTHD_WEBHOOK_CA)";
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap().serialize_pem();
    let cases = [
        ("missing.pem", None, "cannot read the file"),
        (
            "words.pem",
            Some("an internal CA's secret words\n".to_owned()),
            "no PEM certificate in the file",
        ),
        (
            "key.pem",
            Some(key.clone()),
            "no PEM certificate in the file",
        ),
        (
            "broken.pem",
            Some("-----BEGIN CERTIFICATE-----\nsecret words\n".to_owned()),
            "not a valid PEM file",
        ),
        (
            "not-der.pem",
            Some(
                "-----BEGIN CERTIFICATE-----\nc2VjcmV0IHdvcmRz\n-----END CERTIFICATE-----\n"
                    .to_owned(),
            ),
            "a certificate of the file is not a valid X.509 certificate",
        ),
    ];
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    for (name, content, why) in cases {
        let path = dir.path().join(name);
        if let Some(content) = content {
            std::fs::write(&path, content).unwrap();
        }
        let mut config = test_config(db.url.clone());
        webhooks(vec!["https://127.0.0.1:9/hook".into()])(&mut config);
        config.events.webhook_ca = Some(path.clone());
        let err = match Application::build(config).await {
            Ok(_) => panic!("{name}: the start went on"),
            Err(e) => format!("{e:#}"),
        };
        let expected = format!("{OPTION} {}: {why}", path.display());
        assert!(err.starts_with(&expected), "{name}: {err}");
        assert!(!err.contains('\n'), "{err}");
        for content in ["secret words", "c2VjcmV0IHdvcmRz", "PRIVATE KEY"] {
            assert!(!err.contains(content), "{name}: {err}");
        }
    }

    // The binary, through the environment: one line naming the file, exit 1.
    let path = dir.path().join("key.pem");
    let out = crate::helpers::authd_command()
        .env("AUTHD_LISTEN", "127.0.0.1:0")
        .env("AUTHD_METRICS_LISTEN", "")
        .env(
            "AUTHD_DATABASE_URL",
            format!("sqlite://{}", dir.path().join("a.db").display()),
        )
        .env("AUTHD_WEBHOOKS", "https://127.0.0.1:9/hook")
        .env("AUTHD_WEBHOOK_SECRET", secret())
        .env("AUTHD_WEBHOOK_CA", &path)
        .output()
        .unwrap();
    let (stderr, last) = refused_start(out);
    assert_eq!(
        last,
        format!(
            "authd: error: {OPTION} {}: no PEM certificate in the file",
            path.display()
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("PRIVATE KEY"), "{stderr}");
    assert!(
        !dir.path().join("a.db").exists(),
        "refused before the store"
    );
}
