//! The outbox against a crash: authd in a process of its own, killed with SIGKILL
//! while 1,000 registrations are under way, on both backends. Every registration
//! it acknowledged has its event, and the database holds no event without its user
//! and no user without its event. And `authd admin events tail` prints the stream.

use crate::{
    admin::{READ_KEY, admin_app},
    admin_cli::Cli,
    helpers::{TEST_KEY, TEST_KID, TestDb, authd_command, key_spec, register},
};
use authd::{config::DatabaseUrl, pb::auth_service_client::AuthServiceClient};
use sqlx::Connection as _;
use std::{
    collections::BTreeSet,
    process::Stdio,
    sync::{Arc, Mutex},
};
use tonic::transport::Channel;

crate::backend_tests!(
    a_kill_during_registrations_leaves_every_acknowledged_user_its_event_and_no_other,
    events_tail_prints_the_stream_from_a_position,
);

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn url_of(db: &TestDb) -> String {
    match &db.url {
        DatabaseUrl::Sqlite(path) => format!("sqlite://{}", path.display()),
        DatabaseUrl::Postgres(url) => url.expose().to_owned(),
    }
}

/// The ids of the users, and the users of the `user.registered` events, stored.
async fn stored(db: &TestDb) -> (BTreeSet<String>, Vec<String>) {
    const USERS: &str = "SELECT id FROM users";
    const EVENTS: &str = "SELECT user_id FROM account_events WHERE kind = 'user.registered'";
    match &db.url {
        DatabaseUrl::Sqlite(path) => {
            let options = sqlx::sqlite::SqliteConnectOptions::new().filename(path);
            let mut conn = sqlx::SqliteConnection::connect_with(&options)
                .await
                .unwrap();
            let users = sqlx::query_scalar(USERS)
                .fetch_all(&mut conn)
                .await
                .unwrap();
            let events = sqlx::query_scalar(EVENTS)
                .fetch_all(&mut conn)
                .await
                .unwrap();
            (users.into_iter().collect(), events)
        }
        DatabaseUrl::Postgres(url) => {
            let mut conn = sqlx::PgConnection::connect(url.expose()).await.unwrap();
            let users = sqlx::query_scalar(USERS)
                .fetch_all(&mut conn)
                .await
                .unwrap();
            let events = sqlx::query_scalar(EVENTS)
                .fetch_all(&mut conn)
                .await
                .unwrap();
            (users.into_iter().collect(), events)
        }
    }
}

async fn a_kill_during_registrations_leaves_every_acknowledged_user_its_event_and_no_other(
    db: TestDb,
) {
    const USERS: usize = 1000;
    let grpc = free_port();
    let mut server = authd_command()
        .env("AUTHD_LISTEN", format!("127.0.0.1:{grpc}"))
        .env("AUTHD_HEALTH_LISTEN", format!("127.0.0.1:{}", free_port()))
        .env("AUTHD_METRICS_LISTEN", "")
        .env("AUTHD_DATABASE_URL", url_of(&db))
        .env("AUTHD_TOKEN_KEYS", key_spec(TEST_KID, TEST_KEY))
        .env("AUTHD_PBKDF2_ITERATIONS", "1000")
        .env("AUTHD_REGISTER_LIMIT", "off")
        .env("AUTHD_LOG", "error")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("authd starts");
    let channel = crate::helpers::wait_for("authd answers", || async {
        Channel::from_shared(format!("http://127.0.0.1:{grpc}"))
            .unwrap()
            .connect()
            .await
            .ok()
    })
    .await;
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let registrations: Vec<_> = (0..USERS)
        .map(|i| {
            let mut client = AuthServiceClient::new(channel.clone());
            let acknowledged = acknowledged.clone();
            tokio::spawn(async move {
                if let Ok(id) = register(&mut client, &format!("crash{i}"), "a fine password").await
                {
                    acknowledged.lock().unwrap().push(id);
                }
            })
        })
        .collect();
    // Killed once a third is acknowledged: mid-stream, whatever is in flight.
    crate::helpers::wait_until("a third of the registrations acknowledged", || {
        acknowledged.lock().unwrap().len() >= USERS / 3
    })
    .await;
    server.kill().unwrap();
    server.wait().unwrap();
    for registration in registrations {
        registration.await.unwrap();
    }
    let acknowledged: BTreeSet<String> = acknowledged.lock().unwrap().iter().cloned().collect();
    let (users, events) = stored(&db).await;
    let events_set: BTreeSet<String> = events.iter().cloned().collect();
    assert_eq!(events.len(), events_set.len(), "one event per user");
    assert!(
        acknowledged.is_subset(&users),
        "every acknowledged user is stored"
    );
    assert_eq!(
        users, events_set,
        "every user has its event, and no event is without its user"
    );
    assert!(acknowledged.len() < USERS, "killed before the end");
}

async fn events_tail_prints_the_stream_from_a_position(db: TestDb) {
    let mut admin = admin_app(&db, |_| {}).await;
    let first = admin
        .app
        .register("tail1", "a fine password")
        .await
        .unwrap();
    let second = admin
        .app
        .register("tail2", "a fine password")
        .await
        .unwrap();
    let cli = Cli::at(
        &admin.app.handle.admin_addr().unwrap().to_string(),
        READ_KEY,
    );
    let run = cli
        .run(&["events", "tail", "--from", "0", "--count", "2", "--json"])
        .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let lines: Vec<serde_json::Value> = run
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(
        (lines[0]["user_id"].as_str(), lines[1]["user_id"].as_str()),
        (Some(first.as_str()), Some(second.as_str()))
    );
    assert_eq!(lines[0]["type"], "user.registered");
    assert_eq!(lines[0]["data"]["username"], "tail1");
    // Resumed after the first: the second only; as text.
    let after = lines[0]["position"].to_string();
    let run = cli
        .run(&["events", "tail", "--from", &after, "--count", "1"])
        .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let fields: Vec<&str> = run.stdout.trim_end().split('\t').collect();
    assert_eq!((fields[2], fields[3]), ("user.registered", second.as_str()));
    admin.app.stop().await.unwrap();
}
