//! Spawns authd on 127.0.0.1:0 with its own SQLite file and gives typed clients.
//!
//! Logs stay quiet unless `TEST_LOG` is set (`TEST_LOG=1 cargo test`).

use authd::{
    app::{AppHandle, Application},
    config::{Config, DatabaseUrl},
    pb::auth_service_client::AuthServiceClient,
};
use std::{
    path::{Path, PathBuf},
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
/// A hash that takes on the order of a second, to hold a hash thread busy.
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
            let _ = authd::telemetry::init("info,authd=debug", authd::config::LogFormat::Text);
        }
    });
}

/// The configuration every test starts from: port 0, a database in `dir`, fast hashes.
pub fn test_config(dir: &Path) -> Config {
    let mut config = Config::defaults();
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.database_url = DatabaseUrl::Sqlite(dir.join("authd.db"));
    config.pbkdf2_iterations = FAST_ITERATIONS;
    config.token_keys = Some(key_spec(TEST_KID, TEST_KEY).parse().unwrap());
    config.health_interval = Duration::from_millis(200);
    config.drain_timeout = Duration::from_secs(10);
    config
}

pub struct TestApp {
    pub addr: std::net::SocketAddr,
    pub client: AuthServiceClient<Channel>,
    pub health: HealthClient<Channel>,
    pub handle: AppHandle,
    pub db_path: PathBuf,
    /// Kept so a restarted app can use the same directory.
    pub dir: Arc<tempfile::TempDir>,
    shutdown: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<anyhow::Result<()>>>,
}

/// A fresh app with default test settings.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// A fresh app in a new directory, with settings adjusted by `adjust`.
pub async fn spawn_app_with(adjust: impl FnOnce(&mut Config)) -> TestApp {
    let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
    spawn_app_in(dir, adjust).await
}

/// An app on the database in `dir` (which a previous app may have used).
pub async fn spawn_app_in(
    dir: Arc<tempfile::TempDir>,
    adjust: impl FnOnce(&mut Config),
) -> TestApp {
    init_logs();
    let mut config = test_config(dir.path());
    adjust(&mut config);
    let db_path = match &config.database_url {
        DatabaseUrl::Sqlite(p) => p.clone(),
    };
    let app = Application::build(config).await.expect("the app builds");
    let addr = app.local_addr();
    let handle = app.handle();
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(app.run_until_stopped(async {
        let _ = rx.await;
    }));
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
        db_path,
        dir,
        shutdown: Some(tx),
        task: Some(task),
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
            })
            .await
            .map(|r| r.into_inner())
    }

    /// The health status of `service` ("" for the whole server).
    pub async fn health_status(&mut self, service: &str) -> ServingStatus {
        let response = self
            .health
            .check(HealthCheckRequest {
                service: service.into(),
            })
            .await
            .expect("health answers");
        ServingStatus::try_from(response.into_inner().status).expect("a known status")
    }
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

/// Polls `condition` every few milliseconds for up to 10 s.
pub async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Reads a user's stored password hash straight from the SQLite file.
pub async fn stored_hash(db_path: &Path, username: &str) -> Option<String> {
    use sqlx::{Connection, SqliteConnection, sqlite::SqliteConnectOptions};
    let mut conn = SqliteConnection::connect_with(
        &SqliteConnectOptions::new()
            .filename(db_path)
            .read_only(true),
    )
    .await
    .expect("open the database file");
    let hash =
        sqlx::query_scalar::<_, String>("SELECT password_hash FROM users WHERE username = ?")
            .bind(username)
            .fetch_optional(&mut conn)
            .await
            .expect("query the database file");
    conn.close().await.ok();
    hash
}

/// The URL of an external test service from `var`, or `None` when it is not set:
/// the test then prints one line and passes, unless `AUTHD_TEST_REQUIRE_SERVICES=1`
/// (as in CI), when a missing service fails the run.
pub fn service_url(var: &str, test: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            let required = std::env::var("AUTHD_TEST_REQUIRE_SERVICES").is_ok_and(|v| v == "1");
            assert!(
                !required,
                "{var} is not set and AUTHD_TEST_REQUIRE_SERVICES=1: cannot run {test}"
            );
            eprintln!("skipped {test}: {var} is not set");
            None
        }
    }
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
