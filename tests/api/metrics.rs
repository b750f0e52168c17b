//! Observability from outside: `GET /metrics` after a known sequence of calls (exact
//! counts, parsed as the Prometheus text format), the request id round trip, and
//! the log line of a login (its user, and no secret).

use crate::{
    backend_tests,
    cli::spawn_authd,
    helpers::{
        TEST_KEY, TEST_KID, TestDb, expect_code, http_get, key_spec, login, register, spawn_app,
        spawn_app_on, spawn_app_with,
    },
};
use authd::{
    config::{DatabaseUrl, MetricsListen},
    pb::{LoginRequest, RegisterRequest, ValidateTokenRequest},
};
use prometheus_parse::{Scrape, Value};
use std::{
    net::SocketAddr,
    time::{SystemTime, UNIX_EPOCH},
};
use tonic::{Code, Request, metadata::MetadataMap};

backend_tests!(a_known_sequence_of_calls_gives_exact_counts);

/// The 17 gRPC status codes, as the `code` label spells them: written out here
/// rather than taken from the server's own list, so that a wrong spelling there fails.
const CODES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// Every (service, method) authd serves: the AuthService methods from the proto's
/// descriptor (so a new RPC is covered without touching this test), health, reflection.
fn served_methods() -> Vec<(String, String)> {
    use prost::Message as _;
    let set = prost_types::FileDescriptorSet::decode(authd::pb::FILE_DESCRIPTOR_SET).unwrap();
    let mut methods: Vec<(String, String)> = set
        .file
        .iter()
        .flat_map(|f| {
            f.service.iter().flat_map(move |s| {
                let service = format!("{}.{}", f.package(), s.name());
                s.method
                    .iter()
                    .map(move |m| (service.clone(), m.name().to_owned()))
            })
        })
        .collect();
    assert!(methods.iter().any(|(_, m)| m == "Login"), "{methods:?}");
    for (service, method) in [
        ("envoy.service.auth.v3.Authorization", "Check"),
        ("grpc.health.v1.Health", "Check"),
        ("grpc.health.v1.Health", "Watch"),
        (
            "grpc.reflection.v1.ServerReflection",
            "ServerReflectionInfo",
        ),
        (
            "grpc.reflection.v1alpha.ServerReflection",
            "ServerReflectionInfo",
        ),
        // Envoy's rate limit service (served when a rules file is configured).
        (
            "envoy.service.ratelimit.v3.RateLimitService",
            "ShouldRateLimit",
        ),
        ("unknown", "unknown"),
    ] {
        methods.push((service.into(), method.into()));
    }
    methods
}

#[tokio::test]
async fn a_fresh_server_exports_every_request_series_at_zero() {
    let app = spawn_app().await;
    let m = scrape(app.handle.metrics_addr().unwrap()).await;
    let methods = served_methods();
    for (service, method) in &methods {
        for code in CODES {
            let labels = [
                ("service", service.as_str()),
                ("method", method.as_str()),
                ("code", code),
                GRPC,
            ];
            assert_eq!(m.value("authd_grpc_requests_total", &labels), 0.0);
            assert_eq!(
                m.histogram_count("authd_grpc_request_duration_seconds", &labels),
                0.0
            );
        }
    }
    // gRPC's: the series of calls translated from gRPC-Web and JSON come with their
    // first request.
    assert_eq!(
        m.matching("authd_grpc_requests_total", &[]).count(),
        methods.len() * CODES.len(),
        "no other request series"
    );
    // The lowest latency bucket is 50 µs: a token validation takes about 100 µs.
    let Value::Histogram(buckets) = &m
        .matching(
            "authd_grpc_request_duration_seconds",
            &[AUTH, ("method", "ValidateToken"), ("code", "OK"), GRPC],
        )
        .next()
        .unwrap()
        .value
    else {
        panic!("not a histogram");
    };
    assert_eq!(buckets[0].less_than, 0.00005);
    for series in [
        "authd_trace_spans_dropped_total",
        "authd_trace_export_paused",
        "authd_trace_requests_untraced_total",
    ] {
        assert_eq!(m.value(series, &[]), 0.0, "{series}");
    }
    // The rate-limit tier's request counts exist too, before any rule is configured.
    for outcome in ["admitted", "refused", "unavailable"] {
        assert_eq!(
            m.value("authd_ratelimit_requests_total", &[("outcome", outcome)]),
            0.0
        );
    }
    app.stop().await.unwrap();
}

