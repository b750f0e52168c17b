//! Upgrades and rollbacks under the compatibility contract: the previous release
//! (N-1, the binary named by `AUTHD_TEST_PREVIOUS_AUTHD`; `.ci/run` builds it from
//! the revision in `.ci/previous-release`) and this one on one database.
//!
//! - PostgreSQL: both serve at once, each on its own port, under a load that
//!   alternates between them; every credential one issues works on the other (users,
//!   access and refresh tokens, sessions ended by Logout, passwords changed, accounts
//!   disabled and enabled by the admin API, second factors), both ways; N-1 restarted
//!   on the schema this release migrated serves, and serves alone after a rollback.
//! - SQLite (one replica): restarted from N-1 to this release and back, under the
//!   same load, with what each wrote read by the other.
//!
//! - A hash the previous release cannot verify (an imported one, behind its marker):
//!   a wrong password there, a login here; a password N-1 sets wins over it.
//!
//! Verdicts are counts: no request of the load failed with a code a client would not
//! retry, no session was lost (each load session refreshes to the end).

use crate::{
    admin::{ADMIN_KEY, keys_file},
    helpers::{
        Backend, TEST_KEY, TEST_KID, TestApp, TestDb, key_spec, redis_url, service_url,
        spawn_app_on, unique_name, wait_until,
    },
    totp::{base32_decode, code_at},
};
use authd::{
    config::DatabaseUrl,
    pb::{
        BeginTotpEnrollmentRequest, ChangePasswordRequest, CompleteLoginRequest,
        ConfirmTotpEnrollmentRequest, IssueServiceTokenRequest, LoginRequest, LoginResponse,
        LogoutRequest, RefreshRequest, RegisterRequest, ValidateTokenRequest,
        ValidateTokenResponse,
        admin::{
            CreateServiceAccountRequest, DisableServiceAccountRequest, DisableUserRequest,
            EnableUserRequest, EndSessionsRequest, ServiceAccountSelector, SetPasswordRequest,
            UserSelector, admin_service_client::AdminServiceClient,
            service_account_selector::Selector as AccountSelector, user_selector::Selector,
        },
        auth_service_client::AuthServiceClient,
    },
};
use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};
use tonic::{Code, Request, Status, transport::Channel};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

const PASSWORD: &str = "a fine password";

/// A rule both versions enforce through one Redis window, never reached.
const RULES: &str = "*:global=1000000/1s";

/// The data key that seals second factors, the same on both versions.
fn data_keys() -> String {
    key_spec("upgrade", &[7u8; 32])
}

/// What both versions share beside the database: the admin keys, and Redis (its
/// rate-limit windows and login-throttle counts) under a prefix of the test's own.
struct Shared {
    admin_keys: tempfile::NamedTempFile,
    redis: Option<(String, String)>,
}

impl Shared {
    fn new(redis: Option<String>) -> Self {
        Shared {
            admin_keys: keys_file(),
            redis: redis.map(|url| (url, unique_name("authd-test-upgrade"))),
        }
    }
}

/// The previous release's binary, or `None` (the test then says it was skipped,
/// unless `AUTHD_TEST_REQUIRE_SERVICES=1`).
fn previous_release(test: &str) -> Option<PathBuf> {
    service_url("AUTHD_TEST_PREVIOUS_AUTHD", test).map(PathBuf::from)
}

/// A free port on 127.0.0.1 (free a moment ago: another process could take it, which
/// on a test machine's loopback it does not).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One replica of either version, as a client sees it.
#[derive(Clone)]
struct Replica {
    name: &'static str,
    auth: AuthServiceClient<Channel>,
    admin: AdminServiceClient<Channel>,
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"))
}

/// The previous release, in a process of its own on `db`, configured as this
/// release's test servers are.
struct Previous {
    child: Option<Child>,
    replica: Replica,
}

