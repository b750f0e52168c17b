//! Spawns authd on 127.0.0.1:0 with a database of its own (a SQLite file, or a
//! PostgreSQL schema) and gives typed clients.
//!
//! Logs stay quiet unless `TEST_LOG` is set (`TEST_LOG=1 cargo test`).

use authd::{
    app::{AppHandle, Application},
    config::{Config, DatabaseUrl},
    pb::auth_service_client::AuthServiceClient,
};
use sqlx::{Connection, PgConnection, SqliteConnection, sqlite::SqliteConnectOptions};
use std::{
    path::Path,
    sync::{Arc, Once},
    time::Duration,
};
use tokio::{sync::oneshot, task::JoinHandle};
use tonic::{Code, Status, transport::Channel};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// The test key ring: kid `test`, a 32-byte key, known to the tests so that an
/// independent JWT library can check authd's tokens.
pub const TEST_KID: &str = "test";
pub const TEST_KEY: &[u8; 32] = b"0123456789abcdef0123456789abcdef";
/// Cheap hashes: the minimum PBKDF2 allows.
pub const FAST_ITERATIONS: u32 = 1000;
/// A hash that takes half a second or more (a single stream of the fastest engine
/// here), to hold a hash thread busy; tests that race it allow it at most half of that.
pub const SLOW_ITERATIONS: u32 = 5_000_000;

pub fn key_spec(kid: &str, key: &[u8]) -> String {
    use base64::Engine as _;
    format!(
        "{kid}:{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}

fn init_logs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("TEST_LOG").is_some() {
            let _ = authd::init_logging("info,authd=debug", authd::config::LogFormat::Text);
        }
    });
}

/// The database a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A database of one test's own: a SQLite file in a temporary directory, or a
/// PostgreSQL schema, dropped when the last clone goes. Clones share it, so an app
/// restarted on the same `TestDb` sees the data of the one before.
#[derive(Clone)]
pub struct TestDb {
    pub url: DatabaseUrl,
    _dir: Arc<tempfile::TempDir>,
    _schema: Option<Arc<PgSchema>>,
}

impl TestDb {
    /// A fresh database, or `None` when `backend` is PostgreSQL and no test server
    /// is configured (the test is then skipped; see [`service_url`]).
    pub async fn new(backend: Backend, test: &str) -> Option<Self> {
        let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
        match backend {
            Backend::Sqlite => Some(Self {
                url: DatabaseUrl::Sqlite(dir.path().join("authd.db")),
                _dir: dir,
                _schema: None,
            }),
            Backend::Postgres => {
                let base = postgres_url(test)?;
                let schema = PgSchema::create(&base).await;
                let separator = if base.contains('?') { '&' } else { '?' };
                let url = format!("{base}{separator}options[search_path]={}", schema.name);
                Some(Self {
                    url: url.parse().expect("a valid PostgreSQL URL"),
                    _dir: dir,
                    _schema: Some(Arc::new(schema)),
                })
            }
        }
    }

    /// Runs one statement against the database, behind authd's back.
    pub async fn execute(&self, statement: &'static str) {
        match &self.url {
            DatabaseUrl::Sqlite(path) => {
                let mut conn =
                    SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(path))
                        .await
                        .expect("open the database file");
                sqlx::query(statement)
                    .execute(&mut conn)
                    .await
                    .expect("run the statement");
                conn.close().await.ok();
            }
            DatabaseUrl::Postgres(url) => {
                let mut conn = PgConnection::connect(url.expose())
                    .await
                    .expect("connect to PostgreSQL");
                sqlx::query(statement)
                    .execute(&mut conn)
                    .await
                    .expect("run the statement");
                conn.close().await.ok();
            }
        }
    }

    /// A user's stored password hash, read straight from the database.
    pub async fn stored_hash(&self, username: &str) -> Option<String> {
        match &self.url {
            DatabaseUrl::Sqlite(path) => {
                let options = SqliteConnectOptions::new().filename(path).read_only(true);
                let conn = SqliteConnection::connect_with(&options)
                    .await
                    .expect("open the database file");
                password_hash_of(conn, username).await
            }
            DatabaseUrl::Postgres(url) => {
                let conn = PgConnection::connect(url.expose())
                    .await
                    .expect("connect to PostgreSQL");
                password_hash_of(conn, username).await
            }
        }
    }
}