/// Scrapes `/metrics` and parses it, checking the status and the content type first.
async fn scrape(addr: SocketAddr) -> Metrics {
    let (head, body) = http_get(addr, "/metrics", "").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let scrape = Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("the text format");
    assert!(!scrape.samples.is_empty(), "{body}");
    Metrics { scrape, text: body }
}

struct Metrics {
    scrape: Scrape,
    text: String,
}

impl Metrics {
    /// The samples of `name` whose labels include `labels`.
    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a prometheus_parse::Sample> {
        self.scrape.samples.iter().filter(move |s| {
            s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v))
        })
    }

    /// The value of the one counter, gauge or untyped sample of `name` with `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<_> = self.matching(name, labels).collect();
        assert_eq!(
            found.len(),
            1,
            "{name} {labels:?}: {found:?}\n{}",
            self.text
        );
        match found[0].value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
            ref other => panic!("{name} is not a single value: {other:?}"),
        }
    }

    /// The sum of every counter of `name` whose labels include `labels`.
    fn total(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels)
            .map(|s| match s.value {
                Value::Counter(v) => v,
                ref other => panic!("{name} is not a counter: {other:?}"),
            })
            .sum()
    }

    /// The count of the histogram `name` with `labels` (its `+Inf` bucket), checked
    /// against its `_count` line and its buckets' order.
    fn histogram_count(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<_> = self.matching(name, labels).collect();
        assert_eq!(
            found.len(),
            1,
            "{name} {labels:?}: {found:?}\n{}",
            self.text
        );
        let Value::Histogram(buckets) = &found[0].value else {
            panic!("{name} is not a histogram");
        };
        assert!(
            buckets.windows(2).all(|w| w[0].count <= w[1].count),
            "{name}: buckets are cumulative"
        );
        let inf = buckets.last().expect("buckets");
        assert!(inf.less_than.is_infinite(), "{name}: ends with +Inf");
        assert_eq!(
            self.value(&format!("{name}_count"), labels),
            inf.count,
            "{name}_count"
        );
        inf.count
    }
}

/// A token authd accepts, made by an independent JWT library with the test key.
fn token_for(user_id: &str, username: &str) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = serde_json::json!({
        "sub": user_id, "name": username, "iat": now, "exp": now + 600, "iss": "authd",
    });
    let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
    header.kid = Some(TEST_KID.into());
    jsonwebtoken::encode(
        &header,
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(TEST_KEY),
    )
    .unwrap()
}

const AUTH: (&str, &str) = ("service", "auth.v1.AuthService");
/// The protocol label of a request made over gRPC itself.
const GRPC: (&str, &str) = ("protocol", "grpc");