impl Previous {
    async fn start(binary: &Path, db: &TestDb, shared: &Shared) -> Self {
        let url = match &db.url {
            DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
            DatabaseUrl::Postgres(url) => url.expose().to_owned(),
        };
        let (grpc, health, admin) = (free_port(), free_port(), free_port());
        let mut command = crate::helpers::authd_command_of(binary);
        command
            .env("AUTHD_LISTEN", format!("127.0.0.1:{grpc}"))
            .env("AUTHD_HEALTH_LISTEN", format!("127.0.0.1:{health}"))
            .env("AUTHD_ADMIN_LISTEN", format!("127.0.0.1:{admin}"))
            .env("AUTHD_ADMIN_KEYS_FILE", shared.admin_keys.path())
            .env("AUTHD_METRICS_LISTEN", "")
            .env("AUTHD_DATABASE_URL", url)
            .env("AUTHD_TOKEN_KEYS", key_spec(TEST_KID, TEST_KEY))
            .env("AUTHD_DATA_KEYS", data_keys())
            .env("AUTHD_PBKDF2_ITERATIONS", "1000")
            .env("AUTHD_REGISTER_LIMIT", "off")
            .env("AUTHD_REFUSAL_HOLD", "0s")
            .env("AUTHD_LOG", "warn")
            .envs(shared.redis.iter().flat_map(|(url, prefix)| {
                [
                    ("AUTHD_REDIS_URL", url.clone()),
                    ("AUTHD_RATE_LIMIT_PREFIX", prefix.clone()),
                    ("AUTHD_RATE_LIMITS", RULES.to_owned()),
                ]
            }))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        let child = command.spawn().expect("the previous release starts");
        let health_addr: SocketAddr = format!("127.0.0.1:{health}").parse().unwrap();
        // SERVING on its health port, within a minute (an unoptimized build on a
        // busy machine).
        crate::helpers::wait_for("the previous release becomes SERVING", || async {
            let channel = Channel::from_shared(format!("http://{health_addr}"))
                .unwrap()
                .connect()
                .await
                .ok()?;
            let request = HealthCheckRequest {
                service: String::new(),
            };
            let answer = HealthClient::new(channel).check(request).await.ok()?;
            (answer.into_inner().status == ServingStatus::Serving as i32).then_some(())
        })
        .await;
        let replica = Replica {
            name: "N-1",
            auth: AuthServiceClient::new(
                channel(format!("127.0.0.1:{grpc}").parse().unwrap()).await,
            ),
            admin: AdminServiceClient::new(
                channel(format!("127.0.0.1:{admin}").parse().unwrap()).await,
            ),
        };
        Previous {
            child: Some(child),
            replica,
        }
    }

    /// SIGTERM, as Kubernetes stops a pod: it drains and exits 0.
    async fn stop(mut self) {
        let mut child = self.child.take().expect("running");
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let status = tokio::task::spawn_blocking(move || child.wait())
            .await
            .unwrap()
            .expect("the previous release exits");
        assert!(status.success(), "the previous release exited {status}");
    }
}

