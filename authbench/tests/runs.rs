//! authbench's runner against a real authd: every scenario and load shape accounts
//! for every request it sends, and a server that refuses shows up as
//! RESOURCE_EXHAUSTED in the report. Counts only; no timing is asserted.

mod server;

use authbench::{self as bench, Load, Operation, Plan, Report, Scenario, Stop};
use server::{TestApp, spawn_app, spawn_app_with};
use std::time::Duration;
use tonic::Code;

fn plan(app: &TestApp, scenario: Scenario, load: Load, stop: Stop) -> Plan {
    let mut plan = Plan::new(format!("http://{}", app.addr), scenario, load, stop);
    // A small pool keeps the setup short.
    plan.users = 5;
    plan
}

/// Each measured request ended exactly once: with a status code or a client error.
#[track_caller]
fn assert_accounted(report: &Report, sent: u64) {
    assert_eq!(report.requests, sent, "{}", report.to_text());
    assert_eq!(
        report.codes.total() + report.client_errors.total(),
        sent,
        "{}",
        report.to_text()
    );
}

/// Every one of `sent` measured requests was answered OK.
#[track_caller]
fn assert_all_ok(report: &Report, sent: u64) {
    assert_accounted(report, sent);
    assert_eq!(report.codes.get(Code::Ok), sent, "{}", report.to_text());
}

#[tokio::test]
async fn every_scenario_accounts_for_every_request() {
    let app = spawn_app().await;
    for scenario in [
        Scenario::Health,
        Scenario::Register,
        Scenario::Login,
        Scenario::Validate,
        Scenario::Refresh,
        Scenario::Check,
        Scenario::Mixed,
    ] {
        let plan = plan(
            &app,
            scenario,
            Load::Closed { concurrency: 4 },
            Stop::Requests(40),
        );
        let report = bench::run(&plan).await.expect("the run completes");
        assert_accounted(&report, 40);
        assert_eq!(
            report.codes.get(Code::Ok),
            40,
            "{scenario}: {}",
            report.to_text()
        );
        assert_eq!(report.success_rate, Some(1.0));
        assert!(report.latency_ms.is_some() && report.ok_latency_ms.is_some());
    }
}

#[tokio::test]
async fn a_mix_reports_each_operation() {
    let app = spawn_app().await;
    let mut plan = plan(
        &app,
        Scenario::Mixed,
        Load::Closed { concurrency: 3 },
        Stop::Requests(50),
    );
    plan.mix = "login=2,register=1,validate=1,health=1,refresh=1"
        .parse()
        .unwrap();
    let report = bench::run(&plan).await.expect("the run completes");
    assert_accounted(&report, 50);
    let ops: Vec<Operation> = report.operations.iter().map(|(op, _)| *op).collect();
    assert_eq!(
        ops,
        [
            Operation::Health,
            Operation::Register,
            Operation::Login,
            Operation::Validate,
            Operation::Refresh
        ]
    );
    let per_op: u64 = report.operations.iter().map(|(_, r)| r.requests).sum();
    assert_eq!(per_op, 50);
    // Each worker walks the 6-long wheel, so every operation gets a share.
    assert!(report.operations.iter().all(|(_, r)| r.requests > 0));
}

#[tokio::test]
async fn an_open_loop_sends_its_schedule_and_leaves_out_the_warmup() {
    let app = spawn_app().await;
    let mut plan = plan(
        &app,
        Scenario::Login,
        Load::Open { rate: 200.0 },
        Stop::Requests(30),
    );
    plan.warmup = Duration::from_millis(50);
    let report = bench::run(&plan).await.expect("the run completes");
    assert_accounted(&report, 30);
    // The schedule sends at 0, 5, …, 45 ms during a 50 ms warm-up: 10 requests.
    assert_eq!(report.warmup_requests, 10);
    assert_eq!(report.codes.get(Code::Ok), 30, "{}", report.to_text());
    // Each measured send's lateness is in the report, and is part of its latency.
    let late = report
        .send_late_ms
        .expect("an open loop reports its lateness");
    let latency = report.latency_ms.expect("30 requests measured");
    assert!(
        late.min <= late.max && late.max <= latency.max,
        "{late:?} {latency:?}"
    );
}

