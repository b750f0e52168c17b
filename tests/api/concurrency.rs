//! The guarantees that must hold when requests arrive together, played through the
//! real server: many streams on one connection, many connections from distinct
//! 127.0.0.x source addresses (each client socket bound to its own), both backends,
//! and two replicas sharing Redis.
//!
//! - the login throttle reserves an attempt's place before it hashes: guesses at
//!   once count as guesses, one by one, on one replica or many, and the owner's
//!   correct logins at once all succeed;
//! - a password change wins against logins (and refreshes) already in flight: no
//!   session verified against the old password survives it;
//! - Register costs the same whether the name is taken or not, so a deadline cannot
//!   tell them apart, and one client can make only so many;
//! - credentials of an ended session end nothing;
//! - many users logging in at once each get their own session and token, whatever
//!   batch their lookup and their session's insert share with the others.
//!
//! Every verdict is a count (hashes reached, answers by code, sessions alive), never
//! a time: throttle delays are hours long beside the tests, or (with the defaults)
//! the tests move the apps' clock past them.

use crate::helpers::{
    Backend, TestApp, TestDb, connect_from, expect_code, redis_url, spawn_app_on, spawn_app_with,
    spawn_registrations, unique_name, wait_until,
};
use authd::{
    ManualClock,
    config::Config,
    pb::{
        ChangePasswordRequest, LoginRequest, LoginResponse, LogoutRequest, RefreshRequest,
        RegisterRequest, ValidateTokenRequest, auth_service_client::AuthServiceClient,
    },
};
use futures::future::join_all;
use std::{
    collections::BTreeMap,
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};
use tonic::{Code, Request, Status, transport::Channel};

const OWNER: &str = "olga";
const PASSWORD: &str = "correct horse battery";
const NEW_PASSWORD: &str = "violet tractor at dawn";
const HOUR: Duration = Duration::from_secs(3600);

crate::backend_tests!(
    fifty_guesses_at_once_on_one_connection_reach_five_hashes,
    guesses_from_twenty_addresses_at_once_reach_the_account_threshold_and_no_more,
    the_owner_logging_in_eight_times_at_once_always_succeeds,
    no_session_verified_against_the_old_password_outlives_a_password_change,
    a_taken_and_a_free_name_answer_alike_under_a_short_deadline,
    fifty_users_logging_in_at_once_from_twenty_addresses_each_get_their_own_session,
);

/// The throttle's defaults, with delays hours long (no verdict depends on how long
/// a test takes) and the rate limiter counting by the connection's address.
fn throttled(c: &mut Config) {
    let defaults = Config::defaults();
    c.limits.login_failures = defaults.limits.login_failures;
    c.limits.login_account_failures = defaults.limits.login_account_failures;
    c.limits.login_delay = HOUR;
    c.limits.login_delay_max = 8 * HOUR;
    c.limits.login_account_delay_max = HOUR;
    c.limits.trust_forwarded_for = false;
}

/// The `n`th client address: 127.0.0.10 and up.
fn address(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        127,
        0,
        0,
        10 + u8::try_from(n).expect("fewer than 240 clients"),
    )
}

async fn login(
    client: &AuthServiceClient<Channel>,
    username: &str,
    password: &str,
) -> Result<LoginResponse, Status> {
    (client.clone())
        .login(LoginRequest {
            username: username.into(),
            password: password.into(),
        })
        .await
        .map(|r| r.into_inner())
}

async fn change_password(
    client: &AuthServiceClient<Channel>,
    current: &str,
    new: &str,
) -> Result<u32, Status> {
    (client.clone())
        .change_password(ChangePasswordRequest {
            username: OWNER.into(),
            current_password: current.into(),
            new_password: new.into(),
        })
        .await
        .map(|r| r.into_inner().sessions_ended)
}

async fn validate(client: &AuthServiceClient<Channel>, token: &str) -> Result<(), Status> {
    (client.clone())
        .validate_token(ValidateTokenRequest {
            access_token: token.into(),
            ..Default::default()
        })
        .await
        .map(drop)
}

/// Answers by code.
fn tally<T>(results: &[Result<T, Status>]) -> BTreeMap<String, usize> {
    let mut codes = BTreeMap::new();
    for r in results {
        let code = r.as_ref().err().map_or(Code::Ok, Status::code);
        *codes.entry(format!("{code:?}")).or_insert(0) += 1;
    }
    codes
}

fn count(codes: &BTreeMap<String, usize>, code: &str) -> usize {
    codes.get(code).copied().unwrap_or(0)
}