impl Drop for Previous {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// This release, in this process, on `db`, configured as the previous one.
async fn current(db: &TestDb, shared: &Shared) -> (TestApp, Replica) {
    let keys = shared.admin_keys.path().to_owned();
    let redis = shared.redis.clone();
    let app = spawn_app_on(db, move |c| {
        c.admin.admin_listen = "127.0.0.1:0".parse().unwrap();
        c.admin.admin_keys_file = Some(keys);
        c.second_factor.data_keys = Some(data_keys().parse().unwrap());
        if let Some((url, prefix)) = redis {
            c.limits.redis_url = Some(url.parse().unwrap());
            c.limits.rate_limit_prefix = prefix;
            c.limits.rate_limits = Some(RULES.parse().unwrap());
        }
    })
    .await;
    let admin = channel(app.handle.admin_addr().unwrap()).await;
    let replica = Replica {
        name: "N",
        auth: app.client.clone(),
        admin: AdminServiceClient::new(admin),
    };
    (app, replica)
}

fn admin_request<T>(message: T) -> Request<T> {
    let mut request = Request::new(message);
    let bearer = format!("Bearer {ADMIN_KEY}").parse().unwrap();
    request.metadata_mut().insert("authorization", bearer);
    request
}

fn by_name(name: &str) -> Option<UserSelector> {
    Some(UserSelector {
        selector: Some(Selector::Username(name.into())),
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

impl Replica {
    async fn register(&self, name: &str, password: &str) -> Result<String, Status> {
        let request = RegisterRequest {
            username: name.into(),
            password: password.into(),
        };
        Ok(self
            .auth
            .clone()
            .register(request)
            .await?
            .into_inner()
            .user_id)
    }

    async fn login(&self, name: &str, password: &str) -> Result<LoginResponse, Status> {
        let request = LoginRequest {
            username: name.into(),
            password: password.into(),
        };
        Ok(self.auth.clone().login(request).await?.into_inner())
    }

    async fn validate(&self, token: &str) -> Result<String, Status> {
        Ok(self.validate_all(token).await?.user_id)
    }

    /// ValidateToken's whole answer.
    async fn validate_all(&self, token: &str) -> Result<ValidateTokenResponse, Status> {
        let request = ValidateTokenRequest {
            access_token: token.into(),
            ..Default::default()
        };
        Ok(self
            .auth
            .clone()
            .validate_token(request)
            .await?
            .into_inner())
    }

    /// A client-credential grant of `client_id` with `client_secret`.
    async fn grant(&self, client_id: &str, client_secret: &str) -> Result<String, Status> {
        let request = IssueServiceTokenRequest {
            client_id: client_id.into(),
            client_secret: client_secret.into(),
            ..Default::default()
        };
        let answer = self.auth.clone().issue_service_token(request).await?;
        Ok(answer.into_inner().access_token)
    }

    /// A refresh: the new access and refresh tokens.
    async fn refresh(&self, refresh_token: &str) -> Result<(String, String), Status> {
        let request = RefreshRequest {
            refresh_token: refresh_token.into(),
        };
        let r = self.auth.clone().refresh(request).await?.into_inner();
        Ok((r.access_token, r.refresh_token))
    }

    async fn logout(&self, refresh_token: &str) -> Result<u32, Status> {
        let request = LogoutRequest {
            refresh_token: refresh_token.into(),
            ..Default::default()
        };
        Ok(self
            .auth
            .clone()
            .logout(request)
            .await?
            .into_inner()
            .sessions_ended)
    }
}

/// Every credential `a` issues works on `b`, and every end `a` makes holds on `b`.
async fn credentials_cross(a: &Replica, b: &Replica, tag: &str) {
    let what = format!("issued by {}, used on {}", a.name, b.name);
    let name = format!("cross-{tag}");
    // A user registered on one logs in on the other; tokens validate on both.
    let id = a.register(&name, PASSWORD).await.unwrap();
    let session = b.login(&name, PASSWORD).await.expect(&what);
    assert_eq!(session.user_id, id, "{what}");
    for replica in [a, b] {
        assert_eq!(
            replica.validate(&session.access_token).await.expect(&what),
            id
        );
    }
    // A refresh token rotates on either, back and forth.
    let (access, refresh) = a.refresh(&session.refresh_token).await.expect(&what);
    assert_eq!(b.validate(&access).await.expect(&what), id);
    let (_, refresh) = b.refresh(&refresh).await.expect(&what);
    let (access, refresh) = a.refresh(&refresh).await.expect(&what);
    // Logout on one ends the session on the other: its refresh token is refused at
    // once, its access token within the revocation delay.
    assert_eq!(b.logout(&refresh).await.expect(&what), 1);
    let refused = a.refresh(&refresh).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{what}: {refused:?}");
    let refused = format!("{what}: a logged-out session's token is refused");
    crate::helpers::wait_for(&refused, || async {
        let answer = a.validate(&access).await;
        answer
            .is_err_and(|s| s.code() == Code::Unauthenticated)
            .then_some(())
    })
    .await;

    // A password changed on one is the password on the other.
    let request = ChangePasswordRequest {
        username: name.clone(),
        current_password: PASSWORD.into(),
        new_password: "another fine password".into(),
    };
    a.auth.clone().change_password(request).await.expect(&what);
    let old = b.login(&name, PASSWORD).await.unwrap_err();
    assert_eq!(old.code(), Code::Unauthenticated, "{what}");
    b.login(&name, "another fine password").await.expect(&what);

    // An account disabled on one is disabled on the other; enabled likewise.
    let request = DisableUserRequest {
        user: by_name(&name),
        reason: "upgrade test".into(),
    };
    (a.admin.clone())
        .disable_user(admin_request(request))
        .await
        .expect(&what);
    let disabled = b.login(&name, "another fine password").await.unwrap_err();
    assert_eq!(disabled.code(), Code::Unauthenticated, "{what}");
    let request = EnableUserRequest {
        user: by_name(&name),
    };
    (b.admin.clone())
        .enable_user(admin_request(request))
        .await
        .expect(&what);
    let session = a.login(&name, "another fine password").await.expect(&what);

    // Sessions revoked by the admin API on one are ended on the other.
    let request = EndSessionsRequest {
        user: by_name(&name),
        session_ids: Vec::new(),
    };
    let ended = (b.admin.clone()).end_sessions(admin_request(request)).await;
    assert!(
        ended.expect(&what).into_inner().sessions_ended >= 1,
        "{what}"
    );
    let refused = a.refresh(&session.refresh_token).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{what}: {refused:?}");

    // A second factor enrolled across both is asked for by both, and a recovery
    // code given by one completes a login begun on the other.
    let factor = format!("factor-{tag}");
    a.register(&factor, PASSWORD).await.unwrap();
    let token = a.login(&factor, PASSWORD).await.unwrap().access_token;
    let request = BeginTotpEnrollmentRequest {
        access_token: token.clone(),
    };
    let begun = (a.auth.clone())
        .begin_totp_enrollment(request)
        .await
        .expect(&what);
    let secret = base32_decode(&begun.into_inner().secret);
    let request = ConfirmTotpEnrollmentRequest {
        access_token: token,
        code: code_at(&secret, unix_now()),
    };
    let confirmed = (b.auth.clone())
        .confirm_totp_enrollment(request)
        .await
        .expect(&what);
    let recovery = confirmed.into_inner().recovery_codes;
    for (replica, finisher) in [(a, b), (b, a)] {
        let answer = replica.login(&factor, PASSWORD).await.expect(&what);
        assert!(answer.second_factor_required, "{what}");
        let request = CompleteLoginRequest {
            challenge: answer.challenge,
            code: recovery[usize::from(replica.name == b.name)].clone(),
        };
        let done = (finisher.auth.clone())
            .complete_login(request)
            .await
            .expect(&what);
        let done = done.into_inner();
        assert!(!done.access_token.is_empty(), "{what}");
        replica.validate(&done.access_token).await.expect(&what);
    }
}

/// What the load saw: calls by outcome, and sessions that could no longer refresh.
#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    retryable: usize,
    failed: Vec<String>,
    sessions_lost: usize,
}

/// Codes a client retries (the server was restarting, full or slow), and a call
/// whose connection broke under it: a stopping replica's last packets can cross a
/// request sent as its GOAWAY was on the way, and the kernel answers that request
/// with a reset (gRPC's own clients report UNAVAILABLE; tonic reports UNKNOWN with
/// the transport error as its source). None of them loses anything unseen: a
/// refresh rotated by the server whose answer was lost is reused on the retry,
/// which ends its session, and the load counts that session lost.
fn retryable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::ResourceExhausted | Code::DeadlineExceeded | Code::Cancelled
    ) || broken_connection(status)
}

fn broken_connection(status: &Status) -> bool {
    status.code() == Code::Unknown
        && std::error::Error::source(status)
            .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some())
}