#[tokio::test]
async fn a_run_bounded_by_time_accounts_for_what_it_sent() {
    let app = spawn_app().await;
    let mut plan = plan(
        &app,
        Scenario::Health,
        Load::Closed { concurrency: 2 },
        Stop::Duration(Duration::from_millis(200)),
    );
    plan.warmup = Duration::from_millis(50);
    let report = bench::run(&plan).await.expect("the run completes");
    assert!(report.requests > 0, "{}", report.to_text());
    assert_accounted(&report, report.requests);
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["codes"]["OK"].as_u64(), Some(report.requests));
}

#[tokio::test]
async fn refusals_of_a_full_server_are_counted_as_resource_exhausted() {
    // Room for one request in flight: of 20 registrations sent at once, all but one
    // are refused at once.
    let app = spawn_app_with(|c| {
        c.overload.max_in_flight = 1;
        c.passwords.pbkdf2_iterations = 200_000;
    })
    .await;
    let plan = plan(
        &app,
        Scenario::Register,
        Load::Closed { concurrency: 20 },
        Stop::Requests(60),
    );
    let report = bench::run(&plan).await.expect("the run completes");
    assert_accounted(&report, 60);
    let refused = report.codes.get(Code::ResourceExhausted);
    assert!(refused > 0, "{}", report.to_text());
    assert_eq!(
        refused + report.codes.get(Code::Ok),
        60,
        "{}",
        report.to_text()
    );
    assert!(report.share(Code::ResourceExhausted) > 0.0);
    assert_eq!(report.client_errors.total(), 0);
}

#[tokio::test]
async fn an_unreachable_target_fails_before_sending_load() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut plan = Plan::new(
        format!("http://127.0.0.1:{port}"),
        Scenario::Health,
        Load::Closed { concurrency: 1 },
        Stop::Requests(1),
    );
    plan.connect_timeout = Duration::from_secs(2);
    let err = bench::run(&plan).await.expect_err("nothing listens there");
    let message = format!("{err:#}");
    assert!(
        message.contains("cannot connect to http://127.0.0.1:"),
        "{message}"
    );
    assert!(!message.contains('\n'), "one line: {message}");
}

#[tokio::test]
async fn the_ratelimit_scenario_counts_decisions_and_over_limit_answers() {
    // 10 a minute per key; 3 keys: exactly 30 OK, the rest OVER_LIMIT
    // (RESOURCE_EXHAUSTED in the report), every request accounted for.
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.yaml");
    std::fs::write(
        &rules,
        "domain: bench\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 10}\n",
    )
    .unwrap();
    let app = spawn_app_with(|c| c.limits.rate_limit_rules_file = Some(rules.clone())).await;
    let mut plan = plan(
        &app,
        Scenario::Ratelimit,
        Load::Closed { concurrency: 4 },
        Stop::Requests(50),
    );
    plan.descriptors = "bench:client=c{n}".parse().unwrap();
    plan.keys = 3;
    let report = bench::run(&plan).await.expect("the run completes");
    assert_accounted(&report, 50);
    assert_eq!(report.codes.get(Code::Ok), 30, "{}", report.to_text());
    assert_eq!(
        report.codes.get(Code::ResourceExhausted),
        20,
        "{}",
        report.to_text()
    );
}

#[tokio::test]
async fn checks_over_forward_auth_account_for_every_request() {
    let app = spawn_app_with(|c| {
        c.authz.forward_auth_listen = "127.0.0.1:0".parse().unwrap();
    })
    .await;
    let forward_auth = app.forward_auth.expect("forward-auth is on");
    let mut plan = plan(
        &app,
        Scenario::Check,
        Load::Closed { concurrency: 3 },
        Stop::Requests(30),
    );
    plan.forward_auth = Some(format!("http://{forward_auth}"));
    let report = bench::run(&plan).await.expect("the run completes");
    assert_accounted(&report, 30);
    assert_eq!(report.codes.get(Code::Ok), 30, "{}", report.to_text());

    // Only the check scenario, in a closed loop, over plain HTTP.
    for (scenario, load, url) in [
        (
            Scenario::Validate,
            Load::Closed { concurrency: 1 },
            "http://127.0.0.1:1",
        ),
        (
            Scenario::Check,
            Load::Open { rate: 10.0 },
            "http://127.0.0.1:1",
        ),
        (
            Scenario::Check,
            Load::Closed { concurrency: 1 },
            "https://127.0.0.1:1",
        ),
    ] {
        let mut plan = Plan::new("http://127.0.0.1:1", scenario, load, Stop::Requests(1));
        plan.forward_auth = Some(url.into());
        assert!(plan.check().is_err(), "{scenario} {load:?} {url}");
    }
}