/// Hashes the apps computed since `before`.
fn hashes(apps: &[&TestApp], before: u64) -> u64 {
    let now: u64 = apps.iter().map(|a| a.handle.hash_stats().completed).sum();
    now - before
}

fn hashes_so_far(apps: &[&TestApp]) -> u64 {
    hashes(apps, 0)
}

async fn fifty_guesses_at_once_on_one_connection_reach_five_hashes(db: TestDb) {
    let mut app = spawn_app_on(&db, throttled).await;
    app.register(OWNER, PASSWORD).await.unwrap();
    let before = hashes_so_far(&[&app]);
    // Fifty streams on the one connection of `app.client`: wrong guesses by Login
    // and by ChangePassword's current-password check, which is a login attempt.
    let guesses = (0..50).map(|i| {
        let client = app.client.clone();
        async move {
            if i % 2 == 0 {
                login(&client, OWNER, &format!("guess number {i}"))
                    .await
                    .map(drop)
            } else {
                change_password(&client, &format!("guess number {i}"), NEW_PASSWORD)
                    .await
                    .map(drop)
            }
        }
    });
    let codes = tally(&join_all(guesses).await);
    assert_eq!(hashes(&[&app], before), 5, "{codes:?}");
    assert_eq!(count(&codes, "Unauthenticated"), 5, "{codes:?}");
    assert_eq!(count(&codes, "ResourceExhausted"), 45, "{codes:?}");
    // The owner, from another address, is not held by this client's count.
    let owner = connect_from(app.addr, address(0)).await;
    login(&owner, OWNER, PASSWORD).await.unwrap();
    // An unknown username is counted exactly alike.
    let before = hashes_so_far(&[&app]);
    let guesses = (0..50).map(|i| {
        let client = app.client.clone();
        async move {
            login(&client, "nobody-here", &format!("guess number {i}"))
                .await
                .map(drop)
        }
    });
    let codes = tally(&join_all(guesses).await);
    assert_eq!(hashes(&[&app], before), 5, "{codes:?}");
    assert_eq!(count(&codes, "ResourceExhausted"), 45, "{codes:?}");
}

/// Wrong guesses for one account: `per_client` at once from each of `clients`
/// addresses, spread over `apps` (replicas of one database). Returns the answers.
async fn guesses_from_many_addresses(
    apps: &[&TestApp],
    clients: usize,
    per_client: usize,
) -> BTreeMap<String, usize> {
    let mut connections = Vec::new();
    for n in 0..clients {
        connections.push(connect_from(apps[n % apps.len()].addr, address(n)).await);
    }
    let guesses = connections.iter().flat_map(|client| {
        (0..per_client).map(move |i| async move {
            login(client, OWNER, &format!("guess number {i}"))
                .await
                .map(drop)
        })
    });
    tally(&join_all(guesses).await)
}

async fn guesses_from_twenty_addresses_at_once_reach_the_account_threshold_and_no_more(db: TestDb) {
    let mut app = spawn_app_on(&db, throttled).await;
    app.register(OWNER, PASSWORD).await.unwrap();
    let before = hashes_so_far(&[&app]);
    let codes = guesses_from_many_addresses(&[&app], 20, 10).await;
    // Each address's first five count for the account, whose threshold (20) holds
    // every client that has not logged in to it: at most 20 guesses are hashed.
    let hashed = hashes(&[&app], before);
    let threshold = Config::defaults().limits.login_account_failures as u64;
    assert!(hashed <= threshold, "{hashed} hashed: {codes:?}");
    assert_eq!(count(&codes, "Unauthenticated") as u64, hashed, "{codes:?}");
    assert_eq!(codes.values().sum::<usize>(), 200);
    // A full hash queue refuses some at once (and they give their places back):
    // everything else was throttled.
    assert_eq!(
        count(&codes, "Unauthenticated") + count(&codes, "ResourceExhausted"),
        200,
        "{codes:?}"
    );
}

async fn the_owner_logging_in_eight_times_at_once_always_succeeds(db: TestDb) {
    let mut app = spawn_app_on(&db, throttled).await;
    app.register(OWNER, PASSWORD).await.unwrap();
    let owner = connect_from(app.addr, address(1)).await;
    let logins = join_all((0..8).map(|_| login(&owner, OWNER, PASSWORD))).await;
    assert_eq!(tally(&logins).get("Ok"), Some(&8), "{:?}", tally(&logins));
    for session in logins {
        validate(&owner, &session.unwrap().access_token)
            .await
            .unwrap();
    }
}