/// `username`'s stored password hash, over either backend's connection (closed after).
async fn password_hash_of<C>(mut conn: C, username: &str) -> Option<String>
where
    C: Connection,
    for<'c> &'c mut C: sqlx::Executor<'c, Database = C::Database>,
    <C::Database as sqlx::Database>::Arguments: sqlx::IntoArguments<C::Database>,
    String: sqlx::Type<C::Database> + for<'r> sqlx::Decode<'r, C::Database>,
    usize: sqlx::ColumnIndex<<C::Database as sqlx::Database>::Row>,
    for<'q> &'q str: sqlx::Type<C::Database> + sqlx::Encode<'q, C::Database>,
{
    let hash =
        sqlx::query_scalar::<_, String>("SELECT password_hash FROM users WHERE username = $1")
            .bind(username)
            .fetch_optional(&mut conn)
            .await
            .expect("query the database");
    conn.close().await.ok();
    hash
}

/// The field violations of a refused request, as (field, description) pairs.
pub fn violations(status: &Status) -> Vec<(String, String)> {
    use tonic_types::StatusExt as _;
    let details = status.check_error_details().expect("error details decode");
    details
        .bad_request()
        .expect("a google.rpc.BadRequest detail")
        .field_violations
        .iter()
        .map(|v| (v.field.clone(), v.description.clone()))
        .collect()
}

/// A PostgreSQL schema for one test, dropped (with everything in it) on drop.
pub struct PgSchema {
    admin_url: String,
    pub name: String,
}

impl PgSchema {
    pub async fn create(admin_url: &str) -> Self {
        let name = unique_name("authd_test");
        let mut conn = PgConnection::connect(admin_url)
            .await
            .expect("connect to the test PostgreSQL");
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}")))
            .execute(&mut conn)
            .await
            .expect("create the test schema");
        conn.close().await.ok();
        Self {
            admin_url: admin_url.to_owned(),
            name,
        }
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let (url, name) = (self.admin_url.clone(), self.name.clone());
        // Drop runs inside the test's runtime, which cannot be blocked on: use a
        // thread with a runtime of its own.
        let dropped = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut conn = PgConnection::connect(&url).await?;
                sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS {name} CASCADE"
                )))
                .execute(&mut conn)
                .await?;
                conn.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test schema {}: {dropped:?}", self.name);
        }
    }
}

/// Declares each listed `async fn NAME(db: TestDb)` as two tests, `sqlite::NAME`
/// and `postgres::NAME`: one body, both backends.
#[macro_export]
macro_rules! backend_tests {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    use $crate::helpers::{Backend, TestDb};
                    if let Some(db) = TestDb::new(Backend::Sqlite, stringify!($name)).await {
                        super::$name(db).await;
                    }
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    use $crate::helpers::{Backend, TestDb};
                    if let Some(db) = TestDb::new(Backend::Postgres, stringify!($name)).await {
                        super::$name(db).await;
                    }
                }
            )*
        }
    };
}

/// The configuration every test starts from: port 0, the given database, fast hashes.
pub fn test_config(url: DatabaseUrl) -> Config {
    let mut config = Config::defaults();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    // Every test app serves its own metrics, on a port of its own.
    config.telemetry.metrics_listen = "127.0.0.1:0".parse().unwrap();
    // And its own health-only port.
    config.server.health_listen = "127.0.0.1:0".parse().unwrap();
    config.store.database_url = url;
    config.passwords.pbkdf2_iterations = FAST_ITERATIONS;
    config.tokens.token_keys = Some(key_spec(TEST_KID, TEST_KEY).parse().unwrap());
    config.server.health_interval = Duration::from_millis(200);
    config.server.drain_timeout = Duration::from_secs(10);
    // The engine's built-in plan: measuring the kernels (about 0.2 s of a core) at each
    // test server's start would only slow the suite; it has tests of its own.
    config.passwords.hash_kernels = authd::config::HashKernels::Builtin;
    // Tests register many users from one address; the default limit on Register
    // has tests of its own (`concurrency`).
    config.limits.register_limit = authd::RegisterLimit::OFF;
    // Refusals answered at once: tests count refusals as they come; holding them
    // (pushback) has tests of its own (`overload`).
    config.overload.refusal_hold = Duration::ZERO;
    config
}