#[tokio::test]
async fn checks_as_introspections_account_for_every_request() {
    use std::io::Write as _;
    // The introspection client: the SHA-256 of its secret, in the keys file.
    const SECRET: &str = "0123456789abcdef0123456789abcdef-bench";
    let mut clients = tempfile::NamedTempFile::new().unwrap();
    writeln!(
        clients,
        "bench introspect {}",
        authd_digest_hex(SECRET.as_bytes())
    )
    .unwrap();
    let path = clients.path().to_owned();
    let app = spawn_app_with(|c| c.oidc.introspection_keys_file = Some(path)).await;
    let mut plan = plan(
        &app,
        Scenario::Check,
        Load::Closed { concurrency: 3 },
        Stop::Requests(30),
    );
    plan.introspect = Some(format!("http://{}", app.addr));
    plan.introspection_client = Some(format!("bench:{SECRET}"));
    let report = bench::run(&plan).await.expect("the run completes");
    assert_accounted(&report, 30);
    assert_eq!(report.codes.get(Code::Ok), 30, "{}", report.to_text());

    // A wrong secret: every check refused (401), none active.
    plan.introspection_client = Some("bench:a wrong secret of thirty-two bytes".into());
    let report = bench::run(&plan).await.expect("the run completes");
    assert_accounted(&report, 30);
    assert_eq!(
        report.codes.get(Code::Unauthenticated),
        30,
        "{}",
        report.to_text()
    );
    // Without the client, or with --forward-auth beside it: refused before the run.
    plan.introspection_client = None;
    assert!(plan.check().is_err());
    plan.introspection_client = Some(format!("bench:{SECRET}"));
    plan.forward_auth = Some(format!("http://{}", app.addr));
    assert!(plan.check().is_err());
}

#[tokio::test]
async fn service_account_scenarios_account_for_every_request() {
    // An admin key (the keys file holds its SHA-256).
    const KEY: &str = "0123456789abcdef0123456789abcdef-admin";
    let (app, admin, _keys) = with_admin_key("admin", KEY).await;
    for scenario in [
        Scenario::Grant,
        Scenario::Exchange,
        Scenario::ValidateService,
        Scenario::Mixed,
    ] {
        let mut plan = plan(
            &app,
            scenario,
            Load::Closed { concurrency: 4 },
            Stop::Requests(40),
        );
        plan.accounts = 3;
        plan.mix = "grant=1,exchange=1,validate=1".parse().unwrap();
        // Without the admin port or its key: refused before anything is sent.
        assert!(plan.check().unwrap_err().contains("--admin"), "{scenario}");
        plan.admin = Some(admin.clone());
        assert!(plan.check().unwrap_err().contains("AUTHBENCH_ADMIN_KEY"));
        plan.admin_key = Some(KEY.into());
        let report = bench::run(&plan).await.expect("the run completes");
        assert_all_ok(&report, 40);
        if scenario == Scenario::Mixed {
            let ops: Vec<Operation> = report.operations.iter().map(|(op, _)| *op).collect();
            assert_eq!(
                ops,
                [Operation::Validate, Operation::Grant, Operation::Exchange]
            );
        }
    }

    // Grants on the token endpoint (--protocol json): client credentials with HTTP
    // Basic, one keep-alive connection per request in flight.
    let mut json = plan(
        &app,
        Scenario::Grant,
        Load::Closed { concurrency: 4 },
        Stop::Requests(40),
    );
    json.protocol = bench::Protocol::Json;
    json.admin = Some(admin.clone());
    json.admin_key = Some(KEY.into());
    assert_all_ok(&bench::run(&json).await.expect("the run completes"), 40);

    // A wrong admin key: the setup fails, before any load, and never shows the key.
    let mut plan = plan(
        &app,
        Scenario::Grant,
        Load::Closed { concurrency: 1 },
        Stop::Requests(1),
    );
    plan.admin = Some(admin);
    plan.admin_key = Some("a wrong admin key of thirty-two bytes".into());
    let err = format!("{:#}", bench::run(&plan).await.unwrap_err());
    assert!(
        err.contains("Unauthenticated") || err.contains("UNAUTHENTICATED"),
        "{err}"
    );
    assert!(!err.contains("wrong admin key"), "{err}");
}