/// A load of `workers` users, each registering on one replica and then logging in,
/// refreshing and validating on whichever replica `replicas` names at that moment,
/// until `done`; every refresh token is rotated on a replica other than the one that
/// issued it whenever there are two.
struct Load {
    task: tokio::task::JoinHandle<Tally>,
    /// Successful answers so far.
    served: Arc<AtomicUsize>,
    done: Arc<AtomicBool>,
}

impl Load {
    /// Returns once the load has had `n` more successful answers than now: proof that
    /// the replicas it has now served it.
    async fn served_again(&self, n: usize) {
        let before = self.served.load(Ordering::SeqCst);
        let served = self.served.clone();
        wait_until("the load is served", || {
            served.load(Ordering::SeqCst) >= before + n
        })
        .await;
    }

    async fn finish(self) -> Tally {
        self.done.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

fn load(replicas: Arc<Mutex<Vec<Replica>>>, workers: usize, prefix: &str) -> Load {
    let prefix = prefix.to_owned();
    let done = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let (stop, counter) = (done.clone(), served.clone());
    let task = tokio::spawn(async move {
        let (done, served) = (stop, counter);
        let tasks: Vec<_> = (0..workers)
            .map(|w| {
                let (replicas, done, prefix) = (replicas.clone(), done.clone(), prefix.clone());
                let served = served.clone();
                tokio::spawn(async move {
                    let mut tally = Tally::default();
                    let pick = |turn: usize| {
                        let replicas = replicas.lock().unwrap();
                        replicas[turn % replicas.len()].clone()
                    };
                    let note = |result: Result<(), Status>, tally: &mut Tally| match result {
                        Ok(()) => {
                            served.fetch_add(1, Ordering::SeqCst);
                            tally.ok += 1;
                        }
                        Err(s) if retryable(&s) => tally.retryable += 1,
                        Err(s) => tally.failed.push(format!("{s:?}")),
                    };
                    let name = format!("{prefix}-{w}");
                    // A client's pause before it retries: a replica may be restarting.
                    let pause = || tokio::time::sleep(Duration::from_millis(20));
                    // Registered once, retried while the replicas restart.
                    let mut turn = w;
                    loop {
                        match pick(turn).register(&name, PASSWORD).await {
                            Ok(_) => break,
                            Err(s) if retryable(&s) => {
                                turn += 1;
                                pause().await;
                            }
                            Err(s) if s.code() == Code::AlreadyExists => break,
                            Err(s) => {
                                tally.failed.push(format!("register: {s:?}"));
                                return tally;
                            }
                        }
                    }
                    let mut refresh = None;
                    while !done.load(Ordering::SeqCst) {
                        turn += 1;
                        let replica = pick(turn);
                        let Some(token) = refresh.clone() else {
                            match replica.login(&name, PASSWORD).await {
                                Ok(session) => {
                                    refresh = Some(session.refresh_token);
                                    note(Ok(()), &mut tally);
                                }
                                Err(s) => {
                                    note(Err(s), &mut tally);
                                    pause().await;
                                }
                            }
                            continue;
                        };
                        match replica.refresh(&token).await {
                            Ok((access, next)) => {
                                refresh = Some(next);
                                note(Ok(()), &mut tally);
                                let other = pick(turn + 1);
                                note(other.validate(&access).await.map(drop), &mut tally);
                            }
                            // The answer may have been lost with a replica stopping
                            // after it rotated: the session is then reused, ended,
                            // and counted lost.
                            Err(s) if retryable(&s) => {
                                tally.retryable += 1;
                                pause().await;
                            }
                            Err(s) => {
                                tally.sessions_lost += 1;
                                tally.failed.push(format!("refresh: {s:?}"));
                                refresh = None;
                            }
                        }
                    }
                    tally
                })
            })
            .collect();
        let mut all = Tally::default();
        for task in tasks {
            let t = task.await.unwrap();
            all.ok += t.ok;
            all.retryable += t.retryable;
            all.failed.extend(t.failed);
            all.sessions_lost += t.sessions_lost;
        }
        all
    });
    Load { task, served, done }
}

/// How long each phase keeps its load running once the test has what it needs:
/// `AUTHD_TEST_UPGRADE_HOLD` (e.g. `30s`) for a soak run, none otherwise (CI). The
/// verdict is the same counts either way.
async fn hold() {
    if let Ok(hold) = std::env::var("AUTHD_TEST_UPGRADE_HOLD") {
        let hold = humantime::parse_duration(&hold).expect("AUTHD_TEST_UPGRADE_HOLD is a duration");
        tokio::time::sleep(hold).await;
    }
}

/// The load's verdict: something was served, and nothing failed for good.
fn assert_nothing_lost(tally: &Tally) {
    // Shown with --nocapture: what a soak run reports.
    println!(
        "the load: {} answered OK, {} refused with a code clients retry, {} failed, {} \
         sessions lost",
        tally.ok,
        tally.retryable,
        tally.failed.len(),
        tally.sessions_lost
    );
    assert!(tally.ok > 0, "{tally:?}");
    assert!(
        tally.failed.is_empty(),
        "failed with a code no client retries: {tally:?}"
    );
    assert_eq!(tally.sessions_lost, 0, "{tally:?}");
}

/// The previous release's binary, a PostgreSQL database and the settings both
/// versions share (Redis when configured) for `test`; `None` (the test is skipped)
/// without the binary or PostgreSQL.
async fn on_postgres(test: &str) -> Option<(PathBuf, TestDb, Shared)> {
    let previous = previous_release(test)?;
    let db = TestDb::new(Backend::Postgres, test).await?;
    Some((previous, db, Shared::new(redis_url(test))))
}

#[tokio::test]
async fn both_versions_serve_one_postgres_database_and_every_credential_crosses() {
    let Some((previous, db, shared)) =
        on_postgres("both_versions_serve_one_postgres_database").await
    else {
        return;
    };
    // N-1 first, on a fresh database: it creates the schema it knows.
    let old = Previous::start(&previous, &db, &shared).await;
    old.replica
        .register("before-upgrade", PASSWORD)
        .await
        .unwrap();
    // This release joins it, migrating the schema while N-1 serves.
    let (mut app, new) = current(&db, &shared).await;
    let replicas = Arc::new(Mutex::new(vec![old.replica.clone(), new.clone()]));
    let running = load(replicas.clone(), 8, "mixed");

    credentials_cross(&old.replica, &new, "old-to-new").await;
    credentials_cross(&new, &old.replica, "new-to-old").await;
    // Failed logins counted by one are counted by the other (the throttle's Redis
    // keys and scripts are the same): five wrong passwords on N-1, and N refuses the
    // sixth attempt before hashing it.
    old.replica.register("guessed", PASSWORD).await.unwrap();
    for _ in 0..5 {
        let wrong = old
            .replica
            .login("guessed", "not the password")
            .await
            .unwrap_err();
        assert_eq!(wrong.code(), Code::Unauthenticated);
    }
    let throttled = new.login("guessed", PASSWORD).await.unwrap_err();
    assert_eq!(throttled.code(), Code::ResourceExhausted, "{throttled:?}");
    assert!(
        throttled.message().contains("failed logins"),
        "{throttled:?}"
    );
    new.login("before-upgrade", PASSWORD).await.unwrap();
    running.served_again(50).await;
    hold().await;

    // N-1 restarted on the migrated schema serves (a pod rescheduled mid-rollout).
    replicas.lock().unwrap().retain(|r| r.name == "N");
    old.stop().await;
    let old = Previous::start(&previous, &db, &shared).await;
    replicas.lock().unwrap().push(old.replica.clone());
    let cross = old
        .replica
        .login("cross-new-to-old", "another fine password");
    cross.await.unwrap();
    running.served_again(50).await;
    hold().await;

    // The rollback: this release stops, N-1 serves alone every user either created.
    replicas.lock().unwrap().retain(|r| r.name == "N-1");
    app.begin_shutdown();
    app.stop().await.unwrap();
    running.served_again(50).await;
    for name in ["before-upgrade", "factor-old-to-new", "factor-new-to-old"] {
        let answer = old.replica.login(name, PASSWORD).await.unwrap();
        assert_eq!(answer.second_factor_required, name.starts_with("factor"));
    }
    let tally = running.finish().await;
    assert_nothing_lost(&tally);
    old.stop().await;
}

/// docs/upgrades.md, "Service accounts": N-1 beside this release on one PostgreSQL
/// database whose schema this release migrated (service accounts' tables, level 3, and
/// the account events', level 4):
/// N-1 restarted on it serves, accepts a service token this release issued as a
/// token of user `service:NAME` with the account's id, refuses it once the account
/// is disabled (the cutoff it already reads), and answers IssueServiceToken with
/// UNIMPLEMENTED.
#[tokio::test]
async fn the_previous_release_serves_beside_service_accounts_on_postgres() {
    let test = "the_previous_release_serves_beside_service_accounts";
    let Some((previous, db, shared)) = on_postgres(test).await else {
        return;
    };
    // N-1 first, on a fresh database; this release joins it and migrates the schema.
    let old = Previous::start(&previous, &db, &shared).await;
    let (mut app, new) = current(&db, &shared).await;
    let created = new
        .admin
        .clone()
        .create_service_account(admin_request(CreateServiceAccountRequest {
            name: "orders".into(),
            audiences: vec!["billing".into()],
            scopes: vec!["read".into()],
            with_secret: true,
            ..Default::default()
        }))
        .await
        .expect("this release creates a service account")
        .into_inner();
    let account_id = created.account.expect("the account").id;
    let token = new.grant("orders", &created.client_secret).await.unwrap();

    // The schema is at this release's level (the service accounts' tables at 3, the
    // account events' at 4), and 0.1.0 may run on it.
    let migrate = |args: &[&str]| {
        let DatabaseUrl::Postgres(url) = &db.url else {
            unreachable!("a PostgreSQL database")
        };
        crate::helpers::authd_command()
            .arg("migrate")
            .args(args)
            .env("AUTHD_DATABASE_URL", url.expose())
            .output()
            .unwrap()
    };
    let status = migrate(&["--status"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(status.status.success(), "{status:?}");
    // This release's level: its last compatible migration.
    let known = std::fs::read_dir(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/postgres/compatible"
    ))
    .unwrap()
    .count();
    let level = format!("compatible migrations: level {known}");
    assert!(text.contains(&level), "{text}");
    let rollback = migrate(&["--check-rollback", "0.1.0"]);
    assert!(rollback.status.success(), "{rollback:?}");

    // N-1 restarted on the migrated schema (a pod rescheduled mid-rollout) serves.
    old.stop().await;
    let old = Previous::start(&previous, &db, &shared).await;
    old.replica
        .register("after-upgrade", PASSWORD)
        .await
        .unwrap();
    let session = old.replica.login("after-upgrade", PASSWORD).await.unwrap();
    new.validate(&session.access_token).await.unwrap();

    // The service token: a token of user service:orders, the account's id, on N-1.
    let answer = old
        .replica
        .validate_all(&token)
        .await
        .expect("N-1 accepts it");
    assert_eq!(answer.user_id, account_id);
    assert_eq!(answer.username, "service:orders");
    let answer = new.validate_all(&token).await.unwrap();
    assert_eq!(
        (answer.user_id.as_str(), answer.client_id.as_str()),
        (account_id.as_str(), "orders")
    );
    assert!(answer.service);

    // N-1 grants nothing.
    let refused = old
        .replica
        .grant("orders", &created.client_secret)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unimplemented, "{refused:?}");

    // Disabled on this release: both refuse the token, N-1 within the revocation delay.
    new.admin
        .clone()
        .disable_service_account(admin_request(DisableServiceAccountRequest {
            account: Some(ServiceAccountSelector {
                selector: Some(AccountSelector::Name("orders".into())),
            }),
            reason: "upgrade test".into(),
        }))
        .await
        .unwrap();
    let refused = new.validate(&token).await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated);
    crate::helpers::wait_for("N-1 refuses the disabled account's token", || async {
        let answer = old.replica.validate(&token).await;
        answer
            .err()
            .map(|status| assert_eq!(status.code(), Code::Unauthenticated))
    })
    .await;
    app.begin_shutdown();
    app.stop().await.unwrap();
    old.stop().await;
}

#[tokio::test]
async fn one_sqlite_replica_restarted_on_either_version_keeps_every_session() {
    let test = "one_sqlite_replica_restarted_on_either_version";
    let Some(previous) = previous_release(test) else {
        return;
    };
    let db = TestDb::new(Backend::Sqlite, test).await.unwrap();
    let shared = Shared::new(None);
    let replicas = Arc::new(Mutex::new(Vec::new()));

    // N-1 creates the database and serves; the load starts on it.
    let old = Previous::start(&previous, &db, &shared).await;
    replicas.lock().unwrap().push(old.replica.clone());
    let running = load(replicas.clone(), 8, "restarted");
    old.replica.register("by-old", PASSWORD).await.unwrap();
    let old_session = old.replica.login("by-old", PASSWORD).await.unwrap();
    running.served_again(50).await;
    hold().await;

    // Restarted as this release: what N-1 wrote is read, its sessions refresh.
    old.stop().await;
    let (mut app, new) = current(&db, &shared).await;
    *replicas.lock().unwrap() = vec![new.clone()];
    let (_, refresh) = new.refresh(&old_session.refresh_token).await.unwrap();
    new.register("by-new", PASSWORD).await.unwrap();
    let new_session = new.login("by-new", PASSWORD).await.unwrap();
    running.served_again(50).await;
    hold().await;

    // And back to N-1, on the schema this release migrated.
    app.begin_shutdown();
    app.stop().await.unwrap();
    let old = Previous::start(&previous, &db, &shared).await;
    *replicas.lock().unwrap() = vec![old.replica.clone()];
    old.replica.refresh(&refresh).await.unwrap();
    old.replica
        .refresh(&new_session.refresh_token)
        .await
        .unwrap();
    old.replica.login("by-new", PASSWORD).await.unwrap();
    running.served_again(50).await;
    let tally = running.finish().await;
    assert_nothing_lost(&tally);
    old.stop().await;
}

#[tokio::test]
async fn a_hash_the_previous_release_cannot_verify_is_a_wrong_password_there_and_a_password_it_sets_wins()
 {
    let test = "a_hash_the_previous_release_cannot_verify";
    let Some(previous) = previous_release(test) else {
        return;
    };
    let Some(db) = TestDb::new(Backend::Postgres, test).await else {
        return;
    };
    let shared = Shared::new(None);
    let old = Previous::start(&previous, &db, &shared).await;
    // This release migrates the schema (the ext column) while N-1 serves.
    let (mut app, new) = current(&db, &shared).await;
    // Two users as an import leaves them: a marker, and a bcrypt hash beside it.
    let imported = crate::foreign_login::record("bcrypt-2b", "correct horse battery staple");
    for name in ["imported-a", "imported-b"] {
        new.register(name, PASSWORD).await.unwrap();
        let marker = crate::foreign_login::marker();
        let set = "UPDATE users SET password_hash = $1, password_hash_ext = $2 WHERE username = $3";
        let args = [
            Some(marker.as_str()),
            Some(imported.hash.as_str()),
            Some(name),
        ];
        assert_eq!(crate::foreign_login::run(&db, set, &args).await, 1);
    }

    // N-1 verifies the marker: a wrong password, whichever password is sent.
    for password in [imported.password.as_str(), PASSWORD] {
        let refused = old.replica.login("imported-a", password).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    }
    // This release verifies the imported hash and rehashes it; from then on N-1
    // verifies it too.
    new.login("imported-a", &imported.password).await.unwrap();
    old.replica
        .login("imported-a", &imported.password)
        .await
        .unwrap();

    // A password N-1 sets replaces the marker: the imported hash counts for nothing.
    let set = SetPasswordRequest {
        user: by_name("imported-b"),
        new_password: "set by the previous release".into(),
        keep_sessions: false,
    };
    old.replica
        .admin
        .clone()
        .set_password(admin_request(set))
        .await
        .unwrap();
    new.login("imported-b", "set by the previous release")
        .await
        .unwrap();
    let refused = new
        .login("imported-b", &imported.password)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

    app.begin_shutdown();
    app.stop().await.unwrap();
    old.stop().await;
}