pub struct TestApp {
    pub addr: std::net::SocketAddr,
    pub client: AuthServiceClient<Channel>,
    pub health: HealthClient<Channel>,
    pub handle: AppHandle,
    /// Keeps the database (its directory, or its schema) alive as long as the app.
    _db: TestDb,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

/// A fresh app on a new SQLite database with default test settings.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// A fresh app on a new SQLite database, with settings adjusted by `adjust`.
pub async fn spawn_app_with(adjust: impl FnOnce(&mut Config)) -> TestApp {
    let db = TestDb::new(Backend::Sqlite, "")
        .await
        .expect("SQLite is always there");
    spawn_app_on(&db, adjust).await
}

/// An app on `db` (which another app may have used), adjusted by `adjust`.
pub async fn spawn_app_on(db: &TestDb, adjust: impl FnOnce(&mut Config)) -> TestApp {
    init_logs();
    let mut config = test_config(db.url.clone());
    adjust(&mut config);
    let Started {
        addr,
        handle,
        shutdown,
        task,
    } = start(config).await;
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .expect("connect to the app");
    TestApp {
        addr,
        client: AuthServiceClient::new(channel.clone()),
        health: HealthClient::new(channel),
        handle,
        _db: db.clone(),
        shutdown: Some(shutdown),
        task: Some(task),
    }
}

/// An app built from `config`, serving on its own task until `shutdown` fires (or
/// is dropped).
pub struct Started {
    pub addr: std::net::SocketAddr,
    pub handle: AppHandle,
    pub shutdown: oneshot::Sender<()>,
    pub task: JoinHandle<anyhow::Result<()>>,
}

impl Started {
    /// Shuts the app down gracefully and waits (at most 30 s) for its end.
    pub async fn stop(self) -> anyhow::Result<()> {
        let _ = self.shutdown.send(());
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the app stops in time")
            .expect("the app task does not panic")
    }
}

pub async fn start(config: Config) -> Started {
    let app = Application::build(config).await.expect("the app builds");
    let addr = app.local_addr();
    let handle = app.handle();
    let (shutdown, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    Started {
        addr,
        handle,
        shutdown,
        task,
    }
}

impl TestApp {
    /// A new connection of its own to the app.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect()
            .await
            .expect("connect to the app")
    }

    /// Starts the graceful shutdown without waiting for it.
    pub fn begin_shutdown(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
    }

    /// Shuts down and waits until the app has stopped; returns how it ended.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.begin_shutdown();
        let task = self.task.take().expect("stopped once");
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("the app stops within 30 s")
            .expect("the app task does not panic")
    }

    pub async fn register(&mut self, username: &str, password: &str) -> Result<String, Status> {
        register(&mut self.client, username, password).await
    }

    pub async fn login(
        &mut self,
        username: &str,
        password: &str,
    ) -> Result<authd::pb::LoginResponse, Status> {
        login(&mut self.client, username, password).await
    }

    pub async fn validate(
        &mut self,
        token: &str,
    ) -> Result<authd::pb::ValidateTokenResponse, Status> {
        self.client
            .validate_token(authd::pb::ValidateTokenRequest {
                access_token: token.into(),
                ..Default::default()
            })
            .await
            .map(|r| r.into_inner())
    }

    /// Waits until this replica refuses `token` as UNAUTHENTICATED (as a revocation
    /// made on another one reaches it); any other refusal fails the test.
    pub async fn until_refused(&self, token: &str) {
        wait_for("the token is refused", || {
            let mut client = self.client.clone();
            async move {
                let answer = client
                    .validate_token(authd::pb::ValidateTokenRequest {
                        access_token: token.into(),
                        ..Default::default()
                    })
                    .await;
                match answer {
                    Ok(_) => None,
                    Err(status) if status.code() == Code::Unauthenticated => Some(()),
                    Err(other) => panic!("refused otherwise: {other:?}"),
                }
            }
        })
        .await
    }