#[tokio::test]
async fn the_events_scenario_counts_each_event_of_the_backlog_once() {
    // A read key is enough for WatchEvents.
    const KEY: &str = "0123456789abcdef0123456789abcdef-events";
    let (app, admin, _keys) = with_admin_key("read", KEY).await;
    // The backlog: 30 registrations, an event each.
    let register = plan(
        &app,
        Scenario::Register,
        Load::Closed { concurrency: 4 },
        Stop::Requests(30),
    );
    assert_all_ok(&bench::run(&register).await.expect("the run completes"), 30);

    let watch = |stop| {
        let mut plan = plan(
            &app,
            Scenario::Events,
            Load::Closed { concurrency: 1 },
            stop,
        );
        plan.admin = Some(admin.clone());
        plan.admin_key = Some(KEY.into());
        plan
    };
    let report = bench::run(&watch(Stop::Requests(30)))
        .await
        .expect("the run completes");
    assert_all_ok(&report, 30);
    assert_eq!(report.scenario, Scenario::Events);
    assert!(
        report.to_text().contains("30 events"),
        "{}",
        report.to_text()
    );

    // Asked for more than there are: the 30 are counted, then the wait for the
    // next ends the run as a timeout, not a hang.
    let mut more = watch(Stop::Requests(40));
    more.timeout = Duration::from_millis(300);
    let report = bench::run(&more).await.expect("the run completes");
    assert_accounted(&report, 31);
    assert_eq!(report.codes.get(Code::Ok), 30, "{}", report.to_text());
    assert_eq!(report.client_errors.timeout, 1, "{}", report.to_text());

    // A wrong key: refused before anything is counted, and never shown.
    let mut wrong = watch(Stop::Requests(1));
    wrong.admin_key = Some("a wrong admin key of thirty-two bytes".into());
    let err = format!("{:#}", bench::run(&wrong).await.unwrap_err());
    assert!(err.contains("UNAUTHENTICATED"), "{err}");
    assert!(!err.contains("wrong admin key"), "{err}");
}

/// A server with its admin port on and one admin key, `key` of `role` (`admin`,
/// `read`); the admin port's URL, and the keys file, which lives as long as it is kept.
async fn with_admin_key(role: &str, key: &str) -> (TestApp, String, tempfile::NamedTempFile) {
    use std::io::Write as _;
    let mut keys = tempfile::NamedTempFile::new().unwrap();
    writeln!(keys, "bench {role} {}", authd_digest_hex(key.as_bytes())).unwrap();
    let path = keys.path().to_owned();
    let app = spawn_app_with(|c| {
        c.admin.admin_listen = "127.0.0.1:0".parse().unwrap();
        c.admin.admin_keys_file = Some(path);
    })
    .await;
    let admin = format!("http://{}", app.admin.expect("the admin port is on"));
    (app, admin, keys)
}

/// The SHA-256 of `bytes` in hex, as authd's keys files hold a secret.
fn authd_digest_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test]
async fn runs_over_tls_verify_the_server_and_account_for_every_request() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    // A CA of the test's own, and a certificate for localhost that it signs.
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = |name: &str, pem: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, pem).unwrap();
        path
    };
    let (cert, key, ca) = (
        path("cert.pem", cert.pem()),
        path("key.pem", key.serialize_pem()),
        path("ca.pem", ca.pem()),
    );
    let app = spawn_app_with(|config| {
        config.tls.tls_cert = Some(cert);
        config.tls.tls_key = Some(key);
    })
    .await;

    let tls = bench::runner::TlsOptions {
        ca: Some(ca),
        server_name: Some("localhost".into()),
        ..Default::default()
    };
    for load in [Load::Closed { concurrency: 4 }, Load::Open { rate: 500.0 }] {
        let mut plan = plan(&app, Scenario::Check, load, Stop::Requests(40));
        plan.target = format!("https://{}", app.addr);
        plan.tls = Some(tls.clone());
        plan.warmup = Duration::ZERO;
        let report = bench::run(&plan).await.expect("the run completes");
        assert_accounted(&report, 40);
        assert_eq!(report.codes.get(Code::Ok), 40, "{}", report.to_text());
    }

    // A CA that did not sign the server's certificate: no connection, no load.
    let mut plan = plan(
        &app,
        Scenario::Health,
        Load::Closed { concurrency: 1 },
        Stop::Requests(1),
    );
    plan.target = format!("https://{}", app.addr);
    plan.tls = Some(bench::runner::TlsOptions {
        ca: Some(path("other-ca.pem", {
            let mut other = CertificateParams::default();
            other.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            CertifiedIssuer::self_signed(other, KeyPair::generate().unwrap())
                .unwrap()
                .pem()
        })),
        server_name: Some("localhost".into()),
        ..Default::default()
    });
    let error = bench::run(&plan)
        .await
        .expect_err("an untrusted server is refused");
    assert!(format!("{error:#}").contains("cannot connect"), "{error:#}");
}

