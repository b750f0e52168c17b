//! authbench against a gRPC server of the tests' own that records every request it
//! receives: what each request carries (`--forwarded-for`), and how many requests a
//! run sends, and when. Counts only; no timing is asserted.

mod grpc_server;

use authbench::{self as bench, Load, Plan, Scenario, Stop};
use grpc_server::{GrpcServer, Seen};
use std::collections::HashSet;
use tonic::Code;

fn plan(server: &GrpcServer, scenario: Scenario, concurrency: usize, requests: u64) -> Plan {
    let mut plan = Plan::new(
        server.url(),
        scenario,
        Load::Closed { concurrency },
        Stop::Requests(requests),
    );
    plan.users = 10;
    plan
}

/// The number a username ends with after `marker` (`…-u7` is user 7, `…-r3`
/// registration 3).
fn number(username: &str, marker: &str) -> usize {
    let (_, n) = username.rsplit_once(marker).expect(username);
    n.parse().expect(username)
}

/// Each request carried address `k mod n` of 198.18.0.0/15, k read from its username.
#[track_caller]
fn assert_forwarded(seen: &[Seen], marker: &str, n: usize) {
    assert!(!seen.is_empty());
    for request in seen {
        let k = number(&request.username, marker) % n;
        let address = bench::runner::forwarded_address(k).to_string();
        assert_eq!(request.forwarded_for, Some(address), "{request:?}");
    }
}

/// 300 users log in at once, each once: the server holds every login until all 300
/// have arrived, so a client that waited for an answer before sending would show as
/// one answered early.
async fn n_users_at_once_send_one_request_each() {
    let server = GrpcServer::start(300).await;
    let mut plan = plan(&server, Scenario::Login, 300, 300);
    plan.users = 300;
    let report = bench::run(&plan).await.expect("the run completes");
    assert_eq!(report.requests, 300, "{}", report.to_text());
    assert_eq!(report.codes.get(Code::Ok), 300, "{}", report.to_text());
    assert_eq!(report.warmup_requests, 0);

    let logins = server.seen("Login");
    assert_eq!(logins.len(), 300, "logins sent");
    let users: HashSet<&str> = logins.iter().map(|s| s.username.as_str()).collect();
    assert_eq!(users.len(), 300, "no user logged in twice");
    assert_eq!(server.answered_early(), 0, "all 300 sent before any answer");
    // The setup registered the 300 users, each once.
    assert_eq!(server.seen("Register").len(), 300);
}

#[tokio::test]
async fn n_users_at_once_send_one_request_each_on_one_thread() {
    n_users_at_once_send_one_request_each().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn n_users_at_once_send_one_request_each_on_several_threads() {
    n_users_at_once_send_one_request_each().await;
}

#[tokio::test]
async fn forwarded_addresses_are_each_users_own_and_registrations_take_them_in_turn() {
    let server = GrpcServer::start(0).await;
    let n = 4;

    // Logins: the setup's registrations and the logins carry user i's address.
    let mut login = plan(&server, Scenario::Login, 3, 30);
    login.forwarded_for = Some(n);
    let report = bench::run(&login).await.expect("the run completes");
    assert_eq!(report.codes.get(Code::Ok), 30, "{}", report.to_text());
    assert_eq!(server.seen("Register").len(), 10);
    assert_forwarded(&server.seen("Register"), "-u", n);
    assert_eq!(server.seen("Login").len(), 30);
    assert_forwarded(&server.seen("Login"), "-u", n);

    // Validations and refreshes: their user's address (tokens name their user here),
    // as do the setup's logins for those tokens.
    for (scenario, method) in [
        (Scenario::Validate, "ValidateToken"),
        (Scenario::Refresh, "Refresh"),
    ] {
        server.forget();
        let mut run = plan(&server, scenario, 3, 30);
        run.forwarded_for = Some(n);
        let report = bench::run(&run).await.expect("the run completes");
        assert_eq!(report.codes.get(Code::Ok), 30, "{}", report.to_text());
        assert_forwarded(&server.seen("Login"), "-u", n);
        assert_eq!(server.seen(method).len(), 30);
        assert_forwarded(&server.seen(method), "-u", n);
    }

    // Registrations: registration r takes address r mod n, so 10 of them cover all 4.
    server.forget();
    let mut register = plan(&server, Scenario::Register, 3, 10);
    register.forwarded_for = Some(n);
    let report = bench::run(&register).await.expect("the run completes");
    assert_eq!(report.codes.get(Code::Ok), 10, "{}", report.to_text());
    let registrations = server.seen("Register");
    let numbers: HashSet<usize> = registrations
        .iter()
        .map(|s| number(&s.username, "-r"))
        .collect();
    assert_eq!(numbers, (0..10).collect());
    assert_forwarded(&registrations, "-r", n);

    // Without the option, no request carries the header.
    server.forget();
    let report = bench::run(&plan(&server, Scenario::Login, 3, 30))
        .await
        .expect("the run completes");
    assert_eq!(report.codes.get(Code::Ok), 30, "{}", report.to_text());
    let seen = [server.seen("Register"), server.seen("Login")].concat();
    assert_eq!(seen.len(), 40);
    assert!(seen.iter().all(|s| s.forwarded_for.is_none()), "{seen:?}");
}