/// Fifty users log in at once over twenty connections from addresses of their own,
/// and ten of them also with a wrong password: every right login succeeds with its
/// own user's id and a token of that user, every wrong one fails.
async fn fifty_users_logging_in_at_once_from_twenty_addresses_each_get_their_own_session(
    db: TestDb,
) {
    let mut app = spawn_app_on(&db, throttled).await;
    let name = |i: usize| format!("crowd{i}");
    let password = |i: usize| format!("{PASSWORD} {i}");
    let mut ids = Vec::new();
    for i in 0..50 {
        ids.push(app.register(&name(i), &password(i)).await.unwrap());
    }
    let mut clients = Vec::new();
    for n in 0..20 {
        clients.push(connect_from(app.addr, address(n)).await);
    }
    let attempts = (0..60).map(|i| {
        let client = &clients[i % clients.len()];
        let (user, password) = match i {
            0..50 => (i, password(i)),
            _ => (i - 50, "not the password".to_owned()),
        };
        let name = name(user);
        async move { login(client, &name, &password).await }
    });
    let answers = join_all(attempts).await;
    let codes = tally(&answers);
    assert_eq!(count(&codes, "Ok"), 50, "{codes:?}");
    assert_eq!(count(&codes, "Unauthenticated"), 10, "{codes:?}");
    for (i, answer) in answers.into_iter().take(50).enumerate() {
        let session = answer.unwrap();
        assert_eq!(session.user_id, ids[i], "login {i}");
        let token = (clients[0].clone())
            .validate_token(ValidateTokenRequest {
                access_token: session.access_token,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((token.user_id, token.username), (ids[i].clone(), name(i)));
    }
}

/// Logins with the old password (and refreshes of a session of it) kept in flight
/// from several clients while the owner changes the password: afterwards, no token
/// any of them was given still validates, and no refresh token still refreshes.
async fn no_session_verified_against_the_old_password_outlives_a_password_change(db: TestDb) {
    let mut app = spawn_app_on(&db, |c| {
        // Hashes long enough that logins are in flight when the change commits.
        c.passwords.pbkdf2_iterations = 20_000;
        c.limits.login_failures = 0;
    })
    .await;
    app.register(OWNER, PASSWORD).await.unwrap();
    let first = app.login(OWNER, PASSWORD).await.unwrap();
    let mut clients = Vec::new();
    for n in 0..6 {
        clients.push(connect_from(app.addr, address(20 + n)).await);
    }
    let changed = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for client in clients.clone() {
        let changed = changed.clone();
        workers.push(tokio::spawn(async move {
            let mut issued = Vec::new();
            // Until the change is done, and then one round more.
            let mut last_round = false;
            while !last_round {
                last_round = changed.load(Ordering::SeqCst);
                let answers = join_all((0..3).map(|_| login(&client, OWNER, PASSWORD))).await;
                issued.extend(answers.into_iter().flatten());
            }
            issued
        }));
    }
    let refresher = {
        let (client, changed) = (clients[0].clone(), changed.clone());
        let mut token = first.refresh_token.clone();
        tokio::spawn(async move {
            let mut issued = Vec::new();
            while !changed.load(Ordering::SeqCst) {
                let answer = (client.clone())
                    .refresh(RefreshRequest {
                        refresh_token: token.clone(),
                    })
                    .await;
                let Ok(answer) = answer else { break };
                let answer = answer.into_inner();
                token = answer.refresh_token.clone();
                issued.push((answer.access_token, answer.refresh_token));
            }
            issued
        })
    };
    // Let the logins get going, then change the password while they run.
    wait_until("ten logins have hashed", || {
        app.handle.hash_stats().completed >= 10
    })
    .await;
    change_password(&app.client, PASSWORD, NEW_PASSWORD)
        .await
        .expect("the owner changes the password");
    changed.store(true, Ordering::SeqCst);
    let mut sessions = Vec::new();
    for worker in workers {
        sessions.extend(worker.await.unwrap());
    }
    let refreshed = refresher.await.unwrap();
    assert!(
        !sessions.is_empty(),
        "some logins succeeded before the change"
    );
    let mut alive = 0;
    for session in &sessions {
        if validate(&app.client, &session.access_token).await.is_ok() {
            alive += 1;
        }
        let again = (app.client.clone())
            .refresh(RefreshRequest {
                refresh_token: session.refresh_token.clone(),
            })
            .await;
        expect_code(again, Code::Unauthenticated);
    }
    for (access, refresh) in &refreshed {
        if validate(&app.client, access).await.is_ok() {
            alive += 1;
        }
        let again = (app.client.clone())
            .refresh(RefreshRequest {
                refresh_token: refresh.clone(),
            })
            .await;
        expect_code(again, Code::Unauthenticated);
    }
    assert_eq!(
        alive, 0,
        "sessions of the old password alive after the change"
    );
    // The new password works; the old one no longer does.
    login(&app.client, OWNER, NEW_PASSWORD).await.unwrap();
    expect_code(
        login(&app.client, OWNER, PASSWORD).await,
        Code::Unauthenticated,
    );
}

async fn a_taken_and_a_free_name_answer_alike_under_a_short_deadline(db: TestDb) {
    let mut app = spawn_app_on(&db, |c| {
        // One hashing thread, and hashes that take far longer than the deadline on
        // any machine (200,000 rounds of SHA-256 pairs: tens of milliseconds at least).
        c.passwords.hash_threads = Some(1);
        c.passwords.pbkdf2_iterations = 200_000;
    })
    .await;
    app.register(OWNER, PASSWORD).await.unwrap();
    // Two registrations that keep the thread busy.
    let busy = spawn_registrations(&app.client, "busy", 2, PASSWORD);
    wait_until("a registration hashes", || {
        app.handle.hash_stats().running > 0
    })
    .await;
    let free = unique_name("free");
    let mut answers = Vec::new();
    for name in [OWNER, free.as_str()] {
        let mut request = Request::new(RegisterRequest {
            username: name.into(),
            password: PASSWORD.into(),
        });
        request.set_timeout(Duration::from_millis(3));
        answers.push(app.client.clone().register(request).await);
    }
    let codes: Vec<Code> = answers
        .iter()
        .map(|r| r.as_ref().err().map_or(Code::Ok, Status::code))
        .collect();
    // The client's own timer may end either first (CANCELLED: no answer from the
    // server to compare), or the server answers: DEADLINE_EXCEEDED, or
    // RESOURCE_EXHAUSTED when the hash queue sees the deadline would pass in it
    // (before the name is looked up). The server's answers are the same for both.
    assert!(
        codes.iter().all(|c| matches!(
            c,
            Code::DeadlineExceeded | Code::Cancelled | Code::ResourceExhausted
        )),
        "{answers:?}"
    );
    let answered: Vec<Code> = codes
        .iter()
        .copied()
        .filter(|c| *c != Code::Cancelled)
        .collect();
    assert!(answered.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
    for b in busy {
        b.await.unwrap().unwrap();
    }
    // The free name was not taken by the probe.
    app.register(&free, PASSWORD).await.unwrap();
}

#[tokio::test]
async fn a_client_probing_names_is_refused_by_the_default_limit() {
    let mut app =
        spawn_app_with(|c| c.limits.register_limit = Config::defaults().limits.register_limit)
            .await;
    let limit = Config::defaults()
        .limits
        .register_limit
        .rule()
        .expect("on by default")
        .limit() as usize;
    let mut answers = Vec::new();
    for batch in 0..30 {
        let probes = (0..10).map(|i| {
            let mut client = app.client.clone();
            async move {
                client
                    .register(RegisterRequest {
                        username: format!("probe-{batch}-{i}"),
                        password: PASSWORD.into(),
                    })
                    .await
                    .map(drop)
            }
        });
        answers.extend(join_all(probes).await);
    }
    let codes = tally(&answers);
    assert_eq!(count(&codes, "Ok"), limit, "{codes:?}");
    assert_eq!(count(&codes, "ResourceExhausted"), 300 - limit, "{codes:?}");
    let refused = answers.last().unwrap().as_ref().unwrap_err();
    assert!(
        refused.message().contains("Register:peer="),
        "{}",
        refused.message()
    );
    // Another address is not held by it.
    let other = connect_from(app.addr, address(2)).await;
    (other.clone())
        .register(RegisterRequest {
            username: "someone-else".into(),
            password: PASSWORD.into(),
        })
        .await
        .unwrap();
    app.register("late-probe", PASSWORD).await.unwrap_err();
}

/// Two replicas of one PostgreSQL database sharing the throttle's counts in Redis.
/// With the throttle's delays hours long, or (`defaults`) as they are by default.
async fn replicas_on_redis(test: &str) -> Option<(TestDb, TestApp, TestApp)> {
    replicas_on_redis_with(test, None).await
}

/// Two replicas, with the throttle's defaults on `clock` when one is given.
async fn replicas_on_redis_with(
    test: &str,
    defaults_on: Option<&Arc<ManualClock>>,
) -> Option<(TestDb, TestApp, TestApp)> {
    let url = redis_url(test)?;
    let db = TestDb::new(Backend::Postgres, test).await?;
    let prefix = unique_name("authd-test-concurrency");
    let adjust = |c: &mut Config| {
        match defaults_on {
            Some(clock) => c.clock = Some(clock.clone()),
            None => throttled(c),
        }
        c.limits.redis_url = Some(url.parse().unwrap());
        c.limits.rate_limit_prefix = prefix.clone();
        // An unoptimized server on a busy machine; a timeout would fall back to the
        // per-replica counts, which is not what these tests look at.
        c.limits.redis_timeout = Duration::from_secs(10);
    };
    let a = spawn_app_on(&db, adjust).await;
    let b = spawn_app_on(&db, adjust).await;
    Some((db, a, b))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_redis_count_guesses_at_once_as_one() {
    let Some((_db, mut a, b)) = replicas_on_redis("two_replicas_count_guesses_as_one").await else {
        return;
    };
    a.register(OWNER, PASSWORD).await.unwrap();
    let before = hashes_so_far(&[&a, &b]);
    // One client, fifty guesses at once, half on each replica.
    let (ca, cb) = (
        connect_from(a.addr, address(3)).await,
        connect_from(b.addr, address(3)).await,
    );
    let guesses = (0..50).map(|i| {
        let client = if i % 2 == 0 { ca.clone() } else { cb.clone() };
        async move { login(&client, OWNER, &format!("guess {i}")).await.map(drop) }
    });
    let codes = tally(&join_all(guesses).await);
    assert_eq!(hashes(&[&a, &b], before), 5, "{codes:?}");
    assert_eq!(count(&codes, "Unauthenticated"), 5, "{codes:?}");

    // Twenty other addresses, ten guesses at once each, spread over both replicas.
    let before = hashes_so_far(&[&a, &b]);
    let codes = guesses_from_many_addresses(&[&a, &b], 20, 10).await;
    let hashed = hashes(&[&a, &b], before);
    // The five above already count for the account.
    let threshold = Config::defaults().limits.login_account_failures as u64 - 5;
    assert!(hashed <= threshold, "{hashed} hashed: {codes:?}");
    assert_eq!(count(&codes, "Unauthenticated") as u64, hashed, "{codes:?}");
    assert_eq!(
        count(&codes, "Unauthenticated") + count(&codes, "ResourceExhausted"),
        200,
        "{codes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_on_redis_let_the_owner_in_eight_times_at_once() {
    let Some((_db, mut a, b)) = replicas_on_redis("two_replicas_let_the_owner_in").await else {
        return;
    };
    a.register(OWNER, PASSWORD).await.unwrap();
    let (ca, cb) = (
        connect_from(a.addr, address(4)).await,
        connect_from(b.addr, address(4)).await,
    );
    let logins = (0..8).map(|i| {
        let client = if i % 2 == 0 { ca.clone() } else { cb.clone() };
        async move { login(&client, OWNER, PASSWORD).await.map(drop) }
    });
    let codes = tally(&join_all(logins).await);
    assert_eq!(count(&codes, "Ok"), 8, "{codes:?}");
}

/// Twenty addresses, ten workers each, guessing for `for_how_long` of the apps'
/// clock with the throttle's defaults (delays of a second and up): each worker
/// sends its next guess as soon as an answer allows (at once after a wrong
/// password, once its RetryInfo delay has passed after a refusal). The clock moves
/// only when every worker waits, to the first one's wake-up: the outcome depends on
/// the throttle's rule alone, never on how fast the machine is.
async fn guessing_with_the_defaults(
    apps: &[&TestApp],
    clock: &ManualClock,
    for_how_long: Duration,
) -> Guessed {
    use tonic_types::StatusExt as _;
    let before = hashes_so_far(apps);
    let mut workers = Vec::new();
    for n in 0..20 {
        let client = connect_from(apps[n % apps.len()].addr, address(40 + n)).await;
        for w in 0..10 {
            workers.push((client.clone(), format!("guess {n} {w}"), Duration::ZERO));
        }
    }
    let (mut now, mut first_round, mut rounds) = (Duration::ZERO, None, 0);
    let mut codes = BTreeMap::new();
    while now < for_how_long {
        rounds += 1;
        assert!(rounds < 1000, "the clock stopped moving: {codes:?}");
        let due = workers.iter_mut().filter(|(_, _, wake)| *wake <= now);
        let answers = join_all(due.map(|(client, guess, wake)| async move {
            let answer = login(client, OWNER, guess).await;
            *wake = match &answer {
                Err(s) if s.code() == Code::ResourceExhausted => {
                    let hint = s.get_details_retry_info().and_then(|r| r.retry_delay);
                    now + hint.expect("a refusal says when to retry")
                }
                _ => now,
            };
            answer.map(drop)
        }))
        .await;
        for (code, n) in tally(&answers) {
            *codes.entry(code).or_insert(0) += n;
        }
        first_round.get_or_insert_with(|| hashes(apps, before));
        let next = workers.iter().map(|(_, _, wake)| *wake).min().unwrap();
        if next > now {
            clock.advance(next - now);
            now = next;
        }
    }
    Guessed {
        first_round: first_round.unwrap_or(0),
        all: hashes(apps, before),
        codes,
    }
}

/// What [`guessing_with_the_defaults`] saw.
struct Guessed {
    /// Hashes reached by the first guess of every worker, all at once.
    first_round: u64,
    all: u64,
    codes: BTreeMap<String, usize>,
}

impl Guessed {
    /// With the defaults (an account delay of 1 s after 20 failures, doubling with
    /// each further one): the first round reaches the account's threshold, then one
    /// guess at a time gets through, at 1, 3, 7 and 15 s; every other guess is
    /// refused before any hashing, and every hash is a wrong password's answer.
    fn check(&self) {
        let threshold = u64::from(Config::defaults().limits.login_account_failures);
        let codes = &self.codes;
        assert_eq!(self.first_round, threshold, "{codes:?}");
        assert_eq!(self.all, threshold + 4, "{codes:?}");
        assert_eq!(
            count(codes, "Unauthenticated") as u64,
            self.all,
            "{codes:?}"
        );
        assert!(count(codes, "ResourceExhausted") >= 200, "{codes:?}");
        assert_eq!(
            count(codes, "Unauthenticated") + count(codes, "ResourceExhausted"),
            codes.values().sum::<usize>(),
            "{codes:?}"
        );
    }
}

/// The apps' clock, which these tests move.
fn on_clock(clock: &Arc<ManualClock>) -> impl Fn(&mut Config) + '_ {
    move |c: &mut Config| c.clock = Some(clock.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_addresses_guessing_for_twenty_seconds_with_the_defaults() {
    let clock = Arc::new(ManualClock::new());
    let mut app = spawn_app_with(on_clock(&clock)).await;
    app.register(OWNER, PASSWORD).await.unwrap();
    let guessed = guessing_with_the_defaults(&[&app], &clock, Duration::from_secs(20)).await;
    guessed.check();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_addresses_guessing_on_two_replicas_for_twenty_seconds_with_the_defaults() {
    let clock = Arc::new(ManualClock::new());
    let Some((_db, mut a, b)) =
        replicas_on_redis_with("twenty_addresses_on_two_replicas", Some(&clock)).await
    else {
        return;
    };
    a.register(OWNER, PASSWORD).await.unwrap();
    let guessed = guessing_with_the_defaults(&[&a, &b], &clock, Duration::from_secs(20)).await;
    guessed.check();
}

#[tokio::test]
async fn an_ended_sessions_access_token_ends_none_of_the_owners_other_sessions() {
    let mut app = spawn_app_with(|_| {}).await;
    app.register(OWNER, PASSWORD).await.unwrap();
    let stolen = login(&app.client, OWNER, PASSWORD).await.unwrap();
    (app.client.clone())
        .logout(LogoutRequest {
            access_token: stolen.access_token.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let fresh = login(&app.client, OWNER, PASSWORD).await.unwrap();
    // The ended session's credentials, many at once, for all sessions.
    let attempts = (0..10).map(|i| {
        let mut client = app.client.clone();
        let request = if i % 2 == 0 {
            LogoutRequest {
                access_token: stolen.access_token.clone(),
                all_sessions: true,
                ..Default::default()
            }
        } else {
            LogoutRequest {
                refresh_token: stolen.refresh_token.clone(),
                all_sessions: true,
                ..Default::default()
            }
        };
        async move { client.logout(request).await.map(drop) }
    });
    let codes = tally(&join_all(attempts).await);
    assert_eq!(count(&codes, "Unauthenticated"), 10, "{codes:?}");
    validate(&app.client, &fresh.access_token).await.unwrap();
}