#[tokio::test]
async fn forwarded_registrations_count_against_each_end_users_address() {
    // authd's default limit on Register: 100 a minute per client address. With
    // x-forwarded-for honoured, 300 registrations on behalf of 1,000 addresses pass;
    // from the one address of the connection, exactly 100 do.
    let app = spawn_app_with(|c| {
        c.limits.trust_forwarded_for = true;
        // Refusals answered at once rather than held toward the deadline: the counts
        // are the same, the test shorter.
        c.overload.refusal_hold = Duration::ZERO;
    })
    .await;
    let mut forwarded = plan(
        &app,
        Scenario::Register,
        Load::Closed { concurrency: 50 },
        Stop::Requests(300),
    );
    forwarded.forwarded_for = Some(1000);
    let report = bench::run(&forwarded).await.expect("the run completes");
    assert_accounted(&report, 300);
    assert_eq!(report.codes.get(Code::Ok), 300, "{}", report.to_text());
    assert_eq!(report.forwarded_for, Some(1000));
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert_eq!(json["forwarded_for"], 1000);

    let mut plain = forwarded.clone();
    plain.forwarded_for = None;
    let report = bench::run(&plain).await.expect("the run completes");
    assert_accounted(&report, 300);
    assert_eq!(report.codes.get(Code::Ok), 100, "{}", report.to_text());
    assert_eq!(
        report.codes.get(Code::ResourceExhausted),
        200,
        "{}",
        report.to_text()
    );
    let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    assert!(json.get("forwarded_for").is_none(), "{json}");
}

#[tokio::test]
async fn authds_http_forms_account_for_every_request() {
    let app = spawn_app().await;
    for protocol in [bench::Protocol::Json, bench::Protocol::GrpcWeb] {
        for scenario in [Scenario::Register, Scenario::Login, Scenario::Validate] {
            let mut plan = plan(
                &app,
                scenario,
                Load::Closed { concurrency: 4 },
                Stop::Requests(40),
            );
            plan.protocol = protocol;
            let report = bench::run(&plan).await.expect("the run completes");
            assert_accounted(&report, 40);
            assert_eq!(
                report.codes.get(Code::Ok),
                40,
                "{protocol} {scenario}: {}",
                report.to_text()
            );
        }
    }
}

#[tokio::test]
async fn refusals_over_authds_http_forms_are_counted_as_resource_exhausted() {
    // As over gRPC: room for one request in flight, 20 registrations sent at once.
    let app = spawn_app_with(|c| {
        c.overload.max_in_flight = 1;
        c.passwords.pbkdf2_iterations = 200_000;
    })
    .await;
    for protocol in [bench::Protocol::Json, bench::Protocol::GrpcWeb] {
        let mut plan = plan(
            &app,
            Scenario::Register,
            Load::Closed { concurrency: 20 },
            Stop::Requests(60),
        );
        plan.protocol = protocol;
        let report = bench::run(&plan).await.expect("the run completes");
        assert_accounted(&report, 60);
        let refused = report.codes.get(Code::ResourceExhausted);
        assert!(refused > 0, "{protocol}: {}", report.to_text());
        assert_eq!(
            refused + report.codes.get(Code::Ok),
            60,
            "{protocol}: {}",
            report.to_text()
        );
        assert_eq!(report.client_errors.total(), 0, "{}", report.to_text());
    }
}