async fn a_known_sequence_of_calls_gives_exact_counts(db: TestDb) {
    let backend = match db.url {
        DatabaseUrl::Sqlite(_) => "sqlite",
        DatabaseUrl::Postgres(_) => "postgres",
    };
    let mut app = spawn_app_on(&db, |_| {}).await;
    let alice = app.register("alice", "correct horse").await.unwrap();
    app.register("bob", "battery staple").await.unwrap();
    expect_code(
        app.login("alice", "not her password").await,
        Code::Unauthenticated,
    );
    app.validate(&token_for(&alice, "alice")).await.unwrap();

    let m = scrape(app.handle.metrics_addr().expect("metrics are on")).await;

    // Requests by method and code: exactly these, and nothing else.
    let requests = "authd_grpc_requests_total";
    let durations = "authd_grpc_request_duration_seconds";
    for (method, code, n) in [
        ("Register", "OK", 2.0),
        ("Login", "UNAUTHENTICATED", 1.0),
        ("ValidateToken", "OK", 1.0),
    ] {
        let labels = [AUTH, ("method", method), ("code", code), GRPC];
        assert_eq!(m.value(requests, &labels), n, "{method} {code}");
        // The latency histogram counts the same requests.
        assert_eq!(m.histogram_count(durations, &labels), n, "{method} {code}");
    }
    assert_eq!(m.total(requests, &[]), 4.0, "only these four requests");
    assert_eq!(m.value("authd_grpc_requests_in_flight", &[]), 0.0);

    // Hashing: two hashes and one verification, each queued once; nothing refused.
    assert_eq!(m.histogram_count("authd_hash_duration_seconds", &[]), 3.0);
    assert_eq!(m.histogram_count("authd_hash_queue_wait_seconds", &[]), 3.0);
    assert_eq!(m.value("authd_hash_queue_depth", &[]), 0.0);
    assert_eq!(m.value("authd_hash_running", &[]), 0.0);
    assert_eq!(m.total("authd_hash_refused_total", &[]), 0.0);
    assert_eq!(m.total("authd_hash_dropped_total", &[]), 0.0);

    // The store: every register and the login look the name up (a registration
    // only to know the database answers: the insert decides); two inserts.
    let store = ("backend", backend);
    let op = "authd_store_operation_duration_seconds";
    assert_eq!(
        m.histogram_count(op, &[store, ("operation", "find_user")]),
        3.0
    );
    assert_eq!(
        m.histogram_count(op, &[store, ("operation", "insert_user")]),
        2.0
    );
    assert_eq!(m.total("authd_store_errors_total", &[]), 0.0);
    // Connections come from a pool: PostgreSQL for everything, SQLite for reads (the
    // health checker's pings take some too).
    let pooled = if backend == "postgres" { 5.0 } else { 3.0 };
    let acquired = m.histogram_count("authd_store_pool_acquire_duration_seconds", &[store]);
    assert!(acquired >= pooled, "{acquired} connections acquired");
    assert!(m.value("authd_store_pool_max_connections", &[store]) >= 1.0);
    m.value(
        "authd_store_pool_connections",
        &[store, ("state", "in_use")],
    );
    m.value("authd_store_pool_connections", &[store, ("state", "idle")]);
    if backend == "sqlite" {
        // Both registrations committed, in one or two transactions.
        let batches = m.histogram_count("authd_sqlite_batch_size", &[]);
        assert!((1.0..=2.0).contains(&batches), "{batches} batches");
        assert_eq!(m.value("authd_sqlite_batch_size_sum", &[]), 2.0);
        assert_eq!(
            m.histogram_count("authd_sqlite_commit_duration_seconds", &[]),
            batches
        );
    }

    // Tokens: none issued (the one login failed), one checked and valid.
    assert_eq!(m.value("authd_tokens_issued_total", &[]), 0.0);
    assert_eq!(m.total("authd_tokens_validated_total", &[]), 1.0);
    assert_eq!(
        m.value("authd_tokens_validated_total", &[("outcome", "ok")]),
        1.0
    );

    // No rate limits configured: no decisions, no fallback.
    assert_eq!(m.total("authd_ratelimit_decisions_total", &[]), 0.0);
    assert_eq!(m.value("authd_ratelimit_fallback_active", &[]), 0.0);

    // The process, read from /proc.
    if cfg!(target_os = "linux") {
        assert!(m.value("process_resident_memory_bytes", &[]) > 0.0);
        assert!(m.value("process_open_fds", &[]) > 0.0);
        m.value("process_cpu_seconds_total", &[]);
    }

    // Every family has its help text.
    for sample in &m.scrape.samples {
        let family = ["_count", "_sum"]
            .iter()
            .find_map(|suffix| {
                let base = sample.metric.strip_suffix(suffix)?;
                m.scrape.docs.contains_key(base).then_some(base)
            })
            .unwrap_or(&sample.metric);
        let help = m.scrape.docs.get(family);
        assert!(
            help.is_some_and(|h| !h.is_empty()),
            "{} has no help",
            sample.metric
        );
    }
    app.stop().await.unwrap();
}

#[tokio::test]
async fn rate_limit_decisions_and_refusals_are_counted() {
    let mut app = spawn_app_with(|c| {
        c.limits.rate_limits = Some("Login:global=1/1m,*:peer=100/1m".parse().unwrap());
    })
    .await;
    expect_code(
        app.login("nobody", "whatever it is").await,
        Code::Unauthenticated,
    );
    expect_code(
        app.login("nobody", "whatever it is").await,
        Code::ResourceExhausted,
    );
    let m = scrape(app.handle.metrics_addr().unwrap()).await;
    let login = [AUTH, ("method", "Login")];
    assert_eq!(
        m.value(
            "authd_grpc_requests_total",
            &[login[0], login[1], ("code", "RESOURCE_EXHAUSTED"), GRPC]
        ),
        1.0
    );
    // The rules contain `=`, which the parser crate does not read in label values:
    // compare those lines as text.
    for line in [
        r#"authd_ratelimit_decisions_total{outcome="allowed",rule="Login:global=1/1m"} 1"#,
        r#"authd_ratelimit_decisions_total{outcome="refused",rule="Login:global=1/1m"} 1"#,
        // The second request was refused by the Login rule; the peer rule had room.
        r#"authd_ratelimit_decisions_total{outcome="allowed",rule="*:peer=100/1m"} 2"#,
        r#"authd_ratelimit_decisions_total{outcome="refused",rule="*:peer=100/1m"} 0"#,
        // By request: one admitted, one refused, by the Login rule only.
        r#"authd_ratelimit_refusals_total{rule="Login:global=1/1m"} 1"#,
        r#"authd_ratelimit_refusals_total{rule="*:peer=100/1m"} 0"#,
    ] {
        assert!(m.text.contains(line), "{line} missing in:\n{}", m.text);
    }
    for (outcome, n) in [("admitted", 1.0), ("refused", 1.0), ("unavailable", 0.0)] {
        assert_eq!(
            m.value("authd_ratelimit_requests_total", &[("outcome", outcome)]),
            n,
            "{outcome}"
        );
    }
    assert_eq!(m.value("authd_ratelimit_fallback_active", &[]), 0.0);
    // The refused login never reached the hash pool.
    assert_eq!(m.histogram_count("authd_hash_duration_seconds", &[]), 1.0);
    app.stop().await.unwrap();
}