    /// The health status of `service` ("" for the whole server).
    pub async fn health_status(&mut self, service: &str) -> ServingStatus {
        health_of(&mut self.health, service).await
    }

    /// Waits until the health status of `service` ("" for the whole server) is
    /// `status`.
    pub async fn until_health_is(&self, service: &str, status: ServingStatus) {
        let what = format!("the health of {service:?} is {status:?}");
        wait_for(&what, || {
            let mut health = self.health.clone();
            async move { (health_of(&mut health, service).await == status).then_some(()) }
        })
        .await
    }
}

/// The health status of `service` on `health`.
async fn health_of(health: &mut HealthClient<Channel>, service: &str) -> ServingStatus {
    let response = health
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health answers");
    ServingStatus::try_from(response.into_inner().status).expect("a known status")
}

pub async fn register(
    client: &mut AuthServiceClient<Channel>,
    username: &str,
    password: &str,
) -> Result<String, Status> {
    client
        .register(authd::pb::RegisterRequest {
            username: username.into(),
            password: password.into(),
        })
        .await
        .map(|r| r.into_inner().user_id)
}

/// `count` registrations at once on `client`, each on a task of its own, of the
/// users `{prefix}-0`, `{prefix}-1`, …: their answers (the new user ids).
pub fn spawn_registrations(
    client: &AuthServiceClient<Channel>,
    prefix: &str,
    count: usize,
    password: &str,
) -> Vec<JoinHandle<Result<String, Status>>> {
    (0..count)
        .map(|i| {
            let (mut client, username) = (client.clone(), format!("{prefix}-{i}"));
            let password = password.to_owned();
            tokio::spawn(async move { register(&mut client, &username, &password).await })
        })
        .collect()
}

pub async fn login(
    client: &mut AuthServiceClient<Channel>,
    username: &str,
    password: &str,
) -> Result<authd::pb::LoginResponse, Status> {
    client
        .login(authd::pb::LoginRequest {
            username: username.into(),
            password: password.into(),
        })
        .await
        .map(|r| r.into_inner())
}

/// Asserts the code of a failed call and returns its status.
#[track_caller]
pub fn expect_code<T: std::fmt::Debug>(result: Result<T, Status>, code: Code) -> Status {
    match result {
        Ok(v) => panic!("expected {code:?}, got OK: {v:?}"),
        Err(status) => {
            assert_eq!(status.code(), code, "unexpected status: {status:?}");
            status
        }
    }
}

/// How many of `results` succeeded and how many found the name taken.
pub fn ok_and_taken<T>(results: &[Result<T, Status>]) -> (usize, usize) {
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let taken = results
        .iter()
        .filter(|r| matches!(r, Err(s) if s.code() == Code::AlreadyExists))
        .count();
    (ok, taken)
}

/// The `authd` binary, with none of the test runner's `AUTHD_*` (or `OTEL_*`) variables: only
/// what a test sets.
pub fn authd_command() -> std::process::Command {
    authd_command_of(Path::new(env!("CARGO_BIN_EXE_authd")))
}

/// An `authd` binary (this release's, or another's), as [`authd_command`].
pub fn authd_command_of(binary: &Path) -> std::process::Command {
    let mut cmd = std::process::Command::new(binary);
    for (key, _) in std::env::vars_os() {
        let key_text = key.to_string_lossy();
        if key_text.starts_with("AUTHD_") || key_text.starts_with("OTEL_") {
            cmd.env_remove(key);
        }
    }
    // Never the default health port (0.0.0.0:50052): tests run side by side.
    cmd.env("AUTHD_HEALTH_LISTEN", "127.0.0.1:0");
    // No kernel measurement at each start (see `test_config`).
    cmd.env("AUTHD_HASH_KERNELS", "builtin");
    cmd
}

/// The value of one series in the Prometheus text format, e.g.
/// `authd_connections_open{listener="grpc"}` (labels as the encoder writes them).
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

