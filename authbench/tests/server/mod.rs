//! A real authd for the runner to load: started in-process through its public
//! `Application`, on 127.0.0.1:0, with a SQLite file of its own and cheap hashes.

use authd::{
    app::Application,
    config::{Config, DatabaseUrl},
};
use tokio::{sync::oneshot, task::JoinHandle};

pub struct TestApp {
    pub addr: std::net::SocketAddr,
    /// Where `/forward-auth` answers, when the test turned it on.
    // Read by runs.rs only; the other test binaries share this module.
    #[allow(dead_code)]
    pub forward_auth: Option<std::net::SocketAddr>,
    /// The admin port, when the test turned it on.
    #[allow(dead_code)]
    pub admin: Option<std::net::SocketAddr>,
    _dir: tempfile::TempDir,
    _stop: oneshot::Sender<()>,
    _task: JoinHandle<anyhow::Result<()>>,
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// An authd with the test defaults, adjusted by `adjust`; stopped when dropped.
pub async fn spawn_app_with(adjust: impl FnOnce(&mut Config)) -> TestApp {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let mut config = Config::defaults();
    config.server.listen = "127.0.0.1:0".parse().unwrap();
    config.telemetry.metrics_listen = "".parse().unwrap();
    config.server.health_listen = "".parse().unwrap();
    config.store.database_url = DatabaseUrl::Sqlite(dir.path().join("authd.db"));
    config.passwords.pbkdf2_iterations = 1000;
    config.tokens.token_keys = Some(
        "bench:MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="
            .parse()
            .unwrap(),
    );
    adjust(&mut config);
    let app = Application::build(config).await.expect("authd builds");
    let addr = app.local_addr();
    let forward_auth = app.handle().forward_auth_addr();
    let admin = app.handle().admin_addr();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    TestApp {
        addr,
        forward_auth,
        admin,
        _dir: dir,
        _stop: stop,
        _task: task,
    }
}