fn request_id(metadata: &MetadataMap) -> &str {
    metadata
        .get("x-request-id")
        .expect("the response carries x-request-id")
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn the_request_id_round_trips() {
    let mut app = spawn_app().await;
    // A client's id comes back, on a success and on an error.
    let mut request = Request::new(RegisterRequest {
        username: "carol".into(),
        password: "a good password".into(),
    });
    request
        .metadata_mut()
        .insert("x-request-id", "client-id-1".parse().unwrap());
    let response = app.client.register(request).await.unwrap();
    assert_eq!(request_id(response.metadata()), "client-id-1");
    let mut request = Request::new(LoginRequest {
        username: "carol".into(),
        password: "not the password".into(),
    });
    request
        .metadata_mut()
        .insert("x-request-id", "client-id-2".parse().unwrap());
    let status = app.client.login(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    assert_eq!(request_id(status.metadata()), "client-id-2");

    // Without one, each request gets a new UUIDv7.
    let mut made = Vec::new();
    for _ in 0..2 {
        let status = app
            .client
            .validate_token(ValidateTokenRequest {
                access_token: "not.a.token".into(),
                ..Default::default()
            })
            .await
            .unwrap_err();
        let id = uuid::Uuid::parse_str(request_id(status.metadata())).expect("a UUID");
        assert_eq!(id.get_version_num(), 7);
        made.push(id);
    }
    assert_ne!(made[0], made[1]);
    // Health too.
    let response = app
        .health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .unwrap();
    uuid::Uuid::parse_str(request_id(response.metadata())).unwrap();
    app.stop().await.unwrap();
}

#[tokio::test]
async fn only_get_metrics_is_served_and_an_empty_address_turns_it_off() {
    let app = spawn_app().await;
    let (head, _) = http_get(app.handle.metrics_addr().unwrap(), "/other", "").await;
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    app.stop().await.unwrap();

    let app =
        spawn_app_with(|c| c.telemetry.metrics_listen = "".parse::<MetricsListen>().unwrap()).await;
    assert_eq!(app.handle.metrics_addr(), None);
    app.stop().await.unwrap();
}

/// Stops `running`, which must exit cleanly, and returns its log: each line's JSON
/// event, and the lines.
async fn stopped(running: crate::cli::Running) -> (Vec<serde_json::Value>, Vec<String>) {
    let (status, log) = running.terminate().await;
    assert!(status.success());
    let events = (log.iter())
        .map(|l| serde_json::from_str(l).expect("JSON lines"))
        .collect();
    (events, log)
}

#[tokio::test]
async fn a_login_is_logged_once_with_its_user_and_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let key = key_spec(TEST_KID, TEST_KEY);
    let running = spawn_authd(dir.path(), &[("AUTHD_TOKEN_KEYS", key.clone())]);
    let mut client = running.client().await;
    let password = "n0t-f0r-the-l0gs";
    let wrong = "n0r-th1s-0ne-either";
    let user_id = register(&mut client, "dave", password).await.unwrap();
    let mut request = Request::new(LoginRequest {
        username: "dave".into(),
        password: password.into(),
    });
    request
        .metadata_mut()
        .insert("x-request-id", "login-of-dave".parse().unwrap());
    let token = client
        .login(request)
        .await
        .unwrap()
        .into_inner()
        .access_token;
    expect_code(
        login(&mut client, "dave", wrong).await,
        Code::Unauthenticated,
    );

    // The binary's own endpoint counts this process's requests.
    let m = scrape(running.metrics_addr.parse().unwrap()).await;
    for (code, n) in [("OK", 1.0), ("UNAUTHENTICATED", 1.0)] {
        let labels = [AUTH, ("method", "Login"), ("code", code), GRPC];
        assert_eq!(m.value("authd_grpc_requests_total", &labels), n);
    }
    assert_eq!(m.value("authd_tokens_issued_total", &[]), 1.0);

    let (events, log) = stopped(running).await;
    let logins: Vec<_> = events
        .iter()
        .filter(|e| e["message"] == "request" && e["method"] == "Login")
        .collect();
    assert_eq!(logins.len(), 2, "one line per login: {logins:?}");
    let ok = logins.iter().find(|e| e["code"] == "OK").unwrap();
    assert_eq!(ok["level"], "INFO");
    assert_eq!(ok["service"], "auth.v1.AuthService");
    assert_eq!(ok["request_id"], "login-of-dave");
    assert_eq!(ok["user_id"], user_id.as_str());
    assert!(
        ok["peer"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{ok}"
    );
    assert!(ok["latency_ms"].as_f64().unwrap() > 0.0, "{ok}");
    let failed = logins
        .iter()
        .find(|e| e["code"] == "UNAUTHENTICATED")
        .unwrap();
    assert!(failed.get("user_id").is_none(), "{failed}");
    uuid::Uuid::parse_str(failed["request_id"].as_str().unwrap()).unwrap();
    let register = events
        .iter()
        .find(|e| e["message"] == "request" && e["method"] == "Register")
        .expect("the registration is logged too");
    assert_eq!(register["user_id"], user_id.as_str());

    let all = log.join("\n");
    for secret in [password, wrong, token.as_str(), &key[TEST_KID.len() + 1..]] {
        assert!(!all.contains(secret), "a secret was logged:\n{all}");
    }
}

#[tokio::test]
async fn refusals_past_the_log_budget_are_summarised_and_none_goes_uncounted() {
    let dir = tempfile::tempdir().unwrap();
    let running = spawn_authd(
        dir.path(),
        &[
            ("AUTHD_REGISTER_LIMIT", "2/1m".into()),
            ("AUTHD_REFUSAL_HOLD", "0s".into()),
            ("AUTHD_LOG_REFUSALS", "3".into()),
        ],
    );
    let client = running.client().await;
    // Forty registrations at once, on one connection: two within the limit.
    let calls = (0..40).map(|i| {
        let mut client = client.clone();
        async move { register(&mut client, &format!("crowd-{i}"), "correct horse").await }
    });
    let results = futures::future::join_all(calls).await;
    let refused = results
        .iter()
        .filter(|r| matches!(r, Err(s) if s.code() == Code::ResourceExhausted))
        .count();
    assert_eq!((results.len() - refused, refused), (2, 38));
    let mut client = client.clone();
    expect_code(
        login(&mut client, "crowd-nobody", "wrong").await,
        Code::Unauthenticated,
    );

    let m = scrape(running.metrics_addr.parse().unwrap()).await;
    let labels = [
        AUTH,
        ("method", "Register"),
        ("code", "RESOURCE_EXHAUSTED"),
        GRPC,
    ];
    assert_eq!(m.value("authd_grpc_requests_total", &labels), 38.0);
    let (events, log) = stopped(running).await;
    let lines = |code: &str| {
        (events.iter())
            .filter(|e| e["message"] == "request" && e["code"] == code)
            .count()
    };
    // The budget's refusals one by one, every other answer one by one, and the rest
    // in the summaries, the last one written as the server stopped.
    let logged = lines("RESOURCE_EXHAUSTED");
    let summaries: Vec<_> = (events.iter())
        .filter(|e| e["message"] == "refusals not logged one by one")
        .collect();
    let unlogged: u64 = summaries
        .iter()
        .map(|e| e["unlogged"].as_u64().unwrap())
        .sum();
    assert!(logged >= 3, "{log:?}");
    assert!(unlogged > 0, "{log:?}");
    assert_eq!(logged as u64 + unlogged, 38, "{log:?}");
    for summary in &summaries {
        assert_eq!(summary["target"], "authd::trace", "{summary}");
        assert_eq!(summary["code"], "RESOURCE_EXHAUSTED", "{summary}");
        let n = summary["unlogged"].as_u64().unwrap();
        assert_eq!(summary["methods"], format!("Register {n}"), "{summary}");
    }
    assert_eq!((lines("OK"), lines("UNAUTHENTICATED")), (2, 1));
    let request_line = events.iter().find(|e| e["message"] == "request").unwrap();
    assert_eq!(request_line["target"], "authd::trace", "{request_line}");
}