/// [`metric`] of a series that must be in `text`.
pub fn metric_of(text: &str, series: &str) -> f64 {
    metric(text, series).unwrap_or_else(|| panic!("no {series} in:\n{text}"))
}

/// Polls `condition` every few milliseconds until it holds; fails the test if it
/// still does not after 30 s (something that never happens, not a time asserted).
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    wait_for(what, || std::future::ready(condition().then_some(()))).await
}

/// Polls `probe` (which may ask the server, the database…) every few
/// milliseconds until it finds something, and returns it; fails the test if it
/// still finds nothing after 30 s.
pub async fn wait_for<T, F>(what: &str, mut probe: impl FnMut() -> F) -> T
where
    F: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The URL of an external test service from `var`, or `None` when it is not set:
/// the test then prints one line and passes, unless `AUTHD_TEST_REQUIRE_SERVICES=1`
/// (as in CI), when a missing service fails the run.
pub fn service_url(var: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            skipped(test, &format!("{var} is not set"));
            None
        }
    }
}

/// `test` cannot run because `what` (e.g. "nginx is not installed"): says it is
/// skipped (one line), or fails it under `AUTHD_TEST_REQUIRE_SERVICES=1` (as in CI).
pub fn skipped(test: &str, what: &str) {
    let required = std::env::var("AUTHD_TEST_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "{what} and AUTHD_TEST_REQUIRE_SERVICES=1: cannot run {test}"
    );
    eprintln!("skipped {test}: {what}");
}

/// `AUTHD_TEST_REDIS_URL`, e.g. `redis://127.0.0.1:6379`.
pub fn redis_url(test: &str) -> Option<String> {
    service_url("AUTHD_TEST_REDIS_URL", test)
}

/// `AUTHD_TEST_POSTGRES_URL`, e.g. `postgres://postgres@127.0.0.1:5432/test`.
pub fn postgres_url(test: &str) -> Option<String> {
    service_url("AUTHD_TEST_POSTGRES_URL", test)
}

/// A name no other test (or test run) uses: for key prefixes and schemas.
pub fn unique_name(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::now_v7().simple())
}

/// A TCP proxy in front of a server, which a test can cut (every connection
/// dropped, new ones refused: a database that is down), stall (connections kept
/// open, new ones accepted, but no byte forwarded either way: a database that is
/// black-holed, unreachable without a word) and restore.
pub struct TcpProxy {
    pub addr: std::net::SocketAddr,
    open: Arc<std::sync::atomic::AtomicBool>,
    /// `true` while no byte is forwarded.
    stalled: tokio::sync::watch::Sender<bool>,
    connections: Arc<std::sync::Mutex<Vec<JoinHandle<()>>>>,
    /// Connections let through, ever.
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    accept: JoinHandle<()>,
}

/// Copies `from` to `to` until `from` closes, holding every byte read while the
/// proxy is stalled (as a black hole would, until it is lifted).
async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if stalled.wait_for(|stalled| !stalled).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

impl TcpProxy {
    /// A proxy in front of the server `url` names, and `url` with the proxy in the
    /// server's place (its user, path and query kept).
    pub async fn in_front_of(url: &str) -> (Self, String) {
        let proxy = Self::start(host_of(url)).await;
        let through = with_host(url, proxy.addr);
        (proxy, through)
    }

    pub async fn start(upstream: String) -> Self {
        use std::sync::atomic::{AtomicBool, Ordering};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let open = Arc::new(AtomicBool::new(true));
        let stalled = tokio::sync::watch::Sender::new(false);
        let connections = Arc::new(std::sync::Mutex::new(Vec::new()));
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let accept = tokio::spawn({
            let (open, connections, stalled) = (open.clone(), connections.clone(), stalled.clone());
            let accepted = accepted.clone();
            async move {
                while let Ok((inbound, _)) = listener.accept().await {
                    if !open.load(Ordering::SeqCst) {
                        continue; // dropped: the client sees the connection closed
                    }
                    accepted.fetch_add(1, Ordering::SeqCst);
                    let upstream = upstream.clone();
                    let stalled = stalled.subscribe();
                    let task = tokio::spawn(async move {
                        let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await else {
                            return;
                        };
                        let (in_read, in_write) = inbound.into_split();
                        let (out_read, out_write) = outbound.into_split();
                        let up = forward(in_read, out_write, stalled.clone());
                        let down = forward(out_read, in_write, stalled);
                        tokio::join!(up, down);
                    });
                    connections.lock().unwrap().push(task);
                }
            }
        });
        Self {
            addr,
            open,
            stalled,
            connections,
            accepted,
            accept,
        }
    }

