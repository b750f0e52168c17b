//! authbench --protocol http against real HTTP/1.1 servers: the report's service
//! itself (`bench/report-service`, under uvicorn, when this machine's Python has
//! fastapi and uvicorn), and a small server of the tests' own that answers what the
//! report's service never does by itself (refusals, closed connections, no answer).
//! Counts only, and one lower bound (a client that backs off waits at least half the
//! hint); no speed is asserted.

mod http_server;
mod report_service;

use authbench::{self as bench, Load, Plan, Protocol, Report, Scenario, Stop};
use http_server::{HttpServer, Reply, Seen};
use std::{
    collections::HashSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};
use tonic::Code;

fn plan(url: String, scenario: Scenario, concurrency: usize, requests: u64) -> Plan {
    let mut plan = Plan::new(
        url,
        scenario,
        Load::Closed { concurrency },
        Stop::Requests(requests),
    );
    plan.protocol = Protocol::Http;
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

/// A server that registers users and logs them in, as the report's service does.
fn users_server() -> impl Fn(&Seen<'_>) -> Reply + Send + Sync + 'static {
    let users = Mutex::new(HashSet::new());
    move |seen| match (seen.method, seen.path) {
        ("GET", "/health") => Reply::status(200),
        ("POST", "/register") => {
            let name = seen.username.clone().unwrap_or_default();
            Reply::status(if users.lock().unwrap().insert(name) {
                201
            } else {
                409
            })
        }
        ("POST", "/login") => {
            let known = users
                .lock()
                .unwrap()
                .contains(seen.username.as_deref().unwrap_or_default());
            Reply::status(if known { 200 } else { 401 })
        }
        _ => Reply::status(404),
    }
}

#[tokio::test]
async fn each_request_in_flight_has_a_connection_of_its_own() {
    let server = HttpServer::start(users_server()).await;
    for scenario in [Scenario::Login, Scenario::Register] {
        let before = server.connections();
        let report = bench::run(&plan(server.url(), scenario, 12, 120))
            .await
            .expect("the run completes");
        assert_accounted(&report, 120);
        assert_eq!(report.codes.get(Code::Ok), 120, "{}", report.to_text());
        assert_eq!(report.connections, 12);
        assert_eq!(report.protocol, Protocol::Http);
        // The load's 12, the health check's, and setup's few (logins register their
        // users first, over up to 8).
        let opened = server.connections() - before;
        assert!(
            (13..=21).contains(&opened),
            "{scenario}: {opened} connections"
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["protocol"], "http");
        assert_eq!(json["codes"]["OK"], 120);
    }
}

#[tokio::test]
async fn forwarded_addresses_travel_in_x_forwarded_for() {
    // Each request's username and X-Forwarded-For, as the server saw them.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let noted = seen.clone();
    let server = HttpServer::start(move |request| {
        if let Some(username) = &request.username {
            let forwarded = request.forwarded_for.clone();
            noted.lock().unwrap().push((username.clone(), forwarded));
        }
        Reply::status(if request.path == "/register" {
            201
        } else {
            200
        })
    })
    .await;
    // user i (…-u{i}: the setup's registrations and the logins) from address i mod
    // 3; registration r (…-r{r}) from address r mod 3.
    for scenario in [Scenario::Login, Scenario::Register] {
        seen.lock().unwrap().clear();
        let mut plan = plan(server.url(), scenario, 4, 20);
        plan.forwarded_for = Some(3);
        let report = bench::run(&plan).await.expect("the run completes");
        assert_eq!(report.codes.get(Code::Ok), 20, "{}", report.to_text());
        let seen = seen.lock().unwrap();
        let expected = if scenario == Scenario::Login { 25 } else { 20 };
        assert_eq!(seen.len(), expected, "{scenario}");
        for (username, forwarded) in seen.iter() {
            let (_, k) = (username.rsplit_once("-u"))
                .or_else(|| username.rsplit_once("-r"))
                .expect(username);
            let k: usize = k.parse().expect(username);
            let address = format!("198.18.0.{}", k % 3);
            assert_eq!(forwarded.as_deref(), Some(&*address), "{username}");
        }
    }
}

#[tokio::test]
async fn http_statuses_are_counted_as_the_codes_they_stand_for() {
    // Logins answered in a fixed rotation; one request in flight, so the counts are exact.
    let rotation = [200, 401, 409, 429, 503, 500, 422, 302];
    let turn = AtomicUsize::new(0);
    let server = HttpServer::start(move |seen| match seen.path {
        "/login" => Reply::status(rotation[turn.fetch_add(1, Ordering::SeqCst) % rotation.len()]),
        "/register" => Reply::status(201),
        _ => Reply::status(200),
    })
    .await;
    let report = bench::run(&plan(server.url(), Scenario::Login, 1, 80))
        .await
        .expect("the run completes");
    assert_accounted(&report, 80);
    for code in [
        Code::Ok,
        Code::Unauthenticated,
        Code::AlreadyExists,
        Code::ResourceExhausted,
        Code::Unavailable,
        Code::Internal,
        Code::InvalidArgument,
        Code::Unknown,
    ] {
        assert_eq!(report.codes.get(code), 10, "{code:?}: {}", report.to_text());
    }
    assert_eq!(report.client_errors.total(), 0);
    assert!(report.to_text().contains("over HTTP/1.1"));
}

#[tokio::test]
async fn connections_the_server_closes_are_opened_again() {
    // Every third answer closes its connection: the next request on it reconnects.
    let answered = AtomicUsize::new(0);
    let server = HttpServer::start(move |_| {
        let n = answered.fetch_add(1, Ordering::SeqCst);
        Reply {
            close: n % 3 == 2,
            ..Reply::status(if n == 0 { 200 } else { 201 })
        }
    })
    .await;
    let report = bench::run(&plan(server.url(), Scenario::Register, 4, 60))
        .await
        .expect("the run completes");
    assert_accounted(&report, 60);
    assert_eq!(report.codes.get(Code::Ok), 60, "{}", report.to_text());
    assert_eq!(report.client_errors.total(), 0, "{}", report.to_text());
    // Of 61 answers (the health check's first), 20 close their connection; each is
    // opened again unless its worker had no request left (at most one per worker).
    let opened = server.connections();
    assert!((1 + 4 + 16..=1 + 4 + 20).contains(&opened), "{opened}");
}

#[tokio::test]
async fn a_request_with_no_answer_times_out_and_its_connection_is_replaced() {
    // Every fourth registration is answered only after 5 s; the client gives up at 300 ms.
    let seen = AtomicUsize::new(0);
    let server = HttpServer::start(move |request| {
        if request.path != "/register" {
            return Reply::status(200);
        }
        let n = seen.fetch_add(1, Ordering::SeqCst);
        Reply {
            delay: if n % 4 == 3 {
                Duration::from_secs(5)
            } else {
                Duration::ZERO
            },
            ..Reply::status(201)
        }
    })
    .await;
    let mut plan = plan(server.url(), Scenario::Register, 1, 12);
    plan.timeout = Duration::from_millis(300);
    let report = bench::run(&plan).await.expect("the run completes");
    assert_accounted(&report, 12);
    assert_eq!(report.client_errors.timeout, 3, "{}", report.to_text());
    assert_eq!(report.codes.get(Code::Ok), 9, "{}", report.to_text());
    let error = report.first_client_error.as_deref().unwrap_or_default();
    assert!(
        error.contains("POST /register: no answer within"),
        "{error}"
    );
    // The health check's connection, the first load connection, and one more after
    // each timeout but the last (the run's last request).
    assert_eq!(server.connections(), 2 + 2);
}

/// A run of 300 ms against a server whose first answer is "retry after 1 s", then
/// success: its requests, by code.
async fn a_refusal_then_success(backoff: bool) -> Report {
    let served = AtomicUsize::new(0);
    let server = HttpServer::start(move |request| {
        if request.path != "/register" {
            return Reply::status(200);
        }
        match served.fetch_add(1, Ordering::SeqCst) {
            0 => Reply {
                retry_after: Some(1),
                ..Reply::status(429)
            },
            _ => Reply::status(201),
        }
    })
    .await;
    let mut plan = plan(server.url(), Scenario::Register, 1, 0);
    plan.stop = Stop::Duration(Duration::from_millis(300));
    plan.backoff = backoff;
    bench::run(&plan).await.expect("the run completes")
}

#[tokio::test]
async fn clients_that_back_off_wait_out_retry_after() {
    // With --backoff the single client waits out the hint (jittered between half
    // and one and a half times it, so at least 500 ms) before its next request:
    // the run ends first, and the refusal is the only request it sent.
    let report = a_refusal_then_success(true).await;
    assert_accounted(&report, 1);
    assert_eq!(report.codes.get(Code::ResourceExhausted), 1);
    // Without it, the client asks again at once, and is served.
    let report = a_refusal_then_success(false).await;
    assert_eq!(report.codes.get(Code::ResourceExhausted), 1);
    assert!(report.codes.get(Code::Ok) >= 1, "{}", report.to_text());
}

#[tokio::test]
async fn a_target_that_is_not_healthy_is_waited_for_or_refused() {
    let checks = Arc::new(AtomicUsize::new(0));
    let counted = checks.clone();
    let server = HttpServer::start(move |request| match request.path {
        "/health" if counted.fetch_add(1, Ordering::SeqCst) < 3 => Reply::status(503),
        "/health" => Reply::status(200),
        _ => Reply::status(201),
    })
    .await;
    let plan_once = plan(server.url(), Scenario::Register, 1, 1);
    let err = bench::run(&plan_once)
        .await
        .expect_err("503 is not healthy");
    let message = format!("{err:#}");
    assert!(
        message.contains("is not serving: GET /health answered 503") && message.contains("--wait"),
        "{message}"
    );
    let mut waiting = plan(server.url(), Scenario::Register, 1, 1);
    waiting.wait = Duration::from_secs(10);
    let report = bench::run(&waiting).await.expect("healthy after a while");
    assert_eq!(report.codes.get(Code::Ok), 1);
    assert!(checks.load(Ordering::SeqCst) >= 4);
}

#[tokio::test]
async fn an_unreachable_http_target_fails_before_sending_load() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut plan = plan(format!("http://127.0.0.1:{port}"), Scenario::Login, 1, 1);
    plan.connect_timeout = Duration::from_secs(2);
    let err = bench::run(&plan).await.expect_err("nothing listens there");
    let message = format!("{err:#}");
    assert!(
        message.contains(&format!("cannot connect to http://127.0.0.1:{port}")),
        "{message}"
    );
    assert!(!message.contains('\n'), "one line: {message}");
}

#[tokio::test]
async fn the_report_service_serves_logins_and_registrations() {
    let Some(service) = report_service::start("the_report_service_serves_logins_and_registrations")
    else {
        return;
    };
    for scenario in [Scenario::Login, Scenario::Register] {
        let mut plan = plan(service.url(), scenario, 4, 40);
        plan.wait = Duration::from_secs(10);
        let report = bench::run(&plan).await.expect("the run completes");
        assert_accounted(&report, 40);
        assert_eq!(
            report.codes.get(Code::Ok),
            40,
            "{scenario}: {}",
            report.to_text()
        );
    }
}

#[tokio::test]
async fn the_report_service_answers_as_documented() {
    let Some(service) = report_service::start("the_report_service_answers_as_documented") else {
        return;
    };
    let body = |name: &str, password: &str| {
        format!(r#"{{"username": "{name}", "password": "{password}"}}"#)
    };
    let status = |method, path, body: &str| service.status_of(method, path, body);
    assert_eq!(status("GET", "/health", ""), 200);
    assert_eq!(
        status("POST", "/register", &body("alice", "password-1")),
        201
    );
    assert_eq!(
        status("POST", "/register", &body("Alice", "password-2")),
        409
    );
    assert_eq!(status("POST", "/register", &body("al", "password-1")), 422);
    assert_eq!(status("POST", "/register", &body("bob", "short")), 422);
    assert_eq!(status("POST", "/register", "not json"), 422);
    assert_eq!(status("POST", "/login", &body("alice", "password-1")), 200);
    assert_eq!(status("POST", "/login", &body("ALICE", "password-1")), 200);
    assert_eq!(status("POST", "/login", &body("alice", "password-2")), 401);
    assert_eq!(status("POST", "/login", &body("carol", "password-1")), 401);
}
