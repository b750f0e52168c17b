//! The database on disk and across versions: the SQLite files are readable by their
//! owner only, and a database made by an earlier version upgrades in place (the
//! stored hash costs it holds count from the first request).

use crate::{
    equal_cost::rounds_of_a_failed_login,
    helpers::{Backend, TestDb, spawn_app_on},
};
use authd::{Password, config::DatabaseUrl};
use sqlx::{Connection, PgConnection, SqliteConnection, sqlite::SqliteConnectOptions};

/// The database file and the two SQLite creates beside it.
#[cfg(unix)]
fn sqlite_files(db: &TestDb) -> [std::path::PathBuf; 3] {
    let DatabaseUrl::Sqlite(path) = &db.url else {
        unreachable!("a SQLite test database")
    };
    let beside = |suffix: &str| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        std::path::PathBuf::from(name)
    };
    [path.clone(), beside("-wal"), beside("-shm")]
}

#[cfg(unix)]
fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

#[cfg(unix)]
#[tokio::test]
async fn the_sqlite_database_and_its_wal_are_readable_by_their_owner_only() {
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut app = spawn_app_on(&db, |_| {}).await;
    // A write: the WAL and its index exist now, while the app runs.
    app.register("owner", "a fine password").await.unwrap();
    for file in sqlite_files(&db) {
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
}

#[cfg(unix)]
#[tokio::test]
async fn an_existing_database_readable_by_others_is_tightened_at_start() {
    use std::os::unix::fs::PermissionsExt as _;
    let db = TestDb::new(Backend::Sqlite, "").await.unwrap();
    let mut first = spawn_app_on(&db, |_| {}).await;
    first.register("owner", "a fine password").await.unwrap();
    first.stop().await.unwrap();
    let files = sqlite_files(&db);
    for file in files.iter().filter(|f| f.exists()) {
        std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    assert_eq!(mode(&files[0]), 0o644);

    let mut second = spawn_app_on(&db, |_| {}).await;
    second.login("owner", "a fine password").await.unwrap();
    second.register("another", "a fine password").await.unwrap();
    for file in &files {
        assert_eq!(mode(file), 0o600, "{}", file.display());
    }
}

/// Brings `db` to the schema of the first release: its first migration only, run by
/// sqlx from a folder holding just that file (as that release did).
async fn create_the_first_schema(db: &TestDb) {
    let first = "20261130000000_create_users.sql";
    let folder = match db.url {
        DatabaseUrl::Sqlite(_) => "sqlite",
        DatabaseUrl::Postgres(_) => "postgres",
    };
    let dir = tempfile::tempdir().unwrap();
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("migrations")
        .join(folder)
        .join(first);
    std::fs::copy(&source, dir.path().join(first)).unwrap();
    let migrator = sqlx::migrate::Migrator::new(dir.path()).await.unwrap();
    match &db.url {
        DatabaseUrl::Sqlite(path) => {
            let options = SqliteConnectOptions::new()
                .filename(path)
                .create_if_missing(true);
            let mut conn = SqliteConnection::connect_with(&options).await.unwrap();
            migrator.run(&mut conn).await.unwrap();
            conn.close().await.unwrap();
        }
        DatabaseUrl::Postgres(url) => {
            let mut conn = PgConnection::connect(url.expose()).await.unwrap();
            migrator.run(&mut conn).await.unwrap();
            conn.close().await.unwrap();
        }
    }
}

/// Inserts a user as the first release did (no hash_iterations column).
async fn insert_with_the_first_schema(db: &TestDb, username: &str, hash: &str) {
    const SQL: &str = "INSERT INTO users (id, username, password_hash, created_at, updated_at) \
                       VALUES ($1, $2, $3, 0, 0)";
    let id = uuid::Uuid::now_v7().to_string();
    match &db.url {
        DatabaseUrl::Sqlite(path) => {
            let mut conn =
                SqliteConnection::connect_with(&SqliteConnectOptions::new().filename(path))
                    .await
                    .unwrap();
            let q = sqlx::query(SQL).bind(&id).bind(username).bind(hash);
            q.execute(&mut conn).await.unwrap();
            conn.close().await.unwrap();
        }
        DatabaseUrl::Postgres(url) => {
            let mut conn = PgConnection::connect(url.expose()).await.unwrap();
            let q = sqlx::query(SQL).bind(&id).bind(username).bind(hash);
            q.execute(&mut conn).await.unwrap();
            conn.close().await.unwrap();
        }
    }
}

async fn a_database_of_the_first_release_upgrades_in_place(db: TestDb) {
    create_the_first_schema(&db).await;
    let password = Password::parse("a fine password").unwrap();
    let old = authd::hash_now(&password, pbkdf2::Params::new(20_000).unwrap()).unwrap();
    insert_with_the_first_schema(&db, "dormant", &old).await;

    let mut app = spawn_app_on(&db, |c| c.passwords.pbkdf2_iterations = 1000).await;
    // The existing row's cost was read from its PHC string by the migration: from
    // the first request, an unknown user's failure costs what the dormant user's does.
    assert_eq!(rounds_of_a_failed_login(&mut app, "nobody").await, 20_000);
    let session = app.login("dormant", "a fine password").await.unwrap();
    assert!(!session.user_id.is_empty());
    let rehashed = db.stored_hash("dormant").await.unwrap();
    assert!(rehashed.starts_with("$pbkdf2-sha256$i=1000,"), "{rehashed}");
    // The update kept the column in step: the dearest hash is gone.
    assert_eq!(rounds_of_a_failed_login(&mut app, "nobody").await, 1000);
}

crate::backend_tests!(a_database_of_the_first_release_upgrades_in_place);

/// On PostgreSQL, the indexes on `previous_digest` and `ended_at` hold only the rows
/// that have one, and the lookups the service makes through them still use them
/// (SQLite's are checked against the service's own statements in its unit tests).
#[tokio::test]
async fn the_partial_session_indexes_serve_their_lookups_on_postgres() {
    let Some(db) = TestDb::new(Backend::Postgres, "partial_session_indexes").await else {
        return;
    };
    let _app = spawn_app_on(&db, |_| {}).await;
    let DatabaseUrl::Postgres(url) = &db.url else {
        unreachable!("a PostgreSQL test database");
    };
    let mut conn = PgConnection::connect(url.expose()).await.unwrap();
    for (index, predicate) in [
        ("sessions_previous_digest", "previous_digest IS NOT NULL"),
        ("sessions_ended_at", "ended_at IS NOT NULL"),
    ] {
        let definition: String = sqlx::query_scalar(
            "SELECT indexdef FROM pg_indexes WHERE indexname = $1 AND schemaname = current_schema()",
        )
        .bind(index)
        .fetch_one(&mut conn)
        .await
        .unwrap();
        assert!(definition.contains(predicate), "{definition}");
    }
    sqlx::query("SET enable_seqscan = off")
        .execute(&mut conn)
        .await
        .unwrap();
    for (query, index) in [
        (
            "SELECT id FROM sessions WHERE previous_digest = 'ab'",
            "sessions_previous_digest",
        ),
        (
            "SELECT id, ended_at FROM sessions WHERE ended_at IS NOT NULL \
             AND (ended_at > 5 OR (ended_at = 5 AND id > 'x')) ORDER BY ended_at, id LIMIT 10",
            "sessions_ended_at",
        ),
        (
            "SELECT id FROM sessions WHERE ended_at <= 5 LIMIT 10",
            "sessions_ended_at",
        ),
    ] {
        let plan: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {query}")))
            .fetch_all(&mut conn)
            .await
            .unwrap();
        assert!(
            plan.iter().any(|line| line.contains(index)),
            "{query}: {plan:?}"
        );
    }
    conn.close().await.unwrap();
}