    /// How many connections the proxy has let through.
    pub fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.open.store(false, std::sync::atomic::Ordering::SeqCst);
        for task in self.connections.lock().unwrap().drain(..) {
            task.abort();
        }
    }

    /// Keeps every connection open and accepts new ones, but forwards nothing.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    /// Lets connections through again (and what a stall held back).
    pub fn restore(&self) {
        self.stalled.send_replace(false);
        self.open.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// The test Redis reached through a proxy the test can cut or stall, and a key
/// prefix of the test's own; `None` (the test skipped) without
/// `AUTHD_TEST_REDIS_URL`.
pub struct ProxiedRedis {
    pub proxy: TcpProxy,
    /// The Redis URL through the proxy.
    pub url: String,
    pub prefix: String,
}

impl ProxiedRedis {
    pub async fn start(test: &str) -> Option<Self> {
        let direct = redis_url(test)?;
        let (proxy, url) = TcpProxy::in_front_of(&direct).await;
        Some(Self {
            proxy,
            url,
            prefix: unique_name("rl"),
        })
    }
}

/// An app on the PostgreSQL database `db`, reached through a proxy the test controls.
pub async fn spawn_app_behind_proxy(
    db: &TestDb,
    adjust: impl FnOnce(&mut Config),
) -> (TestApp, TcpProxy) {
    let DatabaseUrl::Postgres(direct) = &db.url else {
        unreachable!("a PostgreSQL test database")
    };
    let (proxy, proxied) = TcpProxy::in_front_of(direct.expose()).await;
    let app = spawn_app_on(db, |c| {
        c.store.database_url = proxied.parse().unwrap();
        adjust(c);
    })
    .await;
    (app, proxy)
}

/// `postgres://user@host:port/db?…` with `host:port` replaced by `addr`.
pub fn with_host(url: &str, addr: std::net::SocketAddr) -> String {
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let userinfo = authority
        .rsplit_once('@')
        .map(|(u, _)| format!("{u}@"))
        .unwrap_or_default();
    format!("{scheme}://{userinfo}{addr}{tail}")
}

/// The `host:port` of a URL.
pub fn host_of(url: &str) -> String {
    let rest = url.split_once("://").expect("a URL").1;
    let authority = &rest[..rest.find(['/', '?']).unwrap_or(rest.len())];
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host.contains(':') {
        host.to_owned()
    } else {
        format!("{host}:5432")
    }
}

/// A TCP connection to `addr` whose socket is bound to `source` (any 127.0.0.0/8
/// address is this machine's), so that the server sees a client of its own.
pub async fn tcp_from(
    source: std::net::Ipv4Addr,
    addr: std::net::SocketAddr,
) -> std::io::Result<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(std::net::SocketAddr::new(source.into(), 0))?;
    socket.connect(addr).await
}

/// A gRPC client of `app` over a connection from `source` (see [`tcp_from`]).
pub async fn connect_from(
    app: std::net::SocketAddr,
    source: std::net::Ipv4Addr,
) -> authd::pb::auth_service_client::AuthServiceClient<Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{app}"))
        .unwrap()
        .connect_with_connector(tower::service_fn(
            move |_: tonic::transport::Uri| async move {
                let stream = tcp_from(source, app).await?;
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
            },
        ))
        .await
        .expect("connect from a loopback address of its own");
    authd::pb::auth_service_client::AuthServiceClient::new(channel)
}

/// `GET path` on an HTTP port over a plain TCP connection, with extra header lines
/// (each ending in CRLF): the status line and headers, and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str, headers: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the HTTP port accepts");
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{headers}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).expect("a UTF-8 response");
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP response");
    (head.to_owned(), body.to_owned())
}
